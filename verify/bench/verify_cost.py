"""Time a planted target's forward over N tokens per request (the verify width): JSON + PNG.

    python -m verify.bench.verify_cost MODELS/k26-tp8 --bs 1 4 --out results/verify_cost_k26.json
    python -m verify.bench.verify_cost --replot results/verify_cost_k26.json     # figure only, no GPU

On the GPU machine, with the patched SGLang importable: the target directory (written by
``repro testmodels``) is loaded through SGLang's own model runner with dummy weights
and planted (``SGLANG_REPRO_PLANT``, patch 0005), exactly as a server loads it. For each batch
size and each N it runs a forward of ``bs`` fresh requests of N random tokens (an EXTEND), or
with ``--tree-tokens`` of the N = B + 1 tokens of the tree the target's test hook drafts in a
``humaneval-distinct`` prompt's first round (request i's, each ending on its own token, so a
batch's trees grow from distinct roots, as `repro bench` serves them): on an MoE target random
tokens are an upper bound for a tree's, whose tokens repeat and, routed by token, read fewer
experts (``repro testmodels --spread NAME``).
It records the wall
time (median of ``--reps``, eager launches) and the GPU busy time (the union of the kernels'
intervals under torch.profiler), which is what a CUDA-graph replay of a verify costs. A DDTREE
verify of budget B is N = B + 1; it differs in attending to the request's prefix too (a few
percent of the weights' bytes at 4k context) and in computing logits for all N rows, which the
last-row head of an EXTEND does not. Beside the JSON, ``repro.handoff.plots.verify_cost_vs_tokens``
draws the cost against N.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from repro.evidence.prompts import DISTINCT
from repro.testmodels.configs import FULLSIZE

TOKENS = (1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513)
TREE_PROMPT_SET, TREE_PROMPTS = DISTINCT, 164  # the trees' prompts, and how many it has


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (kernels on several streams overlap)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def load_runner(model_dir: Path, mem_fraction: float, *, plant: bool = True):
    """SGLang's benchmark model runner for ``model_dir`` (dummy weights, planted at load unless
    ``plant`` is False) and its synthetic-input builder."""
    if plant:
        os.environ["SGLANG_REPRO_PLANT"] = str(model_dir / "planted.json")
    from sglang.benchmark import one_batch
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(model_path=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
                             attention_backend="triton", sampling_backend="pytorch", grammar_backend="none",
                             mem_fraction_static=mem_fraction, disable_cuda_graph=True, disable_radix_cache=True,
                             context_length=4096, page_size=1, max_running_requests=16)
    _set_envs_and_config(server_args)
    initialize_moe_config(server_args)
    initialize_fp8_gemm_config(server_args)
    one_batch.get_tokenizer = lambda *_args, **_kwargs: None  # the planted targets have no tokenizer
    runner, _ = one_batch.load_model(server_args, PortArgs.init_new(server_args), 0, 0)
    return runner, one_batch.prepare_synthetic_inputs_for_latency_test


def tree_inputs(model_dir: Path, bs: int, counts: list[int]) -> dict[int, list[list[int]]]:
    """For each N: ``bs`` requests' N = B + 1 token ids, the trees of budget B that the full-size
    target ``model_dir.name``'s test hook drafts for the first ``bs`` TREE_PROMPT_SET prompts' first round."""
    from repro.testmodels import fullsize

    model = fullsize.load_model(model_dir.name)
    trees = fullsize.tree_tokens(model, [n - 1 for n in counts], fullsize.prompt_ids(model, bs, TREE_PROMPT_SET))
    return {n: trees[n - 1].tolist() for n in counts}


def _time_forward(runner, make_reqs, bs: int, n: int, reps: int, inputs: list[list[int]] | None = None) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    walls = []
    for rep in range(reps + 1):  # the first run warms up (kernel compiles, allocator)
        runner.clear()
        reqs = make_reqs(bs, n, inputs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.extend(reqs)
        torch.cuda.synchronize()
        if rep:
            walls.append(time.perf_counter() - t0)
    runner.clear()
    reqs = make_reqs(bs, n, inputs)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.extend(reqs)
        torch.cuda.synchronize()
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"bs": bs, "n": n, "wall_ms": statistics.median(walls) * 1e3, "gpu_busy_ms": busy_time(kernels) / 1e3,
            "kernels": len(kernels)}


def _draw(result: dict, path: Path) -> None:
    from repro.handoff import plots

    why_not = plots.verify_cost_vs_tokens(result["rows"], path, title=result.get("model", ""))
    print(f"figure not drawn: {why_not}" if why_not else f"wrote {path}")


def _replot(path: Path) -> int:
    """Draw the figure of a saved verify_cost JSON beside it; 2 on a file that is not one."""
    try:
        result = json.loads(path.read_text())
        rows = result["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"verify_cost: --replot needs a verify_cost JSON with 'rows' ({path}: {type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    if not isinstance(rows, list):
        print(f"verify_cost: --replot needs 'rows' to be a list in {path} (got {type(rows).__name__})", file=sys.stderr)
        return 2
    _draw(result, path.with_suffix(".png"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Time every (bs, N) on the GPU and write JSON + PNG, or only redraw a saved result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path, nargs="?", help="a planted target directory (config.json, planted.json)")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 4])
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="N values (tokens per request)")
    p.add_argument("--tree-tokens", action="store_true",
                   help=f"the hook's tree tokens for a {TREE_PROMPT_SET} prompt's first round instead of random ones")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--mem-fraction-static", type=float, default=0.85)
    p.add_argument("--out", type=Path, default=Path("results/verify_cost.json"))
    p.add_argument("--replot", type=Path, metavar="JSON", help="only draw the figure of a saved result (no GPU)")
    args = p.parse_args(argv)
    if args.replot:
        return _replot(args.replot)
    if args.model_dir is None or not (args.model_dir / "planted.json").is_file():
        p.error(f"MODEL_DIR must be a planted target directory holding planted.json (got {args.model_dir})")
    if min(args.bs + args.tokens) < 1 or args.reps < 1:
        p.error(f"--bs, --tokens and --reps take integers >= 1 (got {args.bs}, {args.tokens}, {args.reps})")
    if args.tree_tokens and args.model_dir.name not in FULLSIZE:
        p.error(f"--tree-tokens needs a full-size target's directory, named {' or '.join(FULLSIZE)} (got {args.model_dir.name})")
    if args.tree_tokens and max(args.bs) > TREE_PROMPTS:
        p.error(f"--tree-tokens drafts one tree a {TREE_PROMPT_SET} prompt: --bs at most {TREE_PROMPTS} (got {max(args.bs)})")
    import torch

    if not torch.cuda.is_available():
        print("verify_cost: needs a CUDA GPU (got none)", file=sys.stderr)
        return 2
    runner, make_reqs = load_runner(args.model_dir, args.mem_fraction_static)
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "model": args.model_dir.name,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python -m verify.bench.verify_cost " + " ".join(sys.argv[1:] if argv is None else argv),
              "config": json.loads((args.model_dir / "config.json").read_text()),
              "tokens": "tree" if args.tree_tokens else "random", **({"prompts": TREE_PROMPT_SET} if args.tree_tokens else {}),
              "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trees = tree_inputs(args.model_dir, max(args.bs), args.tokens) if args.tree_tokens else None
    for bs in args.bs:
        for n in args.tokens:
            inputs = trees[n][:bs] if trees else None
            result["rows"].append(_time_forward(runner, make_reqs, bs, n, args.reps, inputs))
            print(json.dumps(result["rows"][-1]), flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    # Drawn by a fresh interpreter: SGLang, loaded here, leaves a module named IPython without
    # get_ipython in sys.modules, on which pyplot's first figure fails.
    subprocess.run([sys.executable, "-m", "verify.bench.verify_cost", "--replot", str(args.out)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
