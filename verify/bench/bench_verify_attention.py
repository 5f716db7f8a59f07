"""Benchmark repro's split-KV verify attention against SGLang's extend kernel; write JSON.

    python -m verify.bench.bench_verify_attention --out results/bench_verify_attention.json

One layer of Qwen3-8B's attention (32 query / 8 KV heads, head dim 128, bf16) per row: ``--bs``
requests of ``--prefix`` cached tokens each verify the draft tokens of a ``--verify`` shape, as a
tree (a random tree mask in SGLang's full-mask layout) or a causal chain (DFLASH's verify:
``16-chain``). Both kernels are timed as CUDA-graph replays (``triton.testing.do_bench_cudagraph``,
the served round replays graphs), on the same inputs, after a check that they agree (bf16); each
row records the tiling repro chose and whether ``faster`` routes it here. A table prints as
well; SGLang's kernel is skipped with a note where SGLang is not importable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from pathlib import Path

import torch

from verify.attention_cases import make_case, run, sglang_extend

QWEN3 = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": torch.bfloat16, "device": "cuda"}
VERIFIES = {"16-chain": (16, False), "16-tree": (16, True), "17-tree": (17, True), "32-tree": (32, True),
            "64-tree": (64, True), "128-tree": (128, True), "256-tree": (256, True), "512-tree": (512, True),
            "513-tree": (513, True)}  # B 512's verify: the root and 512 nodes


def measure(bs: int, prefix: int, verify: str) -> dict:
    """Both kernels' µs a call on one shape (SGLang's None where it is not importable)."""
    import triton.testing

    from repro.kernels.verify_attention import faster, tiling

    q_len, tree = VERIFIES[verify]
    case = make_case([prefix] * bs, q_len, tree=tree, seed=bs + prefix + q_len, **QWEN3)
    ours = run(case)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    heads = {"q_heads": QWEN3["q_heads"], "kv_heads": QWEN3["kv_heads"]}
    row = {"bs": bs, "prefix": prefix, "verify": verify, "q_len": q_len, "tree": tree,
           "tiling": tiling(bs, q_len, heads["q_heads"] // heads["kv_heads"], heads["kv_heads"], sms)._asdict(),
           "served": faster(q_len, **heads),
           "repro_us": 1e3 * triton.testing.do_bench_cudagraph(lambda: run(case), rep=50), "sglang_us": None}
    theirs = torch.empty_like(ours)
    call = sglang_extend(case, theirs)
    if call is not None:
        call()
        row["max_abs_diff"] = (ours.float() - theirs.float()).abs().max().item()
        row["sglang_us"] = 1e3 * triton.testing.do_bench_cudagraph(call, rep=50)
    return row


def main(argv: list[str] | None = None) -> int:
    """Time every (bs, prefix, verify) and write the rows as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--prefix", type=int, nargs="+", default=[300, 1000, 2000])
    p.add_argument("--verify", nargs="+", default=["16-chain", "17-tree", "64-tree", "128-tree"],
                   choices=list(VERIFIES), help="draft tokens a request, and tree or chain")
    p.add_argument("--out", type=Path, default=Path("results/bench_verify_attention.json"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_verify_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    print("| bs | prefix | verify | repro µs | SGLang µs | SGLang / repro |\n|---|---|---|---|---|---|")
    for bs, prefix, verify in itertools.product(args.bs, args.prefix, args.verify):
        row = measure(bs, prefix, verify)
        rows.append(row)
        theirs = row["sglang_us"]
        print(f"| {bs} | {prefix} | {verify} | {row['repro_us']:.1f} | "
              + (f"{theirs:.1f} | {theirs / row['repro_us']:.2f}x |" if theirs else "- | - |"), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.datetime.now(dt.UTC).date().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "shape": "Qwen3-8B attention: 32 q / 8 kv heads, head dim 128, bf16"}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
