"""`repro.kernels.tree_build` on the GPU: the fused tree and verify-tensor kernels equal the
batched torch path (golden set, seeded cases), never sync, and replay identically in a graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from repro.ddtree import build_trees_from_topk, topk_logprobs, verify_tensors, walk
from repro.golden import cases
from repro.kernels.tree_build import MAX_BUDGET, _build_trees_fused_flagged, build_trees_fused, verify_tensors_fused

pytestmark = pytest.mark.gpu
GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASES = [(e, s) for e, s in cases.iter_cases(GOLDEN) if s.budget <= MAX_BUDGET]
TREE = ("tokens", "parents", "depths", "scores", "num_nodes")
VERIFY = ("input_ids", "positions", "ancestor_mask", "full_mask", "retrive_index", "retrive_next_token", "retrive_next_sibling")


@pytest.mark.parametrize(("entry", "spec"), CASES, ids=[s.name for _, s in CASES])
def test_golden_case(entry, spec):
    """The fused kernels reproduce every stored tree and verify tensor of the golden set."""
    inputs, stored = cases.load_case(GOLDEN, entry)
    x = {k: v.cuda() for k, v in inputs.items()}
    tree = build_trees_fused(topk_logprobs(x["draft_logits"], max(1, min(spec.budget, spec.vocab))), spec.budget, x["roots"])
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(tree, name).cpu(), stored[name]), name
    assert torch.allclose(tree.scores.cpu(), stored["scores"], rtol=0.0, atol=cases.SCORE_ATOL)  # CUDA lse rounding
    vt = verify_tensors_fused(tree, x["prefix_lens"], int(inputs["prefix_lens"].sum()))
    names = {"ancestor_mask": "ancestor_mask", "full_mask": "full_mask", "retrive_index": "retrive_index",
             "retrive_next_token": "retrive_next_token", "retrive_next_sibling": "retrive_next_sibling"}
    for name, key in names.items():
        assert torch.equal(getattr(vt, name).cpu(), stored[key]), name
    assert torch.equal(vt.positions.view(spec.bs, -1).cpu(), stored["positions"])


@pytest.mark.parametrize("budget", [1, 16, 64, 256])
@pytest.mark.parametrize("family", ["random", "ties", "flat", "peaked"])
def test_seeded_cases_equal_torch_path(budget, family):
    """At the deployment's shape (L = 15), 16 requests per family equal the torch path exactly;
    on untied rows the enumeration kernel builds at least half of them."""
    g = torch.Generator(device="cuda").manual_seed(budget)
    shape = (16, 15, 4096)
    x = {
        "random": torch.randn(shape, device="cuda", generator=g),
        "ties": torch.randint(-2, 3, shape, device="cuda", generator=g).float(),
        "flat": torch.zeros(shape, device="cuda"),
        "peaked": torch.randn(shape, device="cuda", generator=g) + 12 * (torch.rand(shape, device="cuda", generator=g) > 0.999),
    }[family].to(torch.bfloat16)
    topk = topk_logprobs(x, budget)
    roots = torch.arange(16, device="cuda")
    want = build_trees_from_topk(topk, budget, roots)
    got, flags = _build_trees_fused_flagged(topk, budget, roots)
    for name in TREE:
        assert torch.equal(getattr(want, name), getattr(got, name)), name
    if family in ("random", "peaked"):  # the enumeration kernel, not only its fallback, built trees
        assert int((flags == 0).sum()) >= 8, flags
    lens = torch.randint(0, 2000, (16,), device="cuda", generator=g)
    total = int(lens.sum())
    a, b = verify_tensors(want, lens, total), verify_tensors_fused(got, lens, total)
    for name in VERIFY:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_fused_round_is_sync_free_and_graph_replayable():
    """Fused tree + verify tensors + walk: no host sync, and graph replay equals eager."""
    budget, lens_sum = 64, 8 * 500
    def make(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(8, 15, 4096, device="cuda", generator=g).to(torch.bfloat16),
                torch.randint(0, 4096, (8, budget + 1), device="cuda", generator=g))
    lens = torch.full((8,), 500, device="cuda")
    roots = torch.zeros(8, dtype=torch.int64, device="cuda")

    def round_(x, target):
        tree = build_trees_fused(topk_logprobs(x, budget), budget, roots)
        vt = verify_tensors_fused(tree, lens, lens_sum)
        return tree.tokens, tree.parents, vt.full_mask, vt.retrive_next_sibling, walk(tree, target).accept_index

    x, target = make(0)
    round_(x, target)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        round_(x, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = round_(x, target)
    for seed in (1, 2):
        nx, nt = make(seed)
        x.copy_(nx)
        target.copy_(nt)
        graph.replay()
        for a, b in zip(outs, round_(nx, nt), strict=True):
            assert torch.equal(a, b)
