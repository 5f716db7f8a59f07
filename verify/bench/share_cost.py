"""Time one MoE layer of both one-GPU shares of Kimi-K2.6 at 8 GPUs against T = bs x N: JSON + PNG.

    python -m verify.bench.share_cost --out results/share_cost.json          # GPU, patched or stock SGLang
    python -m verify.bench.share_cost --replot results/share_cost.json       # the figure only, no GPU

The shares (repro.testmodels.shares, repro/data/models/k26-ep8.toml): ``k26-tp8``, 384 experts each
256 wide, every token's top-8; ``k26-ep8``, 48 whole experts of 2048, the ids of the most-loaded EP
rank (the other ranks' ids -1, as SGLang's standard dispatcher masks them). Both run SGLang's fused
MoE (``fused_experts``, the Triton runner's kernels: moe_align_block_size, the two grouped GEMMs,
SiLU-and-mul, the top-k sum), with ``num_experts`` 384 and ``num_local_experts`` 384 / 48 as the
layer passes them, on bf16 weights. A whole-forward EP8 share is not practical on one GPU: SGLang
at TP1 would route top-8 among 48 experts and hold a whole shared expert (k26-ep8.toml); the parts
the shares have in common (attention, the shared expert, the dense layer, the head) are the same
work in both and come from k26-tp8's whole-forward runs (verify_cost.py).

For each spread (``planted``: the planted targets' router, T distinct tokens; ``skewed``: Dirichlet
0.3 expert popularity), batch size and N it routes T = bs x N tokens in each of ``--layers`` layers
(a layer's own routing), captures the call in a CUDA graph and times ``--reps`` replays (CUDA events,
median of 3), and records per layer the experts read, the token-expert pairs, the fused MoE's 16-row
M tiles and, for EP, the rank and its share of all pairs. SGLang's global state (process group,
runtime config) comes from loading a 2-layer k26-tp8 config with dummy weights; that model's MoE
layer supplies the TP8 weights, and its module is timed too at planted bs 1 (``module_us``: how the
standalone call compares with the layer SGLang runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from verify.bench.verify_cost import load_runner

BS = (1, 4, 16)
TOKENS = (1, 8, 16, 17, 33, 65, 129, 257, 513)
SPREADS = ("planted", "skewed")


def write_layer_config(out: Path, layers: int = 2) -> Path:
    """``out/k26-tp8-L{layers}/config.json``: k26-tp8's target config cut to ``layers`` layers."""
    from repro.testmodels.configs import read_model, write_config

    cfg = {**read_model("k26-tp8")["target"], "num_hidden_layers": layers}
    path = out / f"k26-tp8-L{layers}"
    write_config(path, cfg)
    return path


def plan(bs_list: list[int], tokens: list[int], spreads: list[str], layers: int) -> list[dict[str, Any]]:
    """Every (share, spread, bs, N, layer) to time, with its routing summary (no GPU needed)."""
    from repro.testmodels.shares import load_share, routed_ids, share_ids

    shares = [load_share("k26-tp8"), load_share("k26-ep8")]
    out = []
    for spread in spreads:
        for bs in bs_list:
            for n in tokens:
                for layer in range(layers):
                    ids = routed_ids(shares[0], bs * n, spread, layer)
                    for share in shares:
                        local, info = share_ids(share, ids)
                        out.append({"share": share.name, "spread": spread, "bs": bs, "n": n, "t": bs * n,
                                    "layer": layer, **info, "_ids": local})
    return out


