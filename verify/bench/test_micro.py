"""Micro-benchmarks of the DDTree hot path: tree build and acceptance walk (CPU, and CUDA if present).

Sizes are the deployment's shape at a CPU-friendly scale: a 16-token DFlash block (L = 15) and a
few budgets; `pytest verify/bench --benchmark-only` runs them and `make verify` records the timings.
"""

from __future__ import annotations

import pytest
import torch

from repro.ddtree import build_trees, greedy_tokens, walk

pytestmark = pytest.mark.benchmark(group="ddtree-micro")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _logits(device: str, bs: int = 8, horizon: int = 15, vocab: int = 4096) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(bs, horizon, vocab, generator=gen).to(device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("budget", [16, 64, 256])
def test_build_trees_speed(benchmark, device: str, budget: int) -> None:
    """Builds a batch of 8 trees from [8, 15, 4096] drafter logits at budgets 16, 64 and 256."""
    logits = _logits(device)

    def run() -> None:
        build_trees(logits, budget)
        _sync(device)

    benchmark(run)
    assert build_trees(logits, budget).tokens.shape == (8, budget + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_walk_speed(benchmark, device: str) -> None:
    """Walks a batch of 8 budget-64 trees against target tokens from random verify logits."""
    logits = _logits(device)
    tree = build_trees(logits, 64)
    target = greedy_tokens(torch.randn(8, 65, 4096, generator=torch.Generator().manual_seed(1))
                           .to(device))

    def run() -> None:
        walk(tree, target)
        _sync(device)

    benchmark(run)
    assert walk(tree, target).accept_len.shape == (8,)
