"""Tests for `repro.kernels.topk_lse` on CUDA: exact top-K and lse against the torch reference
over dtypes, k, vocab sizes and adversarial rows; vocab shards; graph capture; row chunks
overlapped on a side stream; no host sync."""

from __future__ import annotations

import itertools

import pytest
import torch

from repro.ddtree import TopK, merge_topk
from repro.kernels.topk_lse import TopKConfig, prepare, topk_lse
from verify.kernel_cases import KINDS, assert_exact, make_logits

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
GRID = [(v, k, d) for v in (100, 4096, 151936, 163840) for k in (1, 7, 64, 256, 1024) for d in DTYPES if k <= v]
# Non-default tunables the benchmark sweeps: each must stay exact (chunked key scans, forced slow path).
CONFIGS = [
    TopKConfig(tile=16384, stream_warps=16, programs=256, select_warps=8, gather=4096, group=64),
    TopKConfig(tile=1024, stream_warps=4, programs=4096, select_warps=2, gather=1024, group=16),
    TopKConfig(scan_block=512, min_cap=1, cap_mult=2),
    TopKConfig(bisect_unroll=1),
    TopKConfig(scan_tail=True, row_chunks=4),
]


@pytest.mark.parametrize(("vocab", "k", "dtype"), GRID, ids=[f"v{v}-k{k}-{str(d)[6:]}" for v, k, d in GRID])
def test_matches_stable_sort_on_every_kind(vocab, k, dtype):
    """Random, tied, flat, peaked, sorted, boundary-tie and signed-zero rows all match exactly."""
    for seed, kind in enumerate(KINDS):
        x = make_logits(kind, 5, vocab, dtype, k=k, seed=seed)
        assert_exact(x, k, topk_lse(x.cuda(), k))


@pytest.mark.parametrize("config", CONFIGS, ids=["big-tiles", "small-tiles", "tiny-buffers", "bisect-loop", "scan-tail-chunks"])
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


def test_cuda_graph_replay_equals_eager():
    """Captured once, replayed on new logits in the same buffer, it equals an eager call."""
    static = make_logits("random", 120, 163840, torch.bfloat16, seed=11).cuda()
    topk_lse(static, 256)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = topk_lse(static, 256)
    for seed, kind in ((12, "peaked"), (13, "tied")):
        static.copy_(make_logits(kind, 120, 163840, torch.bfloat16, k=256, seed=seed).cuda())
        graph.replay()
        for a, b in zip(outs, topk_lse(static, 256), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("rows", [15, 480])
@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_row_chunks_match_one_launch_eager_and_replayed(rows, chunks):
    """Row chunks overlapped on a side stream give the top-K of one launch bit for bit, eagerly,
    through prepare's two launches and replayed from a CUDA graph on new logits; the graph replays
    the eager result bit for bit (lse too: it may differ from one launch's in the last ulps, as the
    chunks' smaller row counts take more splits per row)."""
    config = TopKConfig(row_chunks=chunks)
    static = make_logits("random", rows, 163840, torch.bfloat16, seed=rows + chunks).cuda()
    one = topk_lse(static, 256)
    eager = topk_lse(static, 256, config=config)  # also compiles and makes the side stream
    stream, select, split = prepare(static, 256, config=config)
    stream()
    select()
    for out in (eager, split):
        assert torch.equal(out[0], one[0]) and torch.equal(out[1], one[1]) and torch.equal(out[2], eager[2])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = topk_lse(static, 256, config=config)
    for seed, kind in ((1, "peaked"), (2, "tied")):
        static.copy_(make_logits(kind, rows, 163840, torch.bfloat16, k=256, seed=seed).cuda())
        graph.replay()
        for a, b in zip(outs, topk_lse(static, 256, config=config), strict=True):
            assert torch.equal(a, b)
        one = topk_lse(static, 256)
        assert torch.equal(outs[0], one[0]) and torch.equal(outs[1], one[1])


@pytest.mark.parametrize("config", [TopKConfig(), TopKConfig(row_chunks=4)], ids=["one-launch", "row-chunks"])
def test_never_syncs_with_the_host(config):
    """A call runs under sync-debug mode 'error', with or without row chunks on a side stream."""
    x = make_logits("random", 15, 163840, torch.bfloat16, seed=5).cuda()
    topk_lse(x, 64, config=config)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        topk_lse(x, 64, config=config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
