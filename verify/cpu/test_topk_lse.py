"""Tests for `repro.kernels.topk_lse` on the CPU: argument checks, launch plans, and the Triton
kernels themselves under the interpreter (TRITON_INTERPRET=1, in a subprocess) on small shapes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.kernels.topk_lse import MAX_K, SELECT_WIDE_ROWS, TopKConfig, make_plan, stream_pairs, topk_lse
from verify.kernel_cases import assert_exact, make_logits

REPO = Path(__file__).resolve().parents[2]
NO_TRITON = importlib.util.find_spec("triton") is None
TINY = {"tile": 64, "programs": 5, "scan_block": 16, "gather": 32, "min_cap": 1, "group": 4}
"""Tunables that force chunked key scans, many splits and the slow path on small rows."""

# (name, kind, rows, vocab, k, dtype, config): each name is one interpreted call.
CASES = [
    ("random-bf16", "random", 3, 1000, 64, torch.bfloat16, {}),
    ("k-equals-vocab", "random", 2, 100, 100, torch.float32, {}),
    ("k1-fp16", "random", 3, 3000, 1, torch.float16, {}),
    ("tied-slow-path", "tied", 2, 700, 7, torch.bfloat16, {}),
    ("flat-slow-path", "flat", 2, 300, 16, torch.float32, {}),
    ("peaked", "peaked", 3, 2000, 7, torch.bfloat16, {}),
    # the slow path's scan in chunks: floor ties past k 32 (a pass a chunk after the first), and
    # creeping float32 rows (every token beats the K-th best: several passes of CAP tokens a chunk)
    ("floor-slow-path", "floor", 2, 3000, 40, torch.float32, {"slow_chunk": 1, "select_warps": 8}),
    ("floor-slow-path-bf16", "floor", 2, 3000, 48, torch.bfloat16, {"slow_chunk": 2, "split_rows": 0}),
    ("creep-slow-chunks", "creep", 2, 1500, 9, torch.float32, {**TINY, "slow_chunk": 1}),
    ("ascending", "ascending", 2, 1500, 33, torch.float16, {}),
    ("descending", "descending", 2, 1500, 64, torch.bfloat16, {}),
    ("boundary-ties", "boundary", 3, 600, 64, torch.float32, {}),
    ("signed-zeros", "signed_zeros", 2, 500, 16, torch.bfloat16, {}),
    ("k256", "random", 2, 4096, 256, torch.bfloat16, {}),
    ("k1", "random", 3, 1000, 1, torch.bfloat16, {}),  # one key: no sort network, int32 candidates
    ("tiny-config-random", "random", 2, 999, 16, torch.float16, TINY),
    ("tiny-config-boundary", "boundary", 2, 999, 16, torch.bfloat16, TINY),
    # the threshold search with one pivot per round (a bisection), with 4, and with 64
    ("bisection-random", "random", 3, 1000, 64, torch.bfloat16, {"search_pivots": 1}),
    ("pivots-4-boundary", "boundary", 3, 600, 64, torch.float32, {"search_pivots": 4}),
    ("bisection-tied", "tied", 2, 700, 7, torch.bfloat16, {"search_pivots": 1}),
    ("pivots-64-peaked", "peaked", 2, 2000, 16, torch.bfloat16, {"search_pivots": 64}),
    # group keys as a head and a tail tile (M 500: 256 + 256; M 260: 256 + 4; M 44: 32 + 16, slow path)
    ("scan-tail-random", "random", 3, 1000, 64, torch.bfloat16, {"scan_tail": True}),
    ("scan-tail-boundary", "boundary", 3, 1040, 16, torch.bfloat16, {"group": 4, "scan_tail": True}),
    ("scan-tail-tied", "tied", 2, 700, 7, torch.bfloat16, {"scan_tail": True}),
    # the same key counts in one padded tile (M 500: 512; M 260: 512; M 44: 64, slow path)
    ("one-tile-random", "random", 3, 1000, 64, torch.bfloat16, {"scan_tail": False}),
    ("one-tile-boundary", "boundary", 3, 1040, 16, torch.bfloat16, {"group": 4, "scan_tail": False}),
    ("one-tile-tied", "tied", 2, 700, 7, torch.bfloat16, {"scan_tail": False}),
    # the threshold searched over the group keys themselves, and over super keys of 2, 8 and 4
    ("no-super-keys-random", "random", 3, 1000, 16, torch.bfloat16, {"super_keys": 1}),
    ("super-keys-2-boundary", "boundary", 3, 1000, 16, torch.bfloat16, {"super_keys": 2}),
    ("super-keys-8-peaked", "peaked", 3, 4000, 4, torch.float32, {"super_keys": 8}),
    # the select in one launch per row (the default from 64 rows on; split_rows 0)
    ("one-select-random", "random", 3, 1000, 64, torch.bfloat16, {"split_rows": 0}),
    ("one-select-tied", "tied", 2, 700, 7, torch.bfloat16, {"split_rows": 0}),
    ("one-select-tiny", "boundary", 2, 999, 16, torch.bfloat16, {**TINY, "split_rows": 0}),
    ("super-keys-chunked", "random", 2, 2000, 8, torch.float16, {**TINY, "super_keys": 4, "min_cap": 64}),
    # the stream with one tile in flight (not software-pipelined)
    ("one-stream-stage", "random", 2, 999, 16, torch.bfloat16, {**TINY, "stream_stages": 1}),
]
SHARDS = [(0, 1100), (1100, 1501), (1501, 2999)]  # bf16 read in pairs; odd V; even V at an odd start


def _inputs() -> list[dict]:
    cases = [
        {"x": make_logits(kind, rows, vocab, dtype, k=k, seed=i), "k": k, "config": config}
        for i, (_, kind, rows, vocab, k, dtype, config) in enumerate(CASES)
    ]
    for split_rows in (0, 64):  # both selects, launched twice on one set of buffers (as graph replays are)
        tied = make_logits("tied", 3, 2000, torch.bfloat16, k=16, seed=7)
        cases.append({"x": tied, "then": make_logits("peaked", 3, 2000, torch.bfloat16, k=16, seed=8), "k": 16,
                      "config": {"split_rows": split_rows}})
    whole = make_logits("random", 4, 3000, torch.bfloat16, seed=99).view(2, 2, 3000)
    cases += [{"x": whole[..., lo:hi], "k": 9, "id_offset": lo} for lo, hi in SHARDS]
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[tuple]]:
    """(inputs, outputs) of every case, run once by the Triton interpreter in a subprocess."""
    if NO_TRITON:
        pytest.skip("triton is not installed (pip install -e '.[dev]' brings it on Linux)")
    tmp = tmp_path_factory.mktemp("topk_lse")
    inputs = _inputs()
    torch.save(inputs, tmp / "in.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "verify.kernel_cases", str(tmp / "in.pt"), str(tmp / "out.pt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return inputs, torch.load(tmp / "out.pt")


class TestInterpreted:
    @pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
    def test_matches_stable_sort(self, interpreted, index):
        """The kernels' top-K equals a stable descending sort (ties by id) and lse matches torch."""
        inputs, outputs = interpreted
        assert_exact(inputs[index]["x"], inputs[index]["k"], outputs[index])

    def test_second_launch_on_the_same_buffers_is_exact(self, interpreted):
        """Both selects (one launch per row; split) give the second input's exact top-K when launched
        again on the same buffers (a tied row first, so the split select's counters were used)."""
        inputs, outputs = interpreted
        reused = [(c, o) for c, o in zip(inputs, outputs, strict=True) if "then" in c]
        assert [c["config"]["split_rows"] for c, _ in reused] == [0, 64]
        for case, out in reused:
            assert_exact(case["then"], case["k"], out)

    def test_shards_carry_global_ids(self, interpreted):
        """Vocab-shard views with an id offset give the shard's exact top-K with global ids."""
        inputs, outputs = interpreted
        shards = [(c, o) for c, o in zip(inputs, outputs, strict=True) if "id_offset" in c]
        assert len(shards) == len(SHARDS)
        for case, out in shards:
            assert out[0].shape == (2, 2, 9) and out[2].shape == (2, 2)
            assert_exact(case["x"], 9, out, case["id_offset"])


