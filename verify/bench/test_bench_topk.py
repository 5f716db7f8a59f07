"""pytest-benchmark timings of the fused top-K + lse kernel beside the torch paths it replaces.

Drafter logits ``[bs * 15, 163840]`` bf16, K 256. Host-timed calls with a device sync,
so launch overhead is included; ``python -m verify.bench.bench_topk`` writes the full table with
CUDA-graph timings, the HBM floor and the tunable sweep.
"""

from __future__ import annotations

import pytest
import torch

from repro.kernels.topk_lse import topk_lse

pytestmark = [pytest.mark.gpu, pytest.mark.benchmark(group="topk-lse")]

OPS = {
    "fused": lambda x: topk_lse(x, 256),
    "torch_topk": lambda x: torch.topk(x, 256, dim=-1),
    "log_softmax_topk": lambda x: torch.topk(torch.log_softmax(x.float(), -1), 256, dim=-1),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bs", [1, 8, 32])
def test_topk_speed(benchmark, op: str, bs: int) -> None:
    """Times one synchronised call of each top-256 path on [bs * 15, 163840] bf16 logits."""
    g = torch.Generator(device="cuda").manual_seed(bs)
    x = (torch.randn(bs * 15, 163840, device="cuda", generator=g) * 3).to(torch.bfloat16)

    def run() -> None:
        OPS[op](x)
        torch.cuda.synchronize()

    run()  # compile outside the timing
    benchmark(run)
    ids = OPS[op](x)[1]
    assert ids.shape == (bs * 15, 256)