def _time_graph(fn: Any, reps: int, trials: int = 3) -> float:
    """Microseconds per call of ``fn`` captured in a CUDA graph (median of ``trials``)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(trials):
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    del graph
    return statistics.median(times)


def measure(runner: Any, rows: list[dict[str, Any]], reps: int, out: Path, result: dict[str, Any]) -> None:
    """Time every row (in place: ``us``), writing the JSON after each."""
    import torch
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    from repro.testmodels.shares import load_share

    moe_layer = next(layer.mlp for layer in runner.model.model.layers if hasattr(layer.mlp, "experts"))
    experts = moe_layer.experts
    tp = load_share("k26-tp8")
    ep = load_share("k26-ep8")
    weights = {"k26-tp8": (experts.w13_weight, experts.w2_weight)}
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.empty(ep.experts_local, 2 * ep.width, ep.hidden, dtype=torch.bfloat16, device="cuda")
    w2 = torch.empty(ep.experts_local, ep.hidden, ep.width, dtype=torch.bfloat16, device="cuda")
    for w in (w13, w2):
        w.uniform_(-1e-3, 1e-3, generator=gen)
    weights["k26-ep8"] = (w13, w2)
    configs = {s.name: MoeRunnerConfig(num_experts=s.experts_global, num_local_experts=s.experts_local,
                                       hidden_size=s.hidden, intermediate_size_per_partition=s.width, top_k=s.topk,
                                       params_dtype=torch.bfloat16, activation="silu", is_gated=True, inplace=False,
                                       routed_scaling_factor=2.827) for s in (tp, ep)}
    routed = [row.pop("_ids") for row in rows]  # the JSON written along the way holds no arrays
    for k, row in enumerate(rows):
        t = row["t"]
        hidden = torch.randn(t, tp.hidden, dtype=torch.bfloat16, device="cuda", generator=gen) * 0.1
        ids = torch.as_tensor(routed[k], dtype=torch.int32, device="cuda")
        weights_topk = torch.rand(t, tp.topk, dtype=torch.float32, device="cuda", generator=gen)
        topk = StandardTopKOutput(weights_topk, ids, torch.empty(t, tp.experts_global, device="cuda"))
        w1, w2_ = weights[row["share"]]
        cfg = configs[row["share"]]

        def call(hidden=hidden, w1=w1, w2_=w2_, topk=topk, cfg=cfg) -> None:
            fused_experts(hidden, w1, w2_, topk, cfg)

        with torch.inference_mode():
            row["us"] = _time_graph(call, reps)
            if row["share"] == "k26-tp8" and row["spread"] == "planted" and row["bs"] == 1 and row["layer"] == 0:
                try:  # the served layer module on the same inputs: how far the standalone call is from it
                    row["module_us"] = _time_graph(lambda hidden=hidden, topk=topk: experts(hidden, topk), reps)
                except Exception as exc:  # noqa: BLE001 - recorded, the standalone figure stands
                    row["module_error"] = f"{type(exc).__name__}: {exc}"[:200]
        print(json.dumps({k: v for k, v in row.items() if k != "_ids"}), flush=True)
        if k % 8 == 7 or k == len(rows) - 1:
            out.write_text(json.dumps(result, indent=1) + "\n")


def _replot(path: Path) -> int:
    """Draw the figure of a saved share_cost JSON beside it; 2 on a file that is not one."""
    from repro.topology.plots import share_cost_figure

    try:
        result = json.loads(path.read_text())
        rows = [r for r in result["rows"] if "us" in r]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"share_cost: --replot needs a share_cost JSON with 'rows' ({path}: {type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    why_not = share_cost_figure(rows, path.with_suffix(".png"), title=result.get("device", ""))
    print(f"figure not drawn: {why_not}" if why_not else f"wrote {path.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Time every (share, spread, bs, N, layer) on the GPU and write JSON + PNG, or only redraw."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=list(BS))
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="N values (tokens per request)")
    p.add_argument("--spreads", nargs="+", choices=SPREADS, default=list(SPREADS))
    p.add_argument("--layers", type=int, default=2, help="routings (layers) per point (default 2)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mem-fraction-static", type=float, default=0.15)
    p.add_argument("--out", type=Path, default=Path("results/share_cost.json"))
    p.add_argument("--plan", action="store_true", help="print the routing summary of every point and exit (no GPU)")
    p.add_argument("--replot", type=Path, metavar="JSON", help="only draw the figure of a saved result (no GPU)")
    args = p.parse_args(argv)
    if args.replot:
        return _replot(args.replot)
    if min(args.bs + args.tokens) < 1 or args.reps < 1 or args.layers < 1:
        p.error(f"--bs, --tokens, --reps and --layers take integers >= 1 (got {args.bs}, {args.tokens}, {args.reps}, "
                f"{args.layers})")
    rows = plan(args.bs, args.tokens, args.spreads, args.layers)
    if args.plan:
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != "_ids"}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("share_cost: needs a CUDA GPU (got none)", file=sys.stderr)
        return 2
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__,
              "command": "python -m verify.bench.share_cost " + " ".join(sys.argv[1:] if argv is None else argv),
              "kind": "moe-layer", "hidden": 7168, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runner = load_runner(write_layer_config(Path(tmp)), args.mem_fraction_static, plant=False)[0].torch_runner
        measure(runner, rows, args.reps, args.out, result)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    # a fresh interpreter draws it (SGLang leaves a stub IPython module that pyplot trips on)
    subprocess.run([sys.executable, "-m", "verify.bench.share_cost", "--replot", str(args.out)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