def test_stream_reads_bf16_in_pairs_only_when_aligned():
    """The stream reads int32 words of two tokens only for bf16 rows of even length and stride
    that start 4-byte aligned; odd shards and other dtypes take the generic load."""
    whole = torch.zeros(4, 3000, dtype=torch.bfloat16)
    assert stream_pairs(whole) and stream_pairs(whole[:, 1100:1500])
    assert not stream_pairs(whole[:, 1100:1501])  # odd V
    assert not stream_pairs(whole[:, 1501:2999])  # even V, start 2 bytes past a word
    assert not stream_pairs(torch.zeros(4, 3001, dtype=torch.bfloat16)[:, :3000])  # odd row stride
    assert not stream_pairs(whole.half()) and not stream_pairs(whole.float())


class TestMakePlan:
    @pytest.mark.parametrize(
        ("rows", "vocab", "k"), [(15, 163840, 256), (960, 151936, 16), (3, 100, 7), (1, 4096, 1024)]
    )
    def test_splits_cover_the_row_once(self, rows, vocab, k):
        """Splits of whole tiles cover every token once; tiles hold whole groups."""
        p = make_plan(rows, vocab, k, TopKConfig())
        assert p.chunk % p.tile == 0 and p.tile % p.group == 0
        assert (p.splits - 1) * p.chunk < vocab <= p.splits * p.chunk
        assert p.groups * p.group >= vocab and p.cap >= 2 * p.k_pow2 >= 2 * k

    def test_one_batch_row_set_fills_the_gpu(self):
        """At bs 1 (15 rows of V 163840) the stream kernel still launches over 132 programs."""
        p = make_plan(15, 163840, 256, TopKConfig())
        assert p.rows * p.splits > 132

    @pytest.mark.parametrize(("rows", "tokens"), [(15, 2048), (120, 8192), (480, 4096)])
    def test_auto_gather_step(self, rows, tokens):
        """gather 0: 32 tokens per select thread a step in the one-launch select (bs 8: 8 warps,
        8192; bs 32: 4 warps, 4096), 2048 per program of the split select (bs 1, a row over more
        programs); an explicit size is kept."""
        p = make_plan(rows, 163840, 256, TopKConfig())
        assert p.gather_groups * p.group == tokens
        assert make_plan(rows, 163840, 256, TopKConfig(gather=1024)).gather_groups * p.group == 1024

    def test_select_splits_below_split_rows(self):
        """Below split_rows rows (bs 1: 15) the select runs as two launches; from there (bs 8: 120) as one."""
        assert make_plan(15, 163840, 256, TopKConfig()).split_select
        assert not make_plan(120, 163840, 256, TopKConfig()).split_select
        assert not make_plan(15, 163840, 256, TopKConfig(split_rows=0)).split_select

    def test_auto_select_warps_follow_the_row_count(self):
        """The default select kernel runs 8 warps up to SELECT_WIDE_ROWS rows and 4 from there
        (the H200 sweep's winners at bs 1/8 and 32/64); an explicit count is kept."""
        assert make_plan(120, 163840, 256, TopKConfig()).select_warps == 8
        assert make_plan(SELECT_WIDE_ROWS - 1, 163840, 256, TopKConfig()).select_warps == 8
        assert make_plan(SELECT_WIDE_ROWS, 163840, 256, TopKConfig()).select_warps == 4
        assert make_plan(15, 163840, 256, TopKConfig(select_warps=16)).select_warps == 16
        for warps in (3, 32):
            message = rf"TopKConfig.select_warps must be 0 \(auto\) or a power of two in \[1, 16\] \(got {warps}\)"
            with pytest.raises(ValueError, match=message):
                TopKConfig(select_warps=warps)

    def test_scan_tail_splits_a_padded_key_tile(self):
        """scan_tail (the default) holds M 5120 keys as 4096 + 1024 instead of 8192; a power-of-two
        M, or an M beyond scan_block (blocks loaded per count), keeps one head tile and no tail."""
        def tiles(vocab: int, **fields: int) -> tuple[int, int]:
            p = make_plan(480, vocab, 256, TopKConfig(**fields))
            return p.scan_block, p.scan_tail

        assert tiles(163840, scan_tail=False) == (8192, 0)
        assert tiles(163840) == (4096, 1024)
        assert tiles(131072) == (4096, 0)
        assert tiles(163840, scan_block=4096) == (4096, 0)

    def test_super_keys_leave_at_least_two_and_a_half_k_of_them(self):
        """Super keys shrink until the row has >= 2.5 K of them and they tile the head and tail."""
        def supers(rows: int, vocab: int, k: int, **fields: int) -> int:
            return make_plan(rows, vocab, k, TopKConfig(**fields)).super_keys

        assert supers(480, 163840, 256) == 8  # M 5120: 640 super keys
        assert supers(480, 163840, 512) == 4  # 1280 >= 1280
        assert supers(480, 163840, 1024) == 2
        assert supers(480, 163840, 256, super_keys=1) == 1
        assert supers(15, 1040, 16, group=4, scan_tail=True) == 4  # M 260 = 256 + a tail of 4
        assert supers(15, 4096, 256) == 1  # M 1024 < 5 K / 2 * 2

    def test_groups_shrink_when_vocab_is_small_against_k(self):
        """At V 4096 and k 1024 every token is its own group, so the key threshold stays tight."""
        assert make_plan(4, 4096, 1024, TopKConfig()).group == 1
        assert make_plan(4, 163840, 256, TopKConfig()).group == 32


