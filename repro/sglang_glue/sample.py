"""The target's token at every tree node from SGLang's sampling parameters (docs/SPEC.md §4).

Greedy batches take the argmax. Otherwise every node gets its own sample of the target's rule
(``repro.ddtree.sample_target_tokens``: an exponential race, no host sync): with no top-k/top-p
in the batch (SGLang's host flags say so) the race runs on the temperature-scaled logits with no
sort; with them the kept tokens come from sgl_kernel's sort-free top-p / top-k renormalisation
on CUDA (top-p on the full distribution, then top-k, the order of the sort rule), else from the
sort path.
"""

from __future__ import annotations

from typing import Any

import torch

from repro.ddtree import sample_target_tokens


def target_tokens(logits: torch.Tensor, sampling_info: Any, bs: int, n: int) -> torch.Tensor:
    """[bs, n] the target's token per node from verify logits [bs*n, V] and SGLang's
    SamplingBatchInfo (None or all greedy: argmax)."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return torch.argmax(logits, dim=-1).view(bs, n)
    filtered = bool(sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling)
    return sample_target_tokens(
        logits.view(bs, n, -1),
        sampling_info.temperatures.view(-1),
        sampling_info.top_ks.view(-1),
        sampling_info.top_ps.view(-1),
        filtered=filtered,
        renorm=sgl_kernel_renorm() if filtered and logits.is_cuda else None,
    )


def sgl_kernel_renorm() -> Any:
    """renorm(probs, top_k, top_p) on sgl_kernel's precompiled sort-free kernels, or None when
    sgl_kernel is not importable (the sampler then sorts)."""
    try:
        import sgl_kernel  # noqa: F401 - registers torch.ops.sgl_kernel
    except ImportError:
        return None
    ops = torch.ops.sgl_kernel

    def renorm(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        nucleus = torch.empty_like(probs)
        ops.top_p_renorm_probs.default(probs, nucleus, top_p.float(), 1.0)
        kept = torch.empty_like(probs)
        ops.top_k_renorm_probs.default(nucleus, kept, top_k.int(), 0)
        return kept

    return renorm
