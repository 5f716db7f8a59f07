"""Live tune tier: `repro tune` on the one-H200 test profile, judged by the tuning acceptance bounds
(repro/tuning/recommend.py).

It sweeps AR, DFLASH and DDTREE (fitted budgets 8, 32, 128; held out 16, 64) at c = 1 and 4 with
the DDTREE servers recording their acceptance, predicts every budget, measures the recommended ones
(``--confirm``) and requires: at least three held-out cells predicted within 10%, and each recommended
budget within 3% of the best measured one. Results land in ``$REPRO_VERIFY_OUT`` (default
build/verify), where `make verify`'s report shows the tuning section. Skips with the reason when
the GPU, the patched SGLang, its recording hook, the test models or the prompt set are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from repro import cli
from repro.evidence.verdicts import PASS
from repro.recording import RECORD_ENV
from repro.serving.profiles import load_profiles
from verify.bench.test_live import _skip_reason

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.benchmark(group="live")]

PROFILE = "test-h200-tp1"
TUNE_ARGS = ["--budgets", "8,32,128", "--holdout", "16,64", "--concurrency", "1,4", "--num-prompts", "8",
             "--max-new-tokens", "128", "--warmup", "1", "--confirm"]


def _recording_reason() -> str | None:
    spec = importlib.util.find_spec("sglang")
    worker = Path(spec.origin).parent / "srt" / "speculative" / "ddtree_worker_v2.py" if spec else None
    if worker is None or not worker.exists() or "repro.recording" not in worker.read_text(errors="replace"):
        return f"the installed DDTREE worker does not record acceptance (${RECORD_ENV} is not wired)"
    return None


def test_live_tune_predicts_and_recommends(benchmark) -> None:
    """Three or more held-out cells predicted within 10%; the recommended budgets within 3% of the best measured."""
    reason = _skip_reason(load_profiles()[PROFILE]) or _recording_reason()
    if reason:
        pytest.skip(reason)
    out = Path(os.environ.get("REPRO_VERIFY_OUT", "build/verify"))
    for name in (f"{PROFILE}-bench.jsonl", f"{PROFILE}-recording.jsonl"):
        (out / name).unlink(missing_ok=True)
    rc = benchmark.pedantic(cli.main, args=(["tune", PROFILE, *TUNE_ARGS, "-o", str(out)],), rounds=1, iterations=1)
    records = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    result = [r for r in records if r["profile"] == PROFILE][-1]
    assert all(v["status"] == PASS for v in result["verdicts"]), json.dumps(result["verdicts"], indent=1)
    assert rc == 0
