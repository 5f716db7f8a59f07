"""Tests for `repro.kernels.topk_lse` on CUDA: exact top-K and lse against the torch reference
over dtypes, k, vocab sizes and adversarial rows; vocab shards; graph capture; no host sync."""

from __future__ import annotations

import itertools

import pytest
import torch

from repro.ddtree import TopK, merge_topk
from repro.kernels.topk_lse import TopKConfig, topk_lse
from verify.kernel_cases import KINDS, assert_exact, make_logits

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
GRID = [(v, k, d) for v in (100, 4096, 151936, 163840) for k in (1, 7, 64, 256, 1024) for d in DTYPES if k <= v]
# Non-default tunables the benchmark sweeps: each must stay exact (chunked key scans, forced slow path).
CONFIGS = [
    TopKConfig(tile=16384, stream_warps=16, programs=256, select_warps=8, gather=4096, group=64),
    TopKConfig(tile=1024, stream_warps=4, programs=4096, select_warps=2, gather=1024, group=16),
    TopKConfig(scan_block=512, min_cap=1, cap_mult=2),
    TopKConfig(search_pivots=1),
    TopKConfig(scan_tail=False),
    TopKConfig(split_rows=0),
    TopKConfig(split_rows=1 << 30),
    TopKConfig(stream_stages=1),
]


@pytest.mark.parametrize(("vocab", "k", "dtype"), GRID, ids=[f"v{v}-k{k}-{str(d)[6:]}" for v, k, d in GRID])
def test_matches_stable_sort_on_every_kind(vocab, k, dtype):
    """Random, tied, flat, peaked, sorted, boundary-tie and signed-zero rows all match exactly."""
    for seed, kind in enumerate(KINDS):
        x = make_logits(kind, 5, vocab, dtype, k=k, seed=seed)
        assert_exact(x, k, topk_lse(x.cuda(), k))


@pytest.mark.parametrize("config", CONFIGS, ids=["big-tiles", "small-tiles", "tiny-buffers", "bisection", "one-key-tile",
                                               "one-select", "split-select", "one-stream-stage"])
@pytest.mark.parametrize("kind", ["random", "peaked", "boundary", "tied"])
def test_swept_configs_stay_exact(config, kind):
    """Every tunable set the benchmark sweeps gives the same exact result at the deployment shape."""
    x = make_logits(kind, 30, 163840, torch.bfloat16, k=256, seed=3)
    assert_exact(x, 256, topk_lse(x.cuda(), 256, config=config))


@pytest.mark.parametrize("k", [7, 256])
def test_vocab_shards_merge_to_the_whole_row(k):
    """Per-shard results (uneven, unaligned shard views) carry global ids and merge to the whole."""
    vocab, bounds = 163840, [0, 50000, 100003, 163840]
    x = make_logits("random", 2 * 15, vocab, torch.bfloat16, seed=7).view(2, 15, vocab).cuda()
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        out = topk_lse(x[..., lo:hi], k, id_offset=lo)
        assert_exact(x[..., lo:hi], k, out, lo)
        parts.append(TopK(*out, vocab_size=vocab))
    merged = merge_topk(parts, k)
    assert_exact(x, k, (merged.logits, merged.ids, merged.lse))


def test_leading_dims_and_strided_rows():
    """[bs, L, V] input gives [bs, L, k] / [bs, L]; a non-contiguous vocab dim is handled."""
    x = make_logits("random", 24, 4096, torch.float16, seed=1).view(2, 12, 4096).cuda()
    logits, ids, lse = topk_lse(x, 64)
    assert logits.shape == ids.shape == (2, 12, 64) and lse.shape == (2, 12)
    assert_exact(x, 64, (logits, ids, lse))
    xt = x.reshape(24, 4096).t().contiguous().t()  # stride (1, 24): vocab dim not contiguous
    assert_exact(xt, 64, topk_lse(xt, 64))


@pytest.mark.parametrize("split_rows", [0, 1 << 30], ids=["one-select", "split-select"])
def test_cuda_graph_replay_equals_eager(split_rows):
    """Captured once, replayed on new logits in the same buffer, it equals an eager call (with
    either select: the split one keeps per-row counters that every call resets)."""
    config = TopKConfig(split_rows=split_rows)
    static = make_logits("random", 120, 163840, torch.bfloat16, seed=11).cuda()
    topk_lse(static, 256, config=config)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = topk_lse(static, 256, config=config)
    for seed, kind in ((12, "peaked"), (13, "tied")):
        static.copy_(make_logits(kind, 120, 163840, torch.bfloat16, k=256, seed=seed).cuda())
        graph.replay()
        for a, b in zip(outs, topk_lse(static, 256, config=config), strict=True):
            assert torch.equal(a, b)


def test_never_syncs_with_the_host():
    """A call runs under sync-debug mode 'error'."""
    x = make_logits("random", 15, 163840, torch.bfloat16, seed=5).cuda()
    topk_lse(x, 64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        topk_lse(x, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
