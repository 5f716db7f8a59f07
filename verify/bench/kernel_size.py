"""Static size of the fused DDTree kernels for a GPU architecture, on any machine (no GPU needed).

    python -m verify.bench.kernel_size --k 256 --vocab 163840 --set search_pivots=1 --set select_warps=4
    python -m verify.bench.kernel_size --tree --budget 256 --warps 16

Compiles the top-K ``stream_kernel`` and ``select_kernel`` (with the launch constants
``repro.kernels.topk_lse.make_plan`` picks), or with ``--tree`` the two tree kernels and the
verify kernel (constants from ``repro.kernels.tree_build``), ahead of time for ``--arch`` (default
sm_90), then reads the cubin with the ``cuobjdump`` that ships in the triton wheel: registers per thread,
stack (spill slots), local and shared bytes, the SASS instruction count, the instructions of each
loop body, and a digest of the SASS (equal digests: the same machine code). Nsight Compute showed
the select kernel stalled on instruction fetch (docs/PERFORMANCE.md), so code size and spills are
leads worth reading before a GPU run; they are not timings.

Moving kernel code into ``@triton.jit`` helpers keeps the digest only if Triton's IR stays the
same: a name reassigned inside a loop is carried around it even when unused, and the layouts
follow such values; and ptxas schedules some kernels differently around the debug-range labels
of inlined helpers (the same PTX instructions, other SASS). When a digest moves, compare the two
compiles' TTIR (locations stripped) first.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path

POINTER_TYPES = {
    "x_ptr": "*bf16", "group_key_ptr": "*i16", "lse_part_ptr": "*fp32", "group_list_ptr": "*i32", "cand_key_ptr": "*i64",
    "val_ptr": "*fp32", "id_ptr": "*i64", "lse_ptr": "*fp32", "state_ptr": "*i32",
    "logits_ptr": "*fp32", "ids_ptr": "*i64", "roots_ptr": "*i64", "pair_slot_ptr": "*i32", "pair_rank_ptr": "*i32",
    "front_logit_sum_ptr": "*fp64", "front_score_ptr": "*fp64", "front_lex_ptr": "*i64", "front_bits_ptr": "*i64",
    "front_prod_ptr": "*i64", "front_rank_ptr": "*i32", "front_slot_ptr": "*i32", "tree_slot_ptr": "*i32",
    "tokens_ptr": "*i64", "parents_ptr": "*i64", "depths_ptr": "*i64", "scores_ptr": "*fp64", "nodes_ptr": "*i64",
    "compact_score_ptr": "*fp64", "compact_lex_ptr": "*i64", "compact_pair_ptr": "*i32", "handoff_ptr": "*i32",
    "node_logit_sum_ptr": "*fp64", "node_score_ptr": "*fp64", "node_lex_ptr": "*i64", "node_bits_ptr": "*i32",
    "node_prod_ptr": "*i32", "node_rank_ptr": "*i32", "node_parent_ptr": "*i32", "node_depth_ptr": "*i32",
    "child_offset_ptr": "*i32", "finalist_ptr": "*i32", "score_hist_ptr": "*i32",
    "lens_ptr": "*i64", "ids_out": "*i64", "pos_out": "*i64", "anc_out": "*i1", "full_out": "*i1",
    "index_out": "*i64", "first_out": "*i64", "sibling_out": "*i64",
}
"""Pointer arguments of the kernels by name (bf16 drafter logits); other arguments are i32."""


def _compile(fn, constants: dict[str, int], values: dict[str, int], num_warps: int, arch: int, maxnreg: int = 0,
             pointers: dict[str, str] | None = None) -> bytes:
    """The cubin of ``_compiled``'s kernel."""
    return _compiled(fn, constants, values, num_warps, arch, maxnreg, pointers).asm["cubin"]


