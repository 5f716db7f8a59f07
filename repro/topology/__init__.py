"""`repro topology`: how to split Kimi-K2.6 over this box (TP8, TP8 + EP8, DeepEP) and which DDTREE
budget, from a cost model whose parts are each measured.

    repro topology                          # this machine: no GPU / one GPU in one line, else the advice
    repro topology --from TOPO [--gpus-from CSV]   # a saved `nvidia-smi topo -m` (and --query-gpu CSV)
    repro topology --predict PROFILE        # predicted tok/s per configuration x algorithm x budget x c
    repro topology --predict PROFILE -o DIR # ... and DIR/PROFILE.md (table, advice, observations) + .png
    repro topology --measure [-o FILE]      # this box's all-reduce at the decode sizes (2+ local GPUs)

Modules: ``detect`` (the box from nvidia-smi), ``collectives`` (what SGLang 0.5.17 runs, with file:line,
and repro/data/collectives.toml's timings), ``spread`` (experts per GPU under TP / EP), ``compute``
(per-GPU bytes, FLOPs and time), ``model`` (a round, tok/s), ``checks`` (fits and held-out checks on
the one-GPU measurements), ``measure`` (--measure), ``advice`` (the text), ``page`` (--predict's
markdown), ``plots``.

``--predict`` and the advice on a box take the per-GPU compute calibration from ``--compute`` (a
verify/bench/share_cost.py result; else repro.topology.compute.DEFAULT, the fit of the committed
one-GPU measurements), the collectives from ``--collectives`` (a --measure result for that box; else
repro/data/collectives.toml), and host time from the served one-GPU rounds (model.DEFAULT_HOST).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from repro.argtypes import integer
from repro.errors import ReproError, UsageError
from repro.files import read_json, read_text

SPREAD_CHOICES = ("skewed", "uniform")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro topology``."""
    parser.add_argument("--from", dest="source", type=Path, default=None, metavar="FILE",
                        help="saved `nvidia-smi topo -m` output (default: ask nvidia-smi here)")
    parser.add_argument("--gpus-from", type=Path, default=None, metavar="CSV",
                        help="saved `nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,"
                             "pci.bus_id --format=csv,noheader,nounits` (names the GPUs of --from)")
    parser.add_argument("--predict", metavar="PROFILE", default=None,
                        help="predict a profile's box (profiles.toml): tok/s per configuration, algorithm, budget, c")
    parser.add_argument("--fabric", default=None, metavar="NAME",
                        help="the fabric of collectives.toml to predict with (default: detected, or the profile's)")
    parser.add_argument("--gpu", default=None, metavar="CLASS", help="the GPU class of collectives.toml (default: detected)")
    parser.add_argument("--collectives", type=Path, default=None, metavar="FILE",
                        help="a `repro topology --measure` result: its figures replace the fabric's")
    parser.add_argument("--compute", type=Path, default=None, metavar="FILE",
                        help="a verify/bench/share_cost.py result: the per-GPU compute calibration")
    parser.add_argument("--spread", choices=SPREAD_CHOICES, default="skewed",
                        help="router spread of the prediction (default skewed: Dirichlet(0.3) expert popularity)")
    parser.add_argument("--measure", action="store_true", help="measure this box's all-reduce (2 or more local GPUs)")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="PATH",
                        help="--measure: the JSON it writes (default topology-measure.json); --predict: a folder for "
                             "PROFILE.md and PROFILE.png")
    parser.add_argument("--reps", type=integer(1, 10_000), default=20, help="--measure: timed calls a size (default 20)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _table() -> Any:
    from repro.topology.collectives import load_table

    return load_table()


def fabric_for(box: Any, table: Any, fabric: str | None = None, gpu: str | None = None) -> tuple[Any, Any, str]:
    """(GPU class, fabric, note) of a detected box: named ones win, else by GPU name and links."""
    note = ""
    gpu_class = table.gpus.get(gpu) if gpu else (table.gpu_for(box.name) if box.name else None)
    if gpu and gpu_class is None:
        msg = f"--gpu must be one of {', '.join(table.gpus)} (got {gpu!r})"
        raise UsageError(msg)
    if fabric:
        if fabric not in table.fabrics:
            msg = f"--fabric must be one of {', '.join(table.fabrics)} (got {fabric!r})"
            raise UsageError(msg)
        fab = table.fabrics[fabric]
    elif box.interconnect == "nvlink":
        arch = gpu_class.arch if gpu_class else "sm90"
        fab = table.fabrics["nvlink-sm100" if arch == "sm100" else "nvlink-sm90"]
    else:
        fab = table.fabrics["pcie-gen5"]
        note = ("P2P is assumed on (nvidia-smi topo -m does not show it); if NCCL runs without it (NCCL_P2P_DISABLE, "
                "IOMMU), predict with --fabric pcie-gen5-nop2p, or measure with --measure")
        if box.interconnect == "mixed":
            note = (f"{box.pairs_without_nvlink} GPU pairs lack NVLink: a TP all-reduce runs at its slowest hop's pace, "
                    f"so the box is predicted as PCIe; {note}")
    if gpu_class is None:
        gpu_class = table.gpus[fab.gpu_classes[-1]]
        note = (f"GPU model unknown (pass --gpus-from CSV or --gpu CLASS): predicted as {gpu_class.key}; " + note).strip()
    return gpu_class, fab, note.rstrip("; ")


def profile_box(profile: Any, table: Any, fabric: str | None, gpu: str | None) -> tuple[Any, Any]:
    """(GPU class, fabric) a profile's machine names (target sm90 / sm100 / sm120, interconnect)."""
    machine = profile.machine.lower()
    if gpu is None:
        hit = table.gpu_for(profile.machine)
        gpu = hit.key if hit else {"sm100": "b300", "sm120": "rtx-pro-6000"}.get(profile.target, "h200")
    if gpu not in table.gpus:
        msg = f"--gpu must be one of {', '.join(table.gpus)} (got {gpu!r})"
        raise UsageError(msg)
    if fabric is None:
        arch = table.gpus[gpu].arch
        fabric = ("nvlink-sm100" if arch == "sm100" else "nvlink-sm90") if profile.interconnect in ("nvlink", "single") \
            else "pcie-gen5"
        if "no p2p" in machine:
            fabric = "pcie-gen5-nop2p"
    if fabric not in table.fabrics:
        msg = f"--fabric must be one of {', '.join(table.fabrics)} (got {fabric!r})"
        raise UsageError(msg)
    return table.gpus[gpu], table.fabrics[fabric]


def served_for(profile: Any) -> Any:
    """What a profile serves, for the model: Kimi-K2.6, or a test model's config (τ 1: random weights)."""
    from repro.topology.compute import Drafter, Target
    from repro.topology.model import Served, kimi_k26

    if profile.model == "Kimi-K2.6":
        return kimi_k26()
    from repro.testmodels.configs import SMALL_KIMI_MOE, read_model

    names = {"moe": SMALL_KIMI_MOE}
    if profile.model not in names:
        msg = (f"--predict: profile {profile.name} serves {profile.model!r}; the model predicts Kimi-K2.6 and the "
               f"Kimi-shaped test pair ('moe')")
        raise UsageError(msg)
    data = read_model(names[profile.model], ("description", "target", "drafter"))
    taus = {"dflash": 1.0, **{str(b): 1.0 for b in (1, 512)}}
    return Served(Target.from_config(profile.model, data["target"]), Drafter.from_config(data["drafter"]), taus)


def _calibration(path: Path | None) -> Any:
    from repro.topology.checks import calibration_from_shares, share_cost_rows
    from repro.topology.compute import DEFAULT

    if path is None:
        return DEFAULT
    device, rows = share_cost_rows(path)
    table = _table()
    gpu = table.gpu_for(device)
    if gpu is None:
        msg = f"--compute: {path} was measured on {device!r}, which no [gpus] class of collectives.toml matches"
        raise UsageError(msg)
    return calibration_from_shares(rows, gpu.key, gpu.hbm_tb_s, gpu.bf16_tflops)


def _measured_fabric(fab: Any, path: Path | None) -> Any:
    from repro.topology.collectives import with_measured

    if path is None:
        return fab
    data = read_json(path, "--collectives", "a `repro topology --measure` JSON")
    if not isinstance(data, dict) or data.get("kind") != "repro-topology-measure":
        msg = f"--collectives: {path} is not a `repro topology --measure` result"
        raise UsageError(msg)
    return with_measured(fab, data, str(path))


def prediction(served: Any, gpu: Any, fab: Any, gpus: int, *, compute: Path | None, spread: str,
               served_spread: str | None = None) -> dict[str, Any]:
    """The model's table and advice for one box, JSON-ready."""
    from repro.topology.advice import advice
    from repro.topology.model import Box, configs_for, predict_table

    box = Box(gpu, fab, gpus)
    cal = _calibration(compute)
    kind = served_spread or spread
    rows = predict_table(served, box, cal=cal, spread=kind)
    configs = configs_for(box)
    return {"box": box.label, "gpu": gpu.key, "fabric": fab.key, "gpus": gpus, "spread": kind,
            "calibration": cal.as_dict(), "collectives_measured": fab.measured or None, "configs": configs,
            "advice": advice(box, rows, configs), "rows": rows}


def _recommend(box: Any, pred: dict[str, Any], note: str) -> dict[str, Any]:
    """The classic answer's keys (gpus, interconnect, recommended, reason, sglang_args) from a prediction."""
    from repro.topology.advice import ARGS
    from repro.topology.model import CONCURRENCY, best

    by_c = {}
    for c in CONCURRENCY:
        top = best(pred["rows"], concurrency=c)
        by_c[str(c)] = {"config": top["config"], "algorithm": top["algorithm"], "budget": top["budget"],
                        "tok_s": round(top["tok_s"], 1)}
    choice = by_c["1"]["config"]
    reason = (f"{box.link_summary or box.interconnect}; predicted on {pred['box']}: " + "; ".join(pred["advice"][:3])
              + (f" ({note})" if note else ""))
    return {"gpus": box.gpus, "interconnect": box.interconnect, "fabric": pred["fabric"], "gpu": pred["gpu"],
            "recommended": choice, "recommended_by_concurrency": by_c, "reason": reason,
            "sglang_args": ARGS[choice].format(p=box.gpus).split(), "advice": pred["advice"], "note": note or None}


def _print_prediction(pred: dict[str, Any]) -> None:
    from repro.topology.advice import table

    print(f"box: {pred['box']}  spread: {pred['spread']}  compute: {pred['calibration']['source']}")
    if pred["collectives_measured"]:
        print(f"collectives: measured ({pred['collectives_measured']})")
    print("predicted tok/s (round ms):")
    for line in table(pred["rows"], pred["configs"], pred["gpus"]):
        print(line)
    for line in pred["advice"]:
        print(f"- {line}")


def _measure(args: argparse.Namespace) -> int:
    from repro.topology import detect, measure

    box = detect.local_box()
    if box.gpus < 2:
        msg = (f"--measure needs 2 or more local GPUs; {detect.one_line(box)}. Run it on the box itself before "
               f"downloading the weights")
        raise ReproError(msg)
    table = _table()
    _gpu, fab, _note = fabric_for(box, table)
    figures = measure.run_local(box.gpus, {"reps": args.reps})
    out = measure.result(figures["figures"], box=box.as_dict(), fabric=fab.key, nccl=figures.get("nccl"))
    path = args.output or Path("topology-measure.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    for fig in out["figures"]:
        pts = ", ".join(f"{int(m) // 1024} KB {t:.1f} us" for m, t in fig["points"][:6])
        print(f"{fig['op']} ({'graph' if fig['graph'] else 'eager'}, {fig['gpus']} GPUs): {pts}, ...")
    print(f"wrote {path}: predict with `repro topology --predict PROFILE --collectives {path}`")
    return 0


def _predict(args: argparse.Namespace) -> int:
    """--predict PROFILE."""
    from repro.serving.profiles import get_profile

    profile = get_profile(args.predict)
    gpu, fab = profile_box(profile, _table(), args.fabric, args.gpu)
    fab = _measured_fabric(fab, args.collectives)
    served = served_for(profile)
    pred = prediction(served, gpu, fab, profile.tp, compute=args.compute, spread=args.spread,
                      served_spread=None if profile.model == "Kimi-K2.6" else "uniform")
    pred["profile"] = profile.name
    if args.json:
        print(json.dumps(pred, indent=1))
    else:
        _print_prediction(pred)
    if args.output is not None:
        _write_page(pred, served, args.output, args.compute)
    return 0


def _write_page(pred: dict[str, Any], served: Any, folder: Path, compute: Path | None) -> None:
    """DIR/PROFILE.md (repro.topology.page) and DIR/PROFILE.png (repro.topology.plots)."""
    import sys

    from repro.files import atomic_output
    from repro.topology.page import page
    from repro.topology.plots import prediction_figure

    md = folder / f"{pred['profile']}.md"
    with atomic_output(md) as tmp:
        tmp.write_text(page(pred, served, _table(), cal=_calibration(compute)))
    prediction_figure(pred, folder / f"{pred['profile']}.png")
    print(f"wrote {md} and {md.with_suffix('.png')}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    """Measure, predict a profile's box, or advise on this (or a saved) box."""
    from repro.topology import detect

    if args.measure:
        return _measure(args)
    if args.predict:
        return _predict(args)
    table = _table()
    if args.source is not None:
        topo = read_text(args.source, "--from", "saved `nvidia-smi topo -m` output")
        query = read_text(args.gpus_from, "--gpus-from", "saved `nvidia-smi --query-gpu` CSV") if args.gpus_from else None
        box = detect.box_from_text(topo, query)
    else:
        box = detect.local_box()
    line = detect.one_line(box)
    if line is not None:
        if args.json:
            print(json.dumps({**box.as_dict(), "recommended": None, "reason": line, "sglang_args": ["--tp-size", "1"]}))
        else:
            print(line)
        return 0
    from repro.topology.model import kimi_k26

    gpu, fab, note = fabric_for(box, table, args.fabric, args.gpu)
    fab = _measured_fabric(fab, args.collectives)
    pred = prediction(kimi_k26(), gpu, fab, box.gpus, compute=args.compute, spread=args.spread)
    answer = _recommend(box, pred, note)
    if args.json:
        print(json.dumps({**answer, "prediction": pred}, indent=1))
        return 0
    print(f"GPUs: {box.gpus}{f' ({box.name})' if box.name else ''}  interconnect: {box.interconnect} "
          f"({box.link_summary})  fabric: {fab.key}  GPU class: {gpu.key}")
    if note:
        print(f"note: {note}")
    for c, pick in answer["recommended_by_concurrency"].items():
        cell = pick["algorithm"] + (f" B {pick['budget']}" if pick["budget"] else "")
        print(f"c {c}: {pick['config']} {cell} ({pick['tok_s']:.0f} tok/s predicted for Kimi-K2.6)")
    for line in pred["advice"]:
        print(f"- {line}")
    print(f"recommended: {answer['recommended']}")
    print(f"SGLang arguments: {' '.join(answer['sglang_args'])}")
    return 0


TP_EP_TOLERANCE = 0.25
"""How far a measured TP / EP tok/s ratio may sit from the model's: the compute model's 10% held-out
bound and the served round's 15% (repro.topology.checks), added."""


def tp_over_ep(tp_profile: str, ep_profile: str, algorithm: str, budget: int | None, concurrency: int, *,
               compute: Path | None = None, collectives: Path | None = None) -> float:
    """The model's TP / EP tok/s ratio for one cell of a profile pair (the verify tier checks it)."""
    from repro.serving.profiles import get_profile
    from repro.topology.model import Box, predict_round

    tp, ep = get_profile(tp_profile), get_profile(ep_profile)
    if (tp.machine, tp.model, tp.tp) != (ep.machine, ep.model, ep.tp) or tp.ep != 1 or ep.ep == 1:
        msg = f"{tp_profile} / {ep_profile} are not a TP profile and its TP + EP twin of one machine"
        raise UsageError(msg)
    gpu, fab = profile_box(tp, _table(), None, None)
    fab = _measured_fabric(fab, collectives)
    served, box = served_for(tp), Box(gpu, fab, tp.tp)
    kind = "skewed" if tp.model == "Kimi-K2.6" else "uniform"
    cal = _calibration(compute)
    rows = [predict_round(served, box, config, algorithm, budget, concurrency, cal=cal, spread=kind)
            for config in ("tp", "ep")]
    return rows[0]["tok_s"] / rows[1]["tok_s"]


def tp_over_ep_bounds(tp_profile: str, ep_profile: str, concurrency: int = 1) -> tuple[float, float]:
    """The thresholds' tp-over-ep bounds for a profile pair: the model's lowest and highest TP / EP ratio
    over AR, DFLASH and DDTREE B 16..512 at ``concurrency``, widened by TP_EP_TOLERANCE and rounded outwards
    to 0.01 (repro/data/thresholds.toml marks them predicted)."""
    import math

    from repro.topology.model import cells

    ratios = [tp_over_ep(tp_profile, ep_profile, a, b, concurrency) for a, b in cells()]
    return (math.floor(min(ratios) * (1 - TP_EP_TOLERANCE) * 100) / 100,
            math.ceil(max(ratios) * (1 + TP_EP_TOLERANCE) * 100) / 100)
