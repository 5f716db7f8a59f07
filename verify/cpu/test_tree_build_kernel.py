"""`repro.kernels.tree_build` under the Triton interpreter (TRITON_INTERPRET=1, in a subprocess):
the fused tree and verify-tensor kernels equal `build_trees_from_topk` / `verify_tensors` on
small shapes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
from unittest import mock
import torch
from verify.kernel_cases import _fix_interpreter_for_numpy_2_4
_fix_interpreter_for_numpy_2_4()
from repro.ddtree import build_trees_from_topk, topk_logprobs, verify_tensors
from repro.kernels.tree_build import _build_trees_fused_flagged, verify_tensors_fused
g = torch.Generator().manual_seed(0)
VERIFY = ("input_ids", "positions", "ancestor_mask", "full_mask", "retrive_index", "retrive_next_token",
          "retrive_next_sibling")

def check_verify(tree, lens, total, poison):
    # outputs start as `poison` (True/1, then False/0): the kernel must write every element
    fill = lambda *shape, dtype, device: torch.full(shape, poison, dtype=dtype, device=device)
    with mock.patch.object(torch, "empty", fill):
        f = verify_tensors_fused(tree, lens, total)
    a = verify_tensors(tree, lens, total)
    for name in VERIFY:
        assert torch.equal(getattr(a, name), getattr(f, name)), (tree.parents.shape, total, poison, name)

q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])
cases = [(q.log()[None], b) for b in (1, 3, 6)]
for i in range(12):  # ties, random and flat rows; budgets past V pad the tree
    L, V, B = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 6), (1, 25), (0, 40)))
    x = [torch.randint(-2, 3, (2, L, V), generator=g).float(), torch.randn(2, L, V, generator=g), torch.zeros(2, L, V)][i % 3]
    cases.append((x, B))
cases.append((torch.tensor([[[0.0, 0.0], [200.0, 0.0]]]), 4))  # certain token: prefix before extension
for budget in (16, 64, 200):  # confident drafter, deep trees: pruned, compacted and full-width depths
    x = torch.randn(2, 6, 600, generator=g) + 9 * (torch.rand(2, 6, 600, generator=g) > 0.995)
    cases.append((x.to(torch.bfloat16).float(), budget))
tied = torch.zeros(2, 4, 40)
tied[:, :, 0] = 200.0  # a certain chain, every other token tied: too many finalists for the enumeration
cases.append((tied, 8))
masked = torch.randn(2, 3, 40, generator=g)
masked[0, :, 5:] = float("-inf")  # fewer than B finite logits in a row: handed to the frontier kernel
cases.append((masked, 8))
spill = torch.full((1, 3, 100), -100.0) - 0.001 * torch.arange(100)
spill[0, 0, 0] = 0.0  # one certain token, 20 likely ones, then a parent keeps more ranks than the narrow path holds
spill[0, 1, :20] = -0.001 * torch.arange(20)
spill[0, 2] = -0.5 * torch.arange(100)
cases.append((spill, 64))
built = {"enum": 0, "frontier": 0}
for x, budget in cases:
    topk = topk_logprobs(x, max(1, min(budget, x.shape[-1])))
    block = torch.full((x.shape[0], 4), 99)
    block[:, 0] = torch.arange(x.shape[0]) + 7
    roots = block[:, 0]  # a strided view, as SGLang's drafter block column is
    want, (got, flags) = build_trees_from_topk(topk, budget, roots), _build_trees_fused_flagged(topk, budget, roots)
    if flags is not None:
        built["enum"] += int((flags == 0).sum())
        built["frontier"] += int((flags != 0).sum())
    for name in ("tokens", "parents", "depths", "scores", "num_nodes"):
        assert torch.equal(getattr(want, name), getattr(got, name)), (x.shape, budget, name)
    lens = torch.randint(0, 12, (x.shape[0], 2), generator=g)[:, 0]
    check_verify(got, lens, int(lens.sum()), 1)  # exact size
    check_verify(got, lens, int(lens.sum()) + 5, 0)  # an upper bound: a True tail
for bs, budget in ((33, 16), (3, 300)):  # verify only: a batch past a power of two, a budget past 256
    x = torch.randn(bs, 5, 400, generator=g)
    tree = build_trees_from_topk(topk_logprobs(x, budget), budget, torch.arange(bs))
    lens = torch.randint(0, 3000, (bs,), generator=g)
    check_verify(tree, lens, int(lens.sum()), 1)
    check_verify(tree, lens, int(lens.sum()) + 1, 0)
print(f"{len(cases)} cases equal; requests built by enum_kernel {built['enum']}, by tree_kernel {built['frontier']}")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_kernels_equal_the_torch_path_under_the_interpreter():
    """Worked example, 12 seeded ties/random/flat cases, a certain-token case, three deep trees
    at B 16 / 64 / 200, a case of one certain token among tied ones, one of -inf logits and one
    whose narrow (one-warp) depth hands a wide parent to the wide path: trees
    and verify tensors (FULL mask sized exactly and by an upper bound) match exactly, with strided
    roots and prefix lengths, every output element written over poisoned allocations; the same for
    verify tensors alone at bs 33 and at B 300; both the enumeration kernel and the frontier kernel
    it hands tied requests to built some of them."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "22 cases equal" in proc.stdout
    enum, frontier = (int(n) for n in re.findall(r"kernel (\d+)", proc.stdout))
    assert enum >= 10, proc.stdout  # the enumeration kernel built most trees ...
    assert frontier >= 2, proc.stdout  # ... and handed the all-tied ones to the frontier kernel


def test_budget_limit_is_a_clear_error():
    """Budgets past MAX_BUDGET are refused with a ValueError pointing at the torch path."""
    import torch

    from repro.ddtree import topk_logprobs
    from repro.kernels.tree_build import MAX_BUDGET, build_trees_fused

    with pytest.raises(ValueError, match=rf"budget <= {MAX_BUDGET} \(got 1024\); use build_trees_from_topk"):
        build_trees_fused(topk_logprobs(torch.randn(1, 2, 2000), 1024), 1024)
