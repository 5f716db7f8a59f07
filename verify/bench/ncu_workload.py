"""The launches Nsight Compute reads (the ``topk-profile`` experiment): the fused top-K at bs 1 and
32 on N(0, 1) drafter logits, then the tree and verify kernels at bs 32, B 256, peaked drafter; each
launched twice (compile, then the launch to read). Needs a CUDA GPU."""

from __future__ import annotations

import torch

from repro.ddtree import TopK
from repro.kernels.topk_lse import topk_lse
from repro.kernels.tree_build import build_trees_fused, verify_tensors_fused
from verify.bench.bench_tree import draft_logits

HORIZON, VOCAB, K, BS = 15, 163840, 256, 32


def main() -> None:
    """Launch each profiled kernel twice."""
    for bs in (1, BS):
        x = draft_logits(bs, HORIZON, VOCAB, "randn", "cuda")
        for _ in range(2):
            topk_lse(x, K)
            torch.cuda.synchronize()
    topk = TopK(*topk_lse(draft_logits(BS, HORIZON, VOCAB, "peaked", "cuda"), K), VOCAB)
    roots = torch.zeros(BS, dtype=torch.int64, device="cuda")
    lens = torch.full((BS,), 1000, device="cuda")
    for _ in range(2):
        verify_tensors_fused(build_trees_fused(topk, K, roots), lens, 32000)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
