"""End-to-end on the GPU: a DDTREE server with a budget schedule is lossless while its batch moves.

Real servers on 127.0.0.1 serve the planted 4-layer target with the drafter test hook, with the
schedule ``1:32,2:3,3:12,4:20`` (four budgets, one below the drafter's horizon, so the commit width
changes too) and graphs on/off x overlap on/off. The load is staggered so that every request runs
under at least two budgets: in each wave four requests join one after the other (each once the
previous has streamed a few tokens), shortest first, so the batch grows 1 -> 4 and shrinks again
as they finish. Each server records its rounds (``$REPRO_DDTREE_RECORD``), and:

- at T = 0 every output equals AR's token for token (stop-token requests included);
- every round ran the budget its batch size routes to, and took exactly the tau the drafter test
  hook's law gives for that budget (``verify.bench.hook_law``), so each request's round count is
  its ``spec_verify_ct``: a round that read another budget's mask or buffers would accept otherwise;
- with graphs on, every round's target verify replayed a CUDA graph (no silent eager fallback);
- at T = 1 under the same load, each emitted token's rank class after the token before it (the
  planted target's next-token law depends on that token alone) passes a chi-square test against the
  exact distribution at thresholds.toml's alpha.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from repro.drafter_hook.hook import DrafterTestHook
from repro.schedule import BudgetSchedule
from repro.testmodels.planted import greedy_continuation, next_token_probs
from repro.tuning.acceptance import read_recordings
from verify.bench.hook_law import round_lengths
from verify.chi_square import chi_square_p, keyed
from verify.sglang import harness
from verify.sglang.test_ddtree_greedy import stop_requests
from verify.sglang.test_ddtree_sampling import alpha

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

SCHEDULE = "1:32,2:3,3:12,4:20"
CAPTURED = [1, 2, 3, 4]  # the harness's --cuda-graph-max-bs-decode 4 with speculation
WAVES = [[64, 160, 288, 512], [48, 192, 320, 448], [96, 128, 256, 384]]  # max_new_tokens, in join order
JOIN_AFTER = 16  # tokens a request has streamed before the next one joins
T1_WAVES = 4  # waves of the T = 1 load (about 5,000 transitions)
# (name, cuda graphs, overlap scheduler)
CONFIGS = [("sched-graphs-overlap", True, True), ("sched-graphs", True, False),
           ("sched-eager-overlap", False, True), ("sched-eager", False, False)]


def wave_prompt(wave: int, i: int) -> list[int]:
    """A deterministic prompt of 5 to ~120 tokens."""
    return [(wave * 977 + i * 131 + j * 17 + (j * j) % 7) % 4000 + 10 for j in range(5 + 23 * i + 7 * wave)]


def stream(url: str, ids: list[int], params: dict, rid: str, joined: threading.Event) -> dict:
    """One streamed /generate; ``joined`` is set once JOIN_AFTER tokens came (or it ended)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = {"input_ids": ids, "sampling_params": params, "rid": rid, "stream": True}
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    last = None
    try:
        if resp.status != 200:
            msg = f"{rid}: HTTP {resp.status} {resp.read()[:300]!r}"
            raise RuntimeError(msg)
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            last = json.loads(line[5:])
            if last["meta_info"].get("completion_tokens", 0) >= JOIN_AFTER:
                joined.set()
    finally:
        joined.set()
        conn.close()
    return {"rid": rid, "prompt": ids, "params": params, "output_ids": last["output_ids"], "meta": last["meta_info"]}


def run_waves(url: str, waves: list[list[int]], temperature: float, tag: str) -> list[dict]:
    """Each wave's requests join one after the other; the next wave starts once it is done."""
    out = []
    for w, lengths in enumerate(waves):
        results: list[dict] = [{} for _ in lengths]
        threads = []
        for i, n in enumerate(lengths):
            joined = threading.Event()
            params = {"temperature": temperature, "max_new_tokens": n, "ignore_eos": True}

            def one(i=i, w=w, params=params, joined=joined, results=results) -> None:
                results[i] = stream(url, wave_prompt(w, i), params, f"{tag}/{w}-{i}", joined)

            threads.append(threading.Thread(target=one, daemon=True))
            threads[-1].start()
            assert joined.wait(300), f"{tag}/{w}-{i} streamed nothing"
        for t in threads:
            t.join(600)
        out += results
    return out


