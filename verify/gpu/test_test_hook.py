"""`repro.drafter_hook.rows` on CUDA: the drafter test hook's one-launch rows equal the torch
reference (`DrafterTestHook.logits`) bit for bit, replay in a CUDA graph, and never sync."""

from __future__ import annotations

import pytest
import torch

from repro.drafter_hook.hook import DrafterTestHook
from repro.drafter_hook.profiles import named_profile

pytestmark = pytest.mark.gpu
PROFILES = ["default", "paper-qwen3-8b-math500", "kimi-k2.5-dflash-gsm8k"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _hook(name: str, vocab: int, horizon: int, device: str = "cuda") -> DrafterTestHook:
    succ = torch.randperm(vocab, generator=torch.Generator().manual_seed(vocab))
    return DrafterTestHook.build(succ, named_profile(name), horizon=horizon, seed=1, device=device, name=name)


def _inputs(bs: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (bs,), generator=g).cuda(), torch.randint(0, 30000, (bs,), generator=g).cuda()


def _check(hook: DrafterTestHook, roots: torch.Tensor, prefix: torch.Tensor, out: torch.Tensor, top1: torch.Tensor) -> None:
    """out and top1 are the reference rows on the CPU (a twin hook there) and their argmax."""
    twin = _hook(hook.profile, hook.vocab_size, hook.horizon, device="cpu")
    ref = twin.logits(roots.cpu(), prefix.cpu())
    assert torch.equal(out.float().cpu(), ref)
    assert torch.equal(top1.cpu(), ref.argmax(-1))
    assert torch.equal(top1, torch.argmax(out, -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize(("vocab", "horizon"), [(151936, 15), (163840, 7), (4099, 3)])
@pytest.mark.parametrize("name", PROFILES)
def test_equals_the_reference(name, vocab, horizon, dtype):
    """Rows and argmax (with the rows, and alone by top1) equal the reference at Qwen3's and
    Kimi's vocabularies (and a ragged tile)."""
    hook = _hook(name, vocab, horizon)
    for bs, seed in ((1, 0), (16, 1)):
        roots, prefix = _inputs(bs, vocab, seed)
        out = torch.full((bs, horizon, vocab), 7.0, dtype=dtype, device="cuda")
        top1 = torch.full((bs, horizon), -1, dtype=torch.int64, device="cuda")
        assert hook.rows(roots, prefix.int(), out, top1) is out
        _check(hook, roots, prefix, out, top1)
        alone = torch.full((bs, horizon), -1, dtype=torch.int64, device="cuda")
        assert torch.equal(hook.top1(roots, prefix, alone), top1)


@pytest.mark.parametrize("name", PROFILES)
def test_vocabulary_shards_carry_their_columns(name):
    """Each TP rank's shard [start, end) equals those columns of the whole rows."""
    vocab, horizon = 163840, 7
    hook = _hook(name, vocab, horizon)
    roots, prefix = _inputs(4, vocab, 2)
    whole = hook.rows(roots, prefix)
    for lo, hi in ((0, 20480), (20480, 40963), (163000, 163840)):
        assert torch.equal(hook.rows(roots, prefix, vocab_start=lo, vocab_end=hi), whole[..., lo:hi])


@pytest.mark.parametrize("name", PROFILES)
def test_cuda_graph_replay_equals_eager(name):
    """Captured once into static buffers (rows with their argmax, and top1 alone), replays on
    new roots and prefix lengths give the reference (no allocation in the capture: the outputs
    are given)."""
    vocab, horizon, bs = 151936, 15, 8
    hook = _hook(name, vocab, horizon)
    block = torch.zeros((bs, 16), dtype=torch.int64, device="cuda")  # roots are a strided column
    prefix = torch.zeros(bs, dtype=torch.int64, device="cuda")
    out = torch.empty((bs, horizon, vocab), dtype=torch.float32, device="cuda")
    top1 = torch.empty((bs, horizon), dtype=torch.int64, device="cuda")
    alone = torch.empty((bs, horizon), dtype=torch.int64, device="cuda")
    hook.rows(block[:, 0], prefix, out, top1)  # compile outside the capture
    hook.top1(block[:, 0], prefix, alone)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hook.rows(block[:, 0], prefix, out, top1)
        hook.top1(block[:, 0], prefix, alone)
    for seed in (3, 4):
        roots, lens = _inputs(bs, vocab, seed)
        block[:, 0].copy_(roots)
        prefix.copy_(lens)
        graph.replay()
        torch.cuda.synchronize()
        _check(hook, roots, lens, out, top1)
        assert torch.equal(alone, top1)


def test_never_syncs_with_the_host():
    """rows and top1 with preallocated outputs run under sync-debug mode 'error'."""
    vocab, horizon = 151936, 15
    hook = _hook("paper-qwen3-8b-math500", vocab, horizon)
    roots, prefix = _inputs(4, vocab, 5)
    out = torch.empty((4, horizon, vocab), dtype=torch.bfloat16, device="cuda")
    top1 = torch.empty((4, horizon), dtype=torch.int64, device="cuda")
    hook.rows(roots, prefix, out, top1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hook.rows(roots, prefix, out, top1)
        hook.top1(roots, prefix, top1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _check(hook, roots, prefix, out, top1)
