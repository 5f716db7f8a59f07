"""The round's small Triton kernels compile for sm_90 ahead of time, on any machine.

Triton's interpreter (the CPU tests of these kernels) runs the Python body and accepts code the
compiler refuses (for instance a name bound to a pointer of one type in one branch and another
type in the next): this compiles each kernel's real launch variants to a cubin, as a GPU's first
launch would, so such code fails in CI instead of on the GPU machine.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from verify.bench.kernel_size import _compile, _compiled

I64, I32, F32 = "*i64", "*i32", "*fp32"


@pytest.mark.parametrize(("rows", "top1"), [(1, 1), (1, 0), (0, 1)])
@pytest.mark.parametrize("out", ["*bf16", "*fp16", F32])
def test_hook_rows_kernel(rows: int, top1: int, out: str) -> None:
    """The test hook's rows kernel: rows and argmax together, rows alone, argmax alone."""
    from repro.drafter_hook._rows_triton import rows_kernel

    pointers = {"roots": I64, "prefix": I32, "powers": I32, "logits_tab": F32, "rank_thr": F32,
                "level_thr": F32, "out": out, "top1": I64}
    constants = {"L": 15, "KP": 4, "RP": 4, "BLOCK": 4096, "ROWS": rows, "TOP1": top1}
    assert _compile(rows_kernel, constants, {}, 4, 90, pointers=pointers)


@pytest.mark.parametrize("has_table", [1, 0])
def test_accept_kernel(has_table: int) -> None:
    """Walk + commit, with and without a slot table (N 33, W 16: budget 32, block 16)."""
    from repro.kernels._accept_triton import accept_kernel

    pointers = {"tokens_ptr": I64, "parents_ptr": I64, "target_ptr": I64, "prefix_ptr": I64, "table_ptr": I32,
                "table_rows_ptr": I64, "index_out": I64, "len_out": I32, "bonus_out": I64, "emit_out": I64,
                "rows_out": I64, "pos_out": I64, "seq_out": I64, "slots_out": I64}
    constants = {"N": 33, "NP": 64, "W": 16, "WP": 16, "HAS_TABLE": has_table}
    assert _compile(accept_kernel, constants, {}, 4, 90, pointers=pointers)


def test_tree_inputs_kernel() -> None:
    """Ids, positions and ancestor blocks into the FULL mask (N 33)."""
    from repro.kernels._tree_inputs_triton import tree_inputs_kernel

    pointers = {"tokens_ptr": I64, "parents_ptr": I64, "depths_ptr": I64, "lens_ptr": I64, "ids_out": I64,
                "pos_out": I64, "mask_out": "*u8"}
    constants = {"N": 33, "NP": 64, "RB": 16, "CHUNK": 64}
    assert _compile(tree_inputs_kernel, constants, {}, 4, 90, pointers=pointers)


@pytest.mark.parametrize("offs32", [1, 0])
@pytest.mark.parametrize("use_mask", [1, 0])
@pytest.mark.parametrize(("qo", "kv"), [(I32, I32), (I64, I32), (I32, I64)])
def test_verify_attention_kernels(offs32: int, use_mask: int, qo: str, kv: str) -> None:
    """Split-KV verify attention, tree (mask) and chain, with SGLang's index pointers of either
    width (the loops' bounds must be one type), pool offsets of either width, and the merge."""
    from repro.kernels._verify_attention_triton import combine_kernel, split_kernel

    bf16 = "*bf16"
    pointers = {"Q": bf16, "K_ext": bf16, "V_ext": bf16, "K_buf": bf16, "V_buf": bf16, "qo_indptr": qo,
                "kv_indptr": kv, "kv_indices": I64, "Mask": "*i1", "mask_indptr": I64, "O_part": F32,
                "L_part": F32, "qk_scale": "fp32"}
    constants = {"G": 4, "NSPLIT": 8, "D": 128, "DV": 128, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_T": 16,
                 "USE_MASK": use_mask, "OFFS32": offs32}
    assert _compile(split_kernel, constants, {}, 4, 90, pointers=pointers)
    merge = {"O_part": F32, "L_part": F32, "Out": bf16}
    assert _compile(combine_kernel, {"PARTS": 9, "PARTS_P2": 16, "DV": 128}, {}, 1, 90, pointers=merge)