def _compiled(fn, constants: dict[str, int], values: dict[str, int], num_warps: int, arch: int, maxnreg: int = 0,
              pointers: dict[str, str] | None = None, num_stages: int | None = None, *, align_pointers: bool = False):
    """Triton function ``fn`` compiled for sm_``arch``, specialised as the JIT would be at run
    time: ``constants`` as constexprs, pointers 16-byte aligned (typed as ``POINTER_TYPES``, then
    ``pointers``; those of ``pointers`` aligned too with ``align_pointers``), and each int of
    ``values`` that is a multiple of 16 marked so (unless the kernel opts out with
    ``do_not_specialize``); ``maxnreg`` caps registers per thread (0: no cap)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = [p.name for p in fn.params]
    types = {**POINTER_TYPES, **(pointers or {})}
    signature = {n: "constexpr" if n in constants else types.get(n, "i64" if n == "id_offset" else "i32")
                 for n in names}
    extra = {n for n, t in (pointers or {}).items() if t.startswith("*")} if align_pointers else set()
    aligned = [n for n in names if n in POINTER_TYPES or n in extra or (
        n in values and values[n] % 16 == 0 and not fn.params[names.index(n)].do_not_specialize)]
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(names.index(n),): v for n, v in constants.items()},
                       attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {}),
               **({"num_stages": num_stages} if num_stages else {})}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def _cuobjdump() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


Size = dict[str, int | str | list[int]]
"""What :func:`cubin_size` reports of one kernel."""


def cubin_size(cubin: bytes) -> Size:
    """Registers, stack, local and shared bytes, SASS instruction count, 16-byte global stores
    (``wide_stores``: the verify kernel's fills must stay vectorised), the instruction count of
    each loop body (``loops``: from a backward branch's target to the branch, in address order;
    a steady-state loop's cost per step) and a digest of the SASS text (``sass_sha256``: equal
    digests, the same machine code; a refactor that should not change the code can be checked
    without a GPU) of one cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    out: Size = {
        key.lower(): int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    code = [(int(m[1], 16), m[2]) for m in (re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
                                             for line in sass.splitlines()) if m]
    out["instructions"] = len(code)
    out["wide_stores"] = sass.count("STG.E.128")
    out["loops"] = [sum(1 for a, _ in code if target <= a <= at)
                    for at, text in code
                    for target in [int(t, 16) for t in re.findall(r"\bBRA\s+(?:\S+\s+)?(0x[0-9a-f]+)", text)]
                    if target < at]
    out["sass_sha256"] = hashlib.sha256("\n".join(f"{a:x} {t}" for a, t in code).encode()).hexdigest()
    return out


def topk_kernel_sizes(rows: int, vocab: int, k: int, config, arch: int = 90) -> dict[str, Size]:
    """``cubin_size`` of the stream and select kernels as ``topk_lse`` would launch them."""
    import torch

    from repro.kernels._topk_select_triton import gather_kernel, select_kernel, threshold_kernel
    from repro.kernels._topk_stream_triton import stream_kernel
    from repro.kernels.topk_lse import GATHER_CONSTANTS, THRESHOLD_CONSTANTS, make_plan, select_constants, stream_pairs

    p = make_plan(rows, vocab, k, config)
    values = {"stride_row": vocab, "V": vocab, "M": p.groups, "chunk": p.chunk, "S": p.splits, "K": k, "id_offset": 0}
    pairs = stream_pairs(torch.empty((1, vocab), dtype=torch.bfloat16, device="meta"), p.group)  # bf16 rows
    select = select_constants(p, pairs=pairs)
    cand = {"cand_key_ptr": "*i32" if select["KEY32"] else "*i64"}
    stream = _compile(stream_kernel, {"TG": p.tile // p.group, "G": p.group, "STAGES": config.stream_stages,
                                      "PAIRS": pairs}, values, p.stream_warps, arch)
    if p.split_select:
        thresh = _compile(threshold_kernel, {k: select[k] for k in THRESHOLD_CONSTANTS},
                          values, p.select_warps, arch)
        gather = _compile(gather_kernel, {k: select[k] for k in GATHER_CONSTANTS},
                          values, p.select_warps, arch, p.select_maxnreg, cand)
        return {"stream_kernel": cubin_size(stream), "threshold_kernel": cubin_size(thresh),
                "gather_kernel": cubin_size(gather)}
    return {"stream_kernel": cubin_size(stream),
            "select_kernel": cubin_size(_compile(select_kernel, select, values, p.select_warps, arch,
                                                 p.select_maxnreg, cand))}


def tree_kernel_size(budget: int, horizon: int = 15, num_warps: int = 8, arch: int = 90) -> dict[str, Size]:
    """``cubin_size`` of the enumeration and frontier tree kernels as ``build_trees_fused`` would
    launch them (K = B <= V), and of the verify kernel as ``verify_tensors_fused`` launches it
    (its own default warps, bs 32)."""
    from repro.kernels._tree_enum_triton import enum_kernel
    from repro.kernels._tree_frontier_triton import tree_kernel
    from repro.kernels._verify_tensors_triton import verify_kernel
    from repro.kernels.tree_build import enum_kernel_constants, tree_kernel_constants, verify_kernel_constants

    values = {"KT": budget, "L": horizon, "KB": budget, "D": min(horizon, budget), "B": budget}
    return {
        "enum_kernel": cubin_size(_compile(enum_kernel, enum_kernel_constants(budget), values, num_warps, arch)),
        "tree_kernel": cubin_size(_compile(tree_kernel, tree_kernel_constants(budget, horizon), values, num_warps, arch)),
        "verify_kernel": cubin_size(_compile(verify_kernel, verify_kernel_constants(32, budget, 4),
                                             {"D": min(horizon, budget), "pad_token": 0}, 4, arch)),
    }


def _setting(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    if not value.strip().lstrip("-").isdigit():
        msg = f"--set takes NAME=INT (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return name.strip(), int(value)


def main(argv: list[str] | None = None) -> int:
    """Print the kernel sizes for one shape and TopKConfig (or tree budget and warps) as JSON."""
    from repro.kernels.topk_lse import TopKConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=480, help="drafter rows (bs * 15); default 480 = bs 32")
    p.add_argument("--vocab", type=int, default=163840)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--arch", type=int, default=90, help="compute capability as an int (90, 100, 120)")
    p.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=INT",
                   help="a TopKConfig field (e.g. search_pivots=1); repeatable")
    p.add_argument("--tree", action="store_true", help="the tree kernel instead of the top-K kernels")
    p.add_argument("--budget", type=int, default=256, help="with --tree: B in [1, 256]")
    p.add_argument("--warps", type=int, default=8, choices=(1, 2, 4, 8, 16, 32), help="with --tree: num_warps")
    args = p.parse_args(argv)
    if args.tree:
        if not 1 <= args.budget <= 256:
            p.error(f"--budget must be in [1, 256] (got {args.budget})")
        sizes = tree_kernel_size(args.budget, num_warps=args.warps, arch=args.arch)
        print(json.dumps({"arch": f"sm_{args.arch}", "budget": args.budget, "num_warps": args.warps, **sizes},
                         indent=1))
        return 0
    fields = {f.name for f in dataclasses.fields(TopKConfig)}
    unknown = [name for name, _ in args.set if name not in fields]
    if unknown:
        p.error(f"--set NAME must be a TopKConfig field ({', '.join(sorted(fields))}); got {unknown[0]!r}")
    try:
        config = TopKConfig(**dict(args.set))
    except (TypeError, ValueError) as exc:
        p.error(str(exc))
    sizes = topk_kernel_sizes(args.rows, args.vocab, args.k, config, args.arch)
    print(json.dumps({"arch": f"sm_{args.arch}", "rows": args.rows, "vocab": args.vocab, "k": args.k,
                      "config": dataclasses.asdict(config), **sizes}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
