"""Triton kernels behind :func:`repro.kernels.topk_lse.topk_lse` (imported lazily: needs triton).

Two stages, one pass over the logits:

1. ``stream_kernel`` (``_topk_stream_triton``; grid rows x splits) reads each row once: a 16-bit
   order key per group of ``G`` tokens, and per split the (max, sum of exp) of the logsumexp.
2. ``select_kernel`` (grid rows) merges the lse partials, finds the threshold ``tb`` that at
   least ``K`` groups reach and lists those groups (``_topk_threshold_triton``), then gathers
   their tokens that reach ``tb`` and sorts those few candidates exactly
   (``_topk_gather_triton``). It is launched dependent on the stream (programmatic dependent
   launch: its programs start while the stream drains and wait for its results).
   Below ``TopKConfig.split_rows`` rows the select runs as two launches instead:
   ``threshold_kernel`` (grid rows: lse, threshold, group list) and ``gather_kernel`` (grid rows x
   list slices: each program gathers one slice's candidates, the last of a row's programs sorts).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from repro.kernels._common_triton import OTHER_PROGRAMS, PDL, SAME_PROGRAM
from repro.kernels._topk_gather_triton import compact_candidates, gather_step, load_groups, top_candidates
from repro.kernels._topk_threshold_triton import compact_groups, lse_and_threshold


@triton.jit(do_not_specialize=["S"])
def select_kernel(
    x_ptr, stride_row, V, M, S, K, id_offset,
    group_key_ptr, lse_part_ptr, group_list_ptr, cand_key_ptr, val_ptr, id_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, G: tl.constexpr, GT: tl.constexpr,
    K_P: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr, SP: tl.constexpr, R: tl.constexpr,
    SC: tl.constexpr, PAIRS: tl.constexpr, KEY32: tl.constexpr,
):
    """Per row: logsumexp, then the exact top-K (value desc, id asc) from the few candidates.
    ``PAIRS``: bf16 rows read as int32 words (see ``stream_kernel``); ``KEY32``: int32 candidate
    keys (``_topk_gather_triton._cand_key``)."""
    if PDL:
        gdc_wait()  # launched dependent on stream_kernel: its keys and partials are visible after this
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_row
    gk_row = group_key_ptr + r * M
    tb, u0, u1 = lse_and_threshold(gk_row, lse_part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, P, SP)
    gidx_row = group_list_ptr + r * CAP
    cand_row = cand_key_ptr + r * CAP
    nsel = compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB, MT, CAP)
    ncand = nsel + CAP  # > CAP: "overflow" unless the candidates are gathered below
    if nsel <= CAP:
        tl.debug_barrier()  # the group list was written by other threads of this program
        ncand = compact_candidates(row, V, tb, gidx_row, nsel, cand_row, G, GT, CAP, PAIRS, KEY32)
    tl.debug_barrier()  # the candidate keys too
    val, ids = top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, SAME_PROGRAM, G, K_P, CAP,
                              SC, KEY32)
    o = tl.arange(0, K_P)
    tl.store(val_ptr + r * K + o, val, mask=o < K)
    tl.store(id_ptr + r * K + o, ids, mask=o < K)


@triton.jit(do_not_specialize=["S"])
def threshold_kernel(
    M, S, K, group_key_ptr, lse_part_ptr, group_list_ptr, state_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr,
    SP: tl.constexpr,
):
    """Per row, the first half of the select: logsumexp, the threshold ``tb`` and the list of the
    groups that reach it; ``state_ptr[r]`` = (tb, groups listed, 0, 0) for ``gather_kernel``."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    r = tl.program_id(0).to(tl.int64)
    gk_row = group_key_ptr + r * M
    tb, u0, u1 = lse_and_threshold(gk_row, lse_part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, P, SP)
    nsel = compact_groups(gk_row, group_list_ptr + r * CAP, M, tb, u0, u1, MB, MT, CAP)
    o = tl.arange(0, 4)
    tl.store(state_ptr + r * 4 + o, tl.where(o == 0, tb, tl.where(o == 1, nsel, 0)))


@triton.jit
def gather_kernel(
    x_ptr, stride_row, V, K, id_offset, group_list_ptr, state_ptr, cand_key_ptr, val_ptr, id_ptr,
    G: tl.constexpr, GT: tl.constexpr, K_P: tl.constexpr, CAP: tl.constexpr, SC: tl.constexpr,
    PAIRS: tl.constexpr, KEY32: tl.constexpr,
):
    """Per (row, slice of ``GT`` listed groups), the second half: the tokens of these groups that
    reach ``tb`` go to the row's candidate buffer (:func:`gather_step`: each group's maximum to
    its list slot, the few others after the list, slots reserved with one atomic per round; their
    order does not matter, they are sorted), then the last of the row's programs to finish sorts
    the candidates (or, past ``CAP`` of them, takes the slow path) and writes the top K.

    Spreading a row's gather over programs shortens the select's critical path: one step of GT
    groups instead of a loop over every listed group. Ordering as in a split-K semaphore: a
    barrier, then one gpu-scope acq_rel atomic per program; the last reads the buffer from L2.
    """
    if PDL:
        gdc_wait()  # launched dependent on threshold_kernel
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = x_ptr + r * stride_row
    st = state_ptr + r * 4
    tb = tl.load(st)
    nsel = tl.load(st + 1)
    gidx_row = group_list_ptr + r * CAP
    cand_row = cand_key_ptr + r * CAP
    if (nsel <= CAP) & (p * GT < nsel):
        j = p * GT + tl.arange(0, GT)
        grp, xa, xb = load_groups(row, V, gidx_row, j, nsel, G, PAIRS, OTHER_PROGRAMS)
        gather_step(grp, xa, xb, tb, j, nsel, cand_row, nsel, st + 2, G, CAP, PAIRS, KEY32)
    tl.debug_barrier()
    if tl.atomic_add(st + 3, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        tl.debug_barrier()
        ncand = tl.where(nsel <= CAP, nsel + tl.load(st + 2, cache_modifier=OTHER_PROGRAMS), CAP + 1)
        val, ids = top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, OTHER_PROGRAMS, G, K_P, CAP,
                                  SC, KEY32)
        o = tl.arange(0, K_P)
        tl.store(val_ptr + r * K + o, val, mask=o < K)
        tl.store(id_ptr + r * K + o, ids, mask=o < K)
