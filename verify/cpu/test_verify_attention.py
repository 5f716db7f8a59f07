"""repro.kernels.verify_attention under the Triton interpreter (TRITON_INTERPRET=1, in a
subprocess) against a float64 reference: trees and chains, empty and multi-slice prefixes,
several query tiles, scrambled pool slots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.errors import UsageError
from repro.kernels.verify_attention import (
    BLOCK_M,
    ENV,
    MAX_SPLITS,
    NUM_WARPS,
    WIDE_BLOCK_M,
    WIDE_WARPS,
    Tiling,
    num_splits,
    serves,
    supports,
    tiling,
)
from verify.attention_cases import make_case, reference

REPO = Path(__file__).resolve().parents[2]
try:
    import triton  # noqa: F401

    NO_TRITON = False
except ImportError:
    NO_TRITON = True

CASES = {
    # three requests, one with no prefix, one across several 64-key slices; G 4
    "tree-bs3": make_case([0, 70, 200], 5, q_heads=8, kv_heads=2, head_dim=16, tree=True, seed=1),
    # chains (DFLASH's verify): causal among the draft tokens
    "chain-bs2": make_case([130, 3], 4, q_heads=4, kv_heads=2, head_dim=32, tree=False, seed=2),
    # 70 draft tokens x G 2: two wide query tiles, two key blocks of the tree's own keys
    "tree-wide": make_case([100], 70, q_heads=2, kv_heads=1, head_dim=16, tree=True, seed=3),
    # 30 draft tokens x G 4: two narrow query tiles
    "tree-two-tiles": make_case([90], 30, q_heads=8, kv_heads=2, head_dim=16, tree=True, seed=5),
    # the mask as uint8 bytes, G 1 (multi-head attention)
    "tree-uint8-mha": make_case([65, 64], 3, q_heads=2, kv_heads=2, head_dim=16, tree=True, seed=4,
                                mask_dtype=torch.uint8),
}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Every case's output from the Triton interpreter, run once in a subprocess."""
    if NO_TRITON:
        pytest.skip("triton is not installed (pip install -e '.[dev]' brings it on Linux)")
    tmp = tmp_path_factory.mktemp("verify_attention")
    torch.save(list(CASES.values()), tmp / "in.pt")
    proc = subprocess.run(
        [sys.executable, "-m", "verify.attention_cases", str(tmp / "in.pt"), str(tmp / "out.pt")],
        cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(zip(CASES, torch.load(tmp / "out.pt"), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_reference(interpreted, name):
    """Every draft token's output equals softmax attention over its prefix and visible drafts."""
    got = interpreted[name].double()
    assert got.shape == reference(CASES[name]).shape
    assert torch.allclose(got, reference(CASES[name]), atol=2e-5, rtol=1e-4)


def test_the_mask_matters(interpreted):
    """The same tensors verified as a chain differ: the tree's mask is read, not ignored."""
    tree = CASES["tree-wide"]
    chain = reference({**tree, "custom_mask": None, "mask_indptr": None})
    assert not torch.allclose(interpreted["tree-wide"].double(), chain, atol=1e-3)


def test_int32_offsets_only_where_the_pool_spans_under_the_limit():
    """A pool's span (first to last element, what its offsets reach) decides the offset width: a
    strided view reaches past its numel."""
    from repro.kernels.verify_attention import _span

    pool = torch.empty(10, 8, 128)
    assert _span(pool) == pool.numel()
    every_other = pool[::2]
    assert every_other.numel() == pool.numel() // 2 and _span(every_other) == 9 * 8 * 128
    assert _span(torch.empty(0, 8)) == 0


def test_splits_fill_about_two_waves():
    """One request's 8 KV heads on 132 SMs take the most slices; a batch that already fills the
    GPU takes one."""
    assert num_splits(1, 8, 1, 132) == MAX_SPLITS
    assert num_splits(1, 8, 4, 132) == 8
    assert num_splits(16, 8, 2, 132) == 1


@pytest.mark.parametrize(("bs", "q_len", "want"), [
    (1, 16, Tiling(BLOCK_M, NUM_WARPS, 1, MAX_SPLITS)), (1, 32, Tiling(BLOCK_M, NUM_WARPS, 2, MAX_SPLITS)),
    (1, 33, Tiling(WIDE_BLOCK_M, WIDE_WARPS, 2, 4)), (1, 64, Tiling(WIDE_BLOCK_M, WIDE_WARPS, 2, 4)),
    (4, 64, Tiling(WIDE_BLOCK_M, WIDE_WARPS, 2, 2)), (1, 128, Tiling(WIDE_BLOCK_M, WIDE_WARPS, 4, 2)),
    (16, 512, Tiling(WIDE_BLOCK_M, WIDE_WARPS, 16, 2))])
def test_wide_trees_take_wide_tiles_and_one_wave(bs, q_len, want):
    """Qwen3-8B's heads (G 4, 8 KV heads) on 132 SMs: up to 128 query rows a KV head in 64-row
    tiles over two waves; past it 128-row tiles whose programs fit one wave (at least 2 slices)."""
    assert tiling(bs, q_len, 4, 8, 132) == want


def test_supports_plain_attention_only():
    """Soft caps, windows, sinks, scaled (fp8) KV, pages and odd head dims stay with SGLang."""
    q, pool = torch.empty(1, 32, 128, dtype=torch.bfloat16), torch.empty(9, 8, 128, dtype=torch.bfloat16)
    shape = {"max_q_len": 64, "head_dim": 128, "v_head_dim": 128}
    assert supports(q, pool, **shape)
    assert not supports(q, pool, **shape, logit_cap=30.0)
    assert not supports(q, pool, **shape, sliding_window=4096)
    assert not supports(q, pool, **shape, has_sinks=True)
    assert not supports(q, pool, **shape, kv_scaled=True)
    assert not supports(q, pool, **shape, page_size=16)
    assert not supports(q, pool, **{**shape, "head_dim": 192})
    assert not supports(q, pool.to(torch.float8_e4m3fn), **shape)
    assert not supports(q, pool, **shape, temperature_len=8192)


@pytest.mark.parametrize(("q_len", "taken"), [(16, True), (17, True), (64, True), (129, True), (512, True),
                                             (513, True), (514, False)])
def test_trees_past_513_tokens_stay_with_sglang(q_len, taken):
    """Qwen3-8B's heads (G 4): chains and trees of up to 513 tokens, B 512's (the H200 bench at bs 1,
    4 and 16: 1.02-12.5x), not the wider trees the bench has not measured."""
    q, pool = torch.empty(1, 32, 128, dtype=torch.bfloat16), torch.empty(9, 8, 128, dtype=torch.bfloat16)
    assert supports(q, pool, max_q_len=q_len, head_dim=128, v_head_dim=128) is taken


@pytest.mark.parametrize(("gpu", "head_dim", "q_len", "taken"), [
    ("sm90", 128, 64, True), ("sm90", 256, 16, True), ("sm90", 256, 32, True), ("sm90", 256, 64, False),
    ("sm120", 128, 64, True), ("sm120", 128, 512, True), ("sm120", 256, 16, False)])
def test_tiles_past_the_gpus_shared_memory_stay_with_sglang(monkeypatch, gpu, head_dim, q_len, taken):
    """On an H200 (227 KiB a program, two buffers a key block) head dim 256 fits chains and small
    trees but not a 64-token tree's tiles; on an RTX PRO 6000 (99 KiB, one buffer) head dim 128
    fits every tree and 256 nothing: those verifies take SGLang's kernel rather than fail to launch."""
    import repro.kernels.verify_attention as va

    monkeypatch.setattr(va, "_shared_memory", lambda device: {"sm90": (232448, 2), "sm120": (101376, 1)}[gpu])
    q = torch.empty(1, 32, head_dim, dtype=torch.bfloat16)
    pool = torch.empty(9, 8, head_dim, dtype=torch.bfloat16)
    assert supports(q, pool, max_q_len=q_len, head_dim=head_dim, v_head_dim=head_dim) is taken


@pytest.mark.parametrize(("mode", "served"), [(None, {"DDTREE", "DFLASH"}), ("ddtree", {"DDTREE"}),
                                              (" DFLASH , DDTREE ", {"DDTREE", "DFLASH"}), (" OFF ", set())])
def test_which_verifies_are_served(monkeypatch, mode, served):
    """By default DDTREE's tree and DFLASH's chain (never another algorithm's layout); a list picks
    some; ``off`` none; never without a speculative algorithm."""
    if mode is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, mode)
    assert {a for a in ("DDTREE", "DFLASH", "EAGLE") if serves(a)} == served
    assert not serves(None)


@pytest.mark.parametrize("mode", ["yes", "DDTREE,EAGLE", "DDTREE,", ""])
def test_a_bad_mode_names_the_choices(monkeypatch, mode):
    """A typo, an untested algorithm or an empty entry is one usage error naming the choices."""
    monkeypatch.setenv(ENV, mode)
    with pytest.raises(UsageError, match=f"^{ENV} must be off or a comma list of DDTREE, DFLASH \\(got"):
        serves("DDTREE")
