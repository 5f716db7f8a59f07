"""End-to-end on the GPU: greedy DDTREE == AR token for token on the full-size planted targets.

Each full-size target (repro/data/models/: Qwen3-8B, the Kimi-K2.6 TP8 share) is served with
``--load-format dummy`` and planted in memory at load (patch 0005, ``SGLANG_REPRO_PLANT``), so
its greedy output is the planted continuation while every matmul runs at full size. AR and
DDTREE (drafter test hook on, CUDA graphs and overlap on) must both produce it, at batch 1 and
4. One server per test (``-k "k26-tp8 and AR"`` runs one), so each fits a device call. A
target skips on a GPU with less memory than its planted.json says it needs.
"""

from __future__ import annotations

import json

import pytest

from repro.testmodels import fullsize
from repro.testmodels.configs import FULLSIZE
from repro.testmodels.planted import greedy_continuation
from verify.sglang import harness

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.slow]

PROMPTS = [[(i * 131 + j * 17) % 5000 + 10 for j in range(4 + 23 * i)] for i in range(4)]
GREEDY = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
BUDGETS = {"DDTREE": 64, "DDTREE-B512": 512}  # B 512: a 513-token verify, the widest on repro's attention
START_TIMEOUT = 540  # dummy load + planting + CUDA graphs at full size, inside one 600-s device call


def _flags(model: fullsize.FullSizeModel) -> list[str]:
    """Overrides of the harness's small-model flags (later flags win) for a full-size target."""
    return ["--load-format", "dummy", "--mem-fraction-static", str(model.budget.mem_fraction_static),
            "--max-total-tokens", str(model.budget.requests * model.budget.context),
            "--max-running-requests", "4", "--watchdog-timeout", "600"]


def _target(models, name: str) -> tuple[fullsize.FullSizeModel, dict]:
    """The full-size model and its planted.json (written if this models dir predates it); skips
    on a GPU with less memory than the target needs."""
    import torch

    model = fullsize.load_model(name)
    if not (models / model.name / "planted.json").exists():
        fullsize.write_model(models, model)
    info = json.loads((models / model.name / "planted.json").read_text())
    have = torch.cuda.get_device_properties(0).total_memory
    if have < info["gpu_bytes_needed"]:
        pytest.skip(f"{model.name} needs {info['gpu_bytes_needed'] / fullsize.GIB:.0f} GiB of GPU memory, "
                    f"this GPU has {have / fullsize.GIB:.0f} GiB")
    return model, info


@pytest.mark.parametrize("algorithm", ["AR", *BUDGETS])
@pytest.mark.parametrize("name", FULLSIZE)
def test_greedy_output_is_the_planted_continuation(models, name: str, algorithm: str):
    """AR and DDTREE (B 64 and B 512), at batch 1 and 4, produce the planted greedy output token for
    token (so DDTREE == AR); DDTREE accepts the hook's drafts (tau above 1 on every request)."""
    model, info = _target(models, name)
    env = {"SGLANG_REPRO_PLANT": str(models / model.name / "planted.json"),
           "SGLANG_DDTREE_TEST_DRAFTER": str(models / model.name / "hook.json")}
    target = models / model.name
    if algorithm == "AR":
        args = harness.server_args(target) + _flags(model)
    else:
        args = harness.server_args(target, algo="DDTREE", drafter=models / model.drafter_name,
                                   budget=BUDGETS[algorithm])
        args += [*_flags(model), "--speculative-draft-load-format", "dummy"]
    with harness.server(f"{algorithm.lower()}-{model.name}", args, port=31300, env=env, timeout=START_TIMEOUT) as url:
        single = [harness.generate(url, p, GREEDY) for p in PROMPTS]
        batch = harness.generate(url, PROMPTS, GREEDY)
    harness.save(f"fullsize_{model.name}_{algorithm}", {"single": [r["output_ids"] for r in single],
                                                        "batch": [r["output_ids"] for r in batch]})
    want = [greedy_continuation(info, p[-1], GREEDY["max_new_tokens"]) for p in PROMPTS]
    assert [r["output_ids"] for r in single] == want
    assert [r["output_ids"] for r in batch] == want
    if algorithm != "AR":
        assert all(r["meta_info"]["spec_accept_length"] > 1.0 for r in single)
