"""The batched DDTree path on CUDA: same results as on CPU and the golden set, no host sync,
and CUDA-graph replay identical to eager."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from repro.ddtree import build_trees, build_trees_from_topk, emitted_tokens, topk_logprobs, verify_tensors, walk
from repro.ddtree.commit import accepted_rows
from repro.golden import cases
from verify.strategies import logits_and_budget

pytestmark = pytest.mark.gpu
GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASES = list(cases.iter_cases(GOLDEN))


@pytest.mark.parametrize(("entry", "spec"), CASES, ids=[spec.name for _, spec in CASES])
def test_golden_case_on_cuda(entry, spec):
    """Every golden case re-derives with the batched path on the GPU: trees, masks, pointers and
    walks bit-for-bit; scores to SCORE_ATOL (CUDA's logsumexp rounds differently from the CPU's)."""
    inputs, stored = cases.load_case(GOLDEN, entry)
    derived = cases.derive(inputs, spec.budget, "batched", "cuda")
    assert cases.mismatches(stored, derived, score_atol=cases.SCORE_ATOL) == []


@settings(max_examples=300)
@given(logits_and_budget(max_bs=4, max_horizon=8, max_vocab=64))
def test_cuda_equals_cpu(case):
    """Trees and walks built on CUDA equal those built on the CPU, ties included (scores to SCORE_ATOL)."""
    x, budget = case
    roots = torch.zeros(x.shape[0], dtype=torch.int64)
    cpu, gpu = build_trees(x, budget, roots), build_trees(x.cuda(), budget, roots.cuda())
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name
    assert torch.allclose(cpu.scores, gpu.scores.cpu(), rtol=0.0, atol=cases.SCORE_ATOL)
    target = cpu.tokens.roll(-1, 1).clamp(min=0)
    assert torch.equal(walk(cpu, target).accept_index, walk(gpu, target.cuda()).accept_index.cpu())


def _round(logits, roots, lens, lens_sum, target, budget):
    """Everything after the drafter and before the target's sampler, as one hot path."""
    tree = build_trees_from_topk(topk_logprobs(logits, budget), budget, roots)
    vt = verify_tensors(tree, lens, lens_sum)
    result = walk(tree, target)
    return (tree.tokens, tree.parents, vt.positions, vt.full_mask, vt.retrive_next_token, vt.retrive_next_sibling,
            result.accept_index, result.bonus, emitted_tokens(tree, result), accepted_rows(result, tree.n))


def _inputs(bs=8, horizon=15, vocab=4096, budget=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(bs, horizon, vocab, device="cuda", generator=g).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (bs,), device="cuda", generator=g)
    lens = torch.randint(1, 100, (bs,), device="cuda", generator=g)
    target = torch.randint(0, vocab, (bs, budget + 1), device="cuda", generator=g)
    return logits, roots, lens, target


def test_hot_path_never_syncs():
    """Tree, verify tensors, walk and commit run under sync-debug mode 'error' (no host sync)."""
    logits, roots, lens, target = _inputs()
    lens_sum = int(lens.sum())
    _round(logits, roots, lens, lens_sum, target, 64)  # warm-up fills per-device caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _round(logits, roots, lens, lens_sum, target, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("budget", [1, 16, 256])
def test_cuda_graph_replay_equals_eager(budget):
    """A captured round replayed on new inputs gives exactly the eager results."""
    logits, roots, lens, target = _inputs(budget=budget)
    lens_sum = 8 * 99  # the graph's FULL-mask size is fixed at capture: keep the sum constant
    lens.fill_(99)
    static = [t.clone() for t in (logits, roots, lens, target)]
    _round(*static[:3], lens_sum, *static[3:], budget)  # warm-up on a side stream is not needed
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _round(*static[:3], lens_sum, *static[3:], budget)
    for seed in (1, 2):
        new = _inputs(budget=budget, seed=seed)
        new[2].fill_(99)
        for s, n in zip(static, new, strict=True):
            s.copy_(n)
        graph.replay()
        eager = _round(*new[:3], lens_sum, *new[3:], budget)
        for a, b in zip(outs, eager, strict=True):
            assert torch.equal(a, b)