class TestArguments:
    def test_k_above_vocab_is_an_error(self):
        """k must not exceed V."""
        with pytest.raises(ValueError, match=r"k must be an int in \[1, min\(V, 1024\)\] with V=10 \(got 11\)"):
            topk_lse(torch.zeros(2, 10), 11)

    def test_k_above_max_is_an_error(self):
        """k above MAX_K is refused even when V is larger."""
        with pytest.raises(ValueError, match=f"got {MAX_K + 1}"):
            topk_lse(torch.zeros(1, 4096), MAX_K + 1)

    def test_integer_logits_are_an_error(self):
        """Only bf16, fp16 and fp32 logits are accepted."""
        with pytest.raises(ValueError, match=r"x\.dtype must be bfloat16, float16 or float32 \(got torch\.int64"):
            topk_lse(torch.zeros(2, 10, dtype=torch.int64), 1)

    def test_negative_offset_is_an_error(self):
        """id_offset must be >= 0."""
        with pytest.raises(ValueError, match=r"id_offset must be an int >= 0 \(got -1\)"):
            topk_lse(torch.zeros(2, 10), 1, id_offset=-1)

    def test_bad_config_is_an_error(self):
        """A field that sizes a tile or sort and is not a power of two, a register cap out of range
        or no pipeline stage is refused when the config is built."""
        with pytest.raises(ValueError, match=r"TopKConfig.tile must be a power of two \(got 3000\)"):
            TopKConfig(tile=3000)
        with pytest.raises(ValueError, match=r"TopKConfig.search_pivots must be a power of two \(got 3\)"):
            TopKConfig(search_pivots=3)
        with pytest.raises(ValueError, match=r"TopKConfig.select_maxnreg must be 0 or in \[32, 255\] \(got 16\)"):
            TopKConfig(select_maxnreg=16)
        with pytest.raises(ValueError, match=r"TopKConfig.cap_mult must be a power of two \(got 3\)"):
            TopKConfig(cap_mult=3)
        with pytest.raises(ValueError, match=r"TopKConfig.group must be 0 \(auto\) or a power of two \(got 24\)"):
            TopKConfig(group=24)
        with pytest.raises(ValueError, match=r"TopKConfig.stream_stages must be >= 1 \(got 0\)"):
            TopKConfig(stream_stages=0)

    @pytest.mark.skipif(NO_TRITON, reason="triton is not installed")
    def test_cpu_tensor_without_interpreter_is_an_error(self):
        """Outside the interpreter a CPU tensor is refused with a one-line error."""
        if os.environ.get("TRITON_INTERPRET") == "1":
            pytest.skip("this process runs the Triton interpreter")
        with pytest.raises(ValueError, match="x must be a CUDA tensor"):
            topk_lse(torch.zeros(2, 10), 1)