def workload(url: str, planted: dict) -> dict:
    """The T = 0 waves, the stop-token requests (as a batch), the T = 1 waves, then a flush."""
    greedy = run_waves(url, WAVES, 0.0, "t0")
    with ThreadPoolExecutor(max_workers=4) as pool:  # at once: the batch shrinks as they stop
        stops = list(pool.map(lambda req: harness.generate(url, *req), stop_requests(planted)))
    sampled = run_waves(url, [WAVES[w % len(WAVES)] for w in range(T1_WAVES)], 1.0, "t1")
    # rounds are written once their copies complete, at a later round: a few more rounds flush them
    harness.generate(url, [11, 12, 13], {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True})
    return {"greedy": greedy, "stops": [r["output_ids"] for r in stops], "sampled": sampled}


@pytest.fixture(scope="module")
def runs(models, planted) -> dict:
    """Every configuration's workload and recording, with the AR server's stop-token outputs."""
    out = harness.out_dir()
    with harness.server("ar-sched", harness.server_args(models / "planted"), port=31200) as url:
        ar_stops = [harness.generate(url, p, sp)["output_ids"] for p, sp in stop_requests(planted)]

    def one(k: int, name: str, graphs: bool, overlap: bool) -> dict:  # noqa: FBT001 - a CONFIGS row
        record = out / f"recording-{name}.jsonl"
        record.unlink(missing_ok=True)
        env = {"SGLANG_DDTREE_TEST_DRAFTER": str(models / "hook.json"), "REPRO_DDTREE_RECORD": str(record),
               "REPRO_DDTREE_RECORD_PROMPTS": "flush"}
        args = harness.server_args(models / "planted", algo="DDTREE", drafter=models / "dflash", graphs=graphs,
                                   overlap=overlap)
        args += ["--speculative-ddtree-budget-schedule", SCHEDULE]
        try:
            with harness.server(name, args, port=31201 + k, env=env) as url:
                result = workload(url, planted)
            return {**result, "recording": read_recordings(record)}
        except Exception as exc:  # noqa: BLE001 - keep the other configurations' evidence
            return {"error": repr(exc)[:4000]}

    parallel = int(os.environ.get("REPRO_E2E_PARALLEL", "2"))
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {c[0]: pool.submit(one, k, *c) for k, c in enumerate(CONFIGS)}
        results = {name: f.result() for name, f in futures.items()}
    harness.save("schedule_runs", {name: {k: v for k, v in r.items() if k != "recording"} for name, r in results.items()})
    return {"ar_stops": ar_stops, **results}


def _ok(runs: dict, name: str) -> dict:
    result = runs[name]
    assert "error" not in result, result.get("error")
    return result


def _rounds(result: dict) -> dict[str, list]:
    """Each request id's recorded rounds, in order."""
    by_req: dict[str, list] = {}
    for rec in result["recording"]:
        for r in rec.rounds:
            by_req.setdefault(r.req, []).append(r)
    return {req: sorted(rounds, key=lambda r: r.step) for req, rounds in by_req.items()}


def _hook(models: Path) -> DrafterTestHook:
    drafter = json.loads((models / "dflash" / "config.json").read_text())
    vocab = json.loads((models / "planted" / "config.json").read_text())["vocab_size"]
    return DrafterTestHook.from_file(models / "hook.json", horizon=drafter["block_size"] - 1, vocab_size=vocab,
                                     device="cpu")


