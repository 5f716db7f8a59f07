"""Tests for `repro.sglang_glue.tree`: the worker's tree steps pick the fused kernels or the torch
path (REPRO_DDTREE_KERNELS), and both give the same results."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.ddtree import build_trees_from_topk, topk_logprobs, verify_tensors
from repro.sglang_glue.tree import KERNELS_ENV, draft_tree, kernels_mode, shard_topk, tree_verify_tensors

REPO = Path(__file__).resolve().parents[2]


class TestMode:
    def test_default_is_auto(self, monkeypatch):
        """Without the variable the worker chooses per device."""
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        assert kernels_mode() == "auto"

    def test_bad_value_names_the_variable(self, monkeypatch):
        """A typo is one ValueError naming the variable and the choices."""
        monkeypatch.setenv(KERNELS_ENV, "fast")
        with pytest.raises(ValueError, match=r"REPRO_DDTREE_KERNELS must be one of auto, fused, torch \(got 'fast'\)"):
            kernels_mode()

    @pytest.mark.parametrize("mode", ["auto", "torch"])
    def test_cpu_tensors_take_the_torch_path(self, monkeypatch, mode):
        """On CPU tensors auto (and torch) give exactly repro.ddtree's results."""
        monkeypatch.setenv(KERNELS_ENV, mode)
        x = torch.randint(-2, 3, (2, 5, 40)).float()
        roots, lens = torch.tensor([3, 4]), torch.tensor([7, 0])
        top = shard_topk(x, 16)
        want = topk_logprobs(x, 16)
        assert torch.equal(top.ids, want.ids) and torch.equal(top.logits, want.logits)
        tree, ref = draft_tree(top, 16, roots), build_trees_from_topk(want, 16, roots)
        assert torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
        assert torch.equal(tree_verify_tensors(tree, lens, 9).full_mask, verify_tensors(ref, lens, 9).full_mask)


SCRIPT = r"""
import torch
from verify.kernel_cases import _fix_interpreter_for_numpy_2_4
_fix_interpreter_for_numpy_2_4()
from repro.ddtree import build_trees_from_topk, topk_logprobs, verify_tensors
from repro.sglang_glue.tree import draft_tree, shard_topk, tree_verify_tensors
x = torch.randint(-2, 3, (2, 4, 300)).float()
roots, lens = torch.tensor([1, 2]), torch.tensor([5, 3])
top, want = shard_topk(x, 16), topk_logprobs(x, 16)
assert torch.equal(top.ids, want.ids) and torch.equal(top.logits, want.logits)
tree, ref = draft_tree(top, 16, roots), build_trees_from_topk(want, 16, roots)
for name in ("tokens", "parents", "depths", "num_nodes"):
    assert torch.equal(getattr(tree, name), getattr(ref, name)), name
a, b = tree_verify_tensors(tree, lens, 8), verify_tensors(ref, lens, 8)
assert torch.equal(a.full_mask, b.full_mask) and torch.equal(a.retrive_next_sibling, b.retrive_next_sibling)
print("fused path ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_forced_fused_path_matches_under_the_interpreter():
    """REPRO_DDTREE_KERNELS=fused runs the Triton kernels (interpreted on CPU) with equal results."""
    env = {**os.environ, "TRITON_INTERPRET": "1", KERNELS_ENV: "fused", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fused path ok" in proc.stdout
