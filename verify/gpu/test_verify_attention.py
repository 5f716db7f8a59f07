"""repro.kernels.verify_attention on the GPU: Qwen3-8B's attention shapes in bf16 against the
float64 reference and, where SGLang is importable, against SGLang's extend kernel; and a CUDA
graph captured at one set of prefix lengths replayed at others (the slices are sized in the
kernel)."""

from __future__ import annotations

import pytest
import torch

from verify.attention_cases import make_case, reference, run, sglang_extend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

QWEN3 = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": torch.bfloat16, "device": "cuda"}
SHAPES = [([300], 64, True), ([1000], 16, False), ([0, 7, 513, 2048], 17, True), ([260] * 16, 16, True),
          ([90] * 3, 128, True), ([1500, 20], 512, True)]


@pytest.mark.parametrize(("prefixes", "q_len", "tree"), SHAPES,
                         ids=[f"bs{len(p)}-q{q}-{'tree' if t else 'chain'}" for p, q, t in SHAPES])
def test_bf16_matches_the_reference(prefixes, q_len, tree):
    """Within bf16's rounding of the output (the float64 reference on the same bf16 inputs)."""
    case = make_case(prefixes, q_len, tree=tree, seed=len(prefixes) + q_len, **QWEN3)
    got = run(case).double().cpu()
    assert (got - reference(case)).abs().max().item() < 2e-2


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_agrees_with_sglangs_extend_kernel(tree):
    """The kernel SGLang verifies with gives the same output (both bf16, different orders)."""
    case = make_case([700, 33], 64 if tree else 16, tree=tree, seed=5, **QWEN3)
    theirs = torch.empty_like(case["q"])
    call = sglang_extend(case, theirs)
    if call is None:
        pytest.skip("SGLang is not importable (its extend kernel is the comparison)")
    call()
    assert (run(case).float() - theirs.float()).abs().max().item() < 2e-2


def test_graph_replays_at_other_prefix_lengths():
    """Captured at prefixes (1300, 900), replayed at (1200, 3) and (0, 64) written into the same
    index buffers: each replay matches the reference of its own lengths."""
    first = make_case([1300, 900], 17, tree=False, seed=7, **QWEN3)
    o = torch.empty_like(first["q"])
    run(first, o)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(first, o)
    for prefixes in ([1200, 3], [0, 64]):
        case = make_case(prefixes, 17, tree=False, seed=8, **QWEN3)
        first["kv_indptr"].copy_(case["kv_indptr"])
        first["kv_indices"][: case["kv_indices"].numel()].copy_(case["kv_indices"])
        for name in ("q", "k_ext", "v_ext"):
            first[name].copy_(case[name])
        pool = case["k_buffer"].shape[0]
        first["k_buffer"][:pool].copy_(case["k_buffer"])
        first["v_buffer"][:pool].copy_(case["v_buffer"])
        graph.replay()
        assert (o.double().cpu() - reference(case)).abs().max().item() < 2e-2
