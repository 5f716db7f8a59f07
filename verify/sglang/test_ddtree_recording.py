"""End-to-end on the GPU: the DDTREE worker's acceptance recording (``$REPRO_DDTREE_RECORD``).

One DDTREE B = 32 server (graphs and overlap on, drafter test hook) records every round while it
serves named requests; the recording must agree with what the server reports: each request's
rounds are its ``spec_verify_ct``, their emitted tokens (path + bonus, and prefill's first token)
give its ``completion_tokens`` up to the last round's cut, every path is increasing node ids
within the budget, and ``repro tau`` reads the file back.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from verify.sglang import harness

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

BUDGET, TOKENS, REQUESTS = 32, 256, 8


def _rounds(path) -> dict[str, list[list[int]]]:
    paths: dict[str, list[list[int]]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "round":
            paths.setdefault(row["req"], []).append(row["path"])
    return paths


def test_recording_matches_the_served_rounds(models, tmp_path):
    """Rounds and emitted tokens per request equal the server's own counts."""
    record = tmp_path / "recording.jsonl"
    env = {"SGLANG_DDTREE_TEST_DRAFTER": str(models / "hook.json"), "REPRO_DDTREE_RECORD": str(record),
           "REPRO_DDTREE_RECORD_PROMPTS": "unnamed"}  # the flush request; ours name "e2e"
    args = harness.server_args(models / "planted", algo="DDTREE", drafter=models / "dflash", budget=BUDGET)
    prompts = [[(i * 131 + j * 17) % 4000 + 10 for j in range(20 + 7 * i)] for i in range(REQUESTS)]
    rids = [f"e2e/{i}" for i in range(REQUESTS)]
    params = {"temperature": 0, "max_new_tokens": TOKENS, "ignore_eos": True}
    with harness.server("ddtree-record", args, port=31790, env=env) as url:
        out = harness.generate(url, prompts, params, extra={"rid": rids})
        # later rounds write the batches whose copies completed: a few more rounds flush ours
        harness.generate(url, [[11, 12, 13]], {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True})
        paths = _rounds(record)
    assert set(rids) <= set(paths), f"requests missing from the recording: {set(rids) - set(paths)}"
    for rid, resp in zip(rids, out, strict=True):
        meta, rounds = resp["meta_info"], paths[rid]
        assert len(rounds) == meta["spec_verify_ct"], rid
        emitted = [len(p) + 1 for p in rounds]
        # the rounds' tokens (+ prefill's first token), the last round cut at max_new_tokens
        assert sum(emitted) - emitted[-1] <= meta["completion_tokens"] <= sum(emitted) + 1, rid
        for p in rounds:
            assert p == sorted(p) and all(1 <= n <= BUDGET for n in p), (rid, p)
    tau = subprocess.run([sys.executable, "-m", "repro.cli", "tau", str(record), "--json", "--budgets", f"1,{BUDGET}"],
                         capture_output=True, text=True, check=False)
    assert tau.returncode == 0, tau.stderr
    (summary,) = json.loads(tau.stdout)["recordings"]
    group = next(g for g in summary["groups"] if g["prompts"] == "e2e")
    ours = [len(p) + 1 for rid in rids for p in paths[rid]]
    assert group["requests"] == REQUESTS and group["rounds"] == len(ours)
    at = {t["budget"]: t["tau"] for t in group["tau"]}
    assert at[BUDGET] == pytest.approx(sum(ours) / len(ours))  # tau at the recorded budget: what was accepted
    assert 1 <= at[1] < at[BUDGET]
