"""The worker's tree steps on the fastest exact path: fused Triton kernels on CUDA, else torch.

``REPRO_DDTREE_KERNELS`` picks the path: ``auto`` (default: the fused kernels of
:mod:`repro.kernels` for CUDA tensors when triton imports and the sizes fit, the batched torch
path of :mod:`repro.ddtree` otherwise), ``fused`` (always the kernels; an error where they cannot
run) or ``torch`` (always the torch path). Both paths give the same trees and tensors; the
kernels cost one launch each instead of hundreds (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from repro.ddtree import DraftTree, TopK, VerifyTensors, build_trees_from_topk, topk_logprobs, verify_tensors

KERNELS_ENV = "REPRO_DDTREE_KERNELS"
MODES = ("auto", "fused", "torch")


def kernels_mode() -> str:
    """The path chosen by REPRO_DDTREE_KERNELS (default auto)."""
    mode = os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        msg = f"{KERNELS_ENV} must be one of {', '.join(MODES)} (got {mode!r})"
        raise ValueError(msg)
    return mode


def _fused(device: torch.device, *, fits: bool) -> bool:
    mode = kernels_mode()
    if mode != "auto":
        return mode == "fused"
    return device.type == "cuda" and fits and importlib.util.find_spec("triton") is not None


def shard_topk(logits: torch.Tensor, k: int) -> TopK:
    """Top-``k`` and lse of each row of one vocabulary shard's logits [bs, L, V_shard]."""
    from repro.kernels.topk_lse import MAX_K

    if not _fused(logits.device, fits=k <= min(MAX_K, logits.shape[-1])):
        return topk_logprobs(logits, k)
    from repro.kernels.topk_lse import topk_lse

    values, ids, lse = topk_lse(logits, min(k, logits.shape[-1]))
    return TopK(values, ids, lse, logits.shape[-1])


def draft_tree(topk: TopK, budget: int, roots: torch.Tensor) -> DraftTree:
    """The draft trees of a batch from its per-depth top-K."""
    from repro.kernels.tree_build import MAX_BUDGET, build_trees_fused

    if _fused(topk.ids.device, fits=budget <= MAX_BUDGET):
        return build_trees_fused(topk, budget, roots)
    return build_trees_from_topk(topk, budget, roots)


def tree_verify_tensors(tree: DraftTree, prefix_lens: torch.Tensor, prefix_lens_sum: int) -> VerifyTensors:
    """Verify tensors of the trees (``prefix_lens_sum`` may be an upper bound)."""
    from repro.kernels.tree_build import verify_tensors_fused

    if _fused(tree.device, fits=True):
        return verify_tensors_fused(tree, prefix_lens, prefix_lens_sum)
    return verify_tensors(tree, prefix_lens, prefix_lens_sum)