@pytest.mark.parametrize("use_mask", [1, 0])
def test_verify_attention_wide_tiles(use_mask: int) -> None:
    """The wide tiling (128 query rows, 8 warps, 64-key blocks of the tree's own keys) fits sm_90's
    registers and shared memory, tree and chain."""
    from repro.kernels._verify_attention_triton import split_kernel
    from repro.kernels.verify_attention import WIDE_BLOCK_M, WIDE_WARPS

    bf16 = "*bf16"
    pointers = {"Q": bf16, "K_ext": bf16, "V_ext": bf16, "K_buf": bf16, "V_buf": bf16, "qo_indptr": I32,
                "kv_indptr": I32, "kv_indices": I64, "Mask": "*i1", "mask_indptr": I64, "O_part": F32,
                "L_part": F32, "qk_scale": "fp32"}
    constants = {"G": 4, "NSPLIT": 2, "D": 128, "DV": 128, "BLOCK_M": WIDE_BLOCK_M, "BLOCK_N": 64, "BLOCK_T": 64,
                 "USE_MASK": use_mask, "OFFS32": 1}
    assert _compile(split_kernel, constants, {}, WIDE_WARPS, 90, pointers=pointers)


@pytest.mark.parametrize(("arch", "head_dim", "q_len", "dtype"), [
    (90, 128, 16, "bf16"), (90, 128, 32, "bf16"), (90, 128, 64, "bf16"), (90, 256, 64, "bf16"), (90, 64, 64, "fp32"),
    (100, 128, 64, "bf16"), (120, 128, 64, "bf16"), (120, 256, 16, "bf16"), (80, 128, 64, "bf16")])
def test_verify_attention_shared_bytes_bound_the_compiled_kernel(arch: int, head_dim: int, q_len: int, dtype: str):
    """``shared_bytes`` (what ``supports`` checks against the GPU's limit) is at least what Triton
    allocates for the tiling of a q_len-token tree, specialised as served (aligned pointers, strides
    of 16), with the stages the architecture pipelines."""
    from repro.kernels._verify_attention_triton import split_kernel
    from repro.kernels.verify_attention import BLOCK_N, NUM_STAGES, block_t, shared_bytes, tiling

    elem = {"bf16": 2, "fp32": 4}[dtype]
    tile = tiling(1, q_len, 4, 8, 132)
    data = f"*{dtype}"
    pointers = {"Q": data, "K_ext": data, "V_ext": data, "K_buf": data, "V_buf": data, "qo_indptr": I32,
                "kv_indptr": I32, "kv_indices": I64, "Mask": "*i1", "mask_indptr": I64, "O_part": F32,
                "L_part": F32, "qk_scale": "fp32"}
    strides = dict.fromkeys(("stride_qt", "stride_kt", "stride_vt", "stride_bkt", "stride_bvt", "stride_pt"), 16 * head_dim)
    strides |= dict.fromkeys(("stride_qh", "stride_kh", "stride_vh", "stride_bkh", "stride_bvh", "stride_ps"), head_dim)
    constants = {"G": 4, "NSPLIT": tile.nsplit, "D": head_dim, "DV": head_dim, "BLOCK_M": tile.block_m,
                 "BLOCK_N": BLOCK_N, "BLOCK_T": block_t(q_len), "USE_MASK": 1, "OFFS32": 1}
    kernel = _compiled(split_kernel, constants, strides, tile.num_warps, arch, pointers=pointers,
                       num_stages=NUM_STAGES, align_pointers=True)
    stages = NUM_STAGES if arch in (90, 100) else 1
    assert kernel.metadata.shared <= shared_bytes(tile.block_m, q_len, head_dim, head_dim, elem, stages)