def law_taus(hook: DrafterTestHook, prompt: list[int], budgets: list[int], max_new: int) -> list[int]:
    """The tau of each round of a greedy request whose rounds ran ``budgets``, by the hook's law."""
    succ = hook.successor.cpu()
    root, prefix, made, taus = int(succ[prompt[-1]]), len(prompt), 1, []
    for budget in budgets:
        tau = int(round_lengths(hook, torch.tensor([root]), torch.tensor([prefix]), budget)[0])
        taus.append(tau)
        cut = min(tau, max_new - made)
        for _ in range(cut):
            root = int(succ[root])
        prefix, made = prefix + cut, made + cut
    return taus


NAMES = [c[0] for c in CONFIGS]
GRAPHS = {c[0]: c[1] for c in CONFIGS}


class TestScheduleLossless:
    @pytest.mark.parametrize("name", NAMES)
    def test_greedy_outputs_equal_ar(self, runs, planted, name):
        """Every T = 0 output (waves and stop tokens) equals AR's token for token."""
        result = _ok(runs, name)
        for r in result["greedy"]:
            want = greedy_continuation(planted, r["prompt"][-1], r["params"]["max_new_tokens"])
            assert r["output_ids"] == want, r["rid"]
        assert result["stops"] == runs["ar_stops"]

    @pytest.mark.parametrize("name", NAMES)
    def test_every_request_ran_under_several_budgets_each_round_its_routed_one(self, runs, name):
        """Each wave request's rounds span at least two budgets, each the one its batch size routes
        to (padded to the captured buckets with graphs, its own size without)."""
        result = _ok(runs, name)
        schedule, rounds = BudgetSchedule.parse(SCHEDULE), _rounds(result)
        captured = CAPTURED if GRAPHS[name] else []
        used = set()
        for r in result["greedy"]:
            mine = rounds[r["rid"]]
            assert len({x.budget for x in mine}) >= 2, (r["rid"], [x.budget for x in mine])
            assert all(x.budget == schedule.route(x.bs, captured) for x in mine), r["rid"]
            used |= {x.budget for x in mine}
        assert used == set(schedule.distinct)

    @pytest.mark.parametrize("name", NAMES)
    def test_rounds_follow_the_hook_law_at_their_budgets(self, runs, models, name):
        """Each round accepted exactly the hook law's tau at its recorded budget, and the rounds
        are the server's spec_verify_ct."""
        result, hook = _ok(runs, name), _hook(models)
        rounds = _rounds(result)
        for r in result["greedy"]:
            mine = rounds[r["rid"]]
            assert len(mine) == r["meta"]["spec_verify_ct"], r["rid"]
            want = law_taus(hook, r["prompt"], [x.budget for x in mine], r["params"]["max_new_tokens"])
            assert [len(x.path) + 1 for x in mine] == want, r["rid"]

    @pytest.mark.parametrize("name", NAMES)
    def test_graphs_replay_every_round(self, runs, name):
        """With graphs on every round's verify replayed a graph; with graphs off none did."""
        graphs = GRAPHS[name]
        flags = [x.graph for rounds in _rounds(_ok(runs, name)).values() for x in rounds]
        assert flags and all(f is graphs for f in flags)

    @pytest.mark.parametrize("name", NAMES)
    def test_sampling_follows_the_target_law(self, runs, planted, name):
        """At T = 1 the rank class of every token after the first, given the token before it,
        passes a chi-square test against the planted target's exact next-token distribution."""
        counts: dict[int, int] = {}
        probs: dict[int, float] = {}
        total = 0
        for r in _ok(runs, name)["sampled"]:
            out = r["output_ids"]
            for prev, tok in itertools.pairwise(out):
                law = next_token_probs(planted, prev, 1.0)
                ranked = sorted((t for t in law if t != -1), key=lambda t: -law[t])
                cls = ranked.index(tok) if tok in ranked else len(ranked)
                counts[cls] = counts.get(cls, 0) + 1
                for k, t in enumerate([*ranked, -1]):
                    probs[k] = probs.get(k, 0.0) + law[t]
                total += 1
        assert total > 3000
        assert chi_square_p(*keyed(counts, probs)) > alpha(), counts
