"""The acceptance Recorder on CUDA: no host sync on the round, batches written once their copies
complete, and the same lines as the CPU path."""

from __future__ import annotations

import json

import pytest
import torch

from repro.ddtree import build_trees, topk_logprobs, walk
from repro.recording import Recorder

pytestmark = pytest.mark.gpu
BUDGET, HORIZON = 64, 15


def _round(bs: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, HORIZON, 512, generator=g) * 3
    tree = build_trees(x.to(device), BUDGET, torch.zeros(bs, dtype=torch.int64, device=device), check_finite=False)
    target = torch.where(torch.rand(tree.tokens.shape, generator=g) < 0.7, tree.tokens.cpu().roll(-1, 1).clamp(min=0),
                         torch.randint(0, 512, tree.tokens.shape, generator=g)).to(device)
    return tree, topk_logprobs(x.to(device), 1).ids[..., 0], walk(tree, target)


def _rounds(path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "rec"} for line in lines if line["kind"] == "round"]


def test_sync_free_and_equal_to_cpu(tmp_path):
    """Recording 200 rounds of varying batch size raises nothing under sync-debug mode "error",
    writes completed batches before close, and the file's rounds equal the CPU recorder's."""
    rounds = [_round(1 + step % 5, step, "cuda") for step in range(8)]
    gpu = Recorder(tmp_path / "gpu.jsonl", budget=BUDGET, horizon=HORIZON, stack={}, source="test")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(200):
            tree, rank0, result = rounds[step % len(rounds)]
            gpu.record_round([f"r/{b}" for b in range(tree.bs)], tree, rank0, result)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    tree, rank0, result = rounds[0]
    gpu.record_round([f"r/{b}" for b in range(tree.bs)], tree, rank0, result)  # polls: the done ones are written
    assert len(_rounds(gpu.path)) >= sum(rounds[s % len(rounds)][0].bs for s in range(200))
    gpu.close()

    with Recorder(tmp_path / "cpu.jsonl", budget=BUDGET, horizon=HORIZON, stack={}, source="test") as cpu:
        for step in range(201):
            tree, rank0, result = rounds[step % len(rounds)] if step < 200 else rounds[0]
            cpu_result = type(result)(*(t.cpu() for t in (result.accept_index, result.accept_len, result.bonus)))
            cpu_tree = type(tree)(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in vars(tree).items()})
            cpu.record_round([f"r/{b}" for b in range(tree.bs)], cpu_tree, rank0.cpu(), cpu_result)
    assert _rounds(gpu.path) == _rounds(cpu.path)
    assert any(line["path"] for line in _rounds(cpu.path))
