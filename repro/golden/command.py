"""`repro golden check|regen`: verify or rebuild the golden set under golden/."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from repro.errors import UsageError
from repro.files import write_atomic

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "golden"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `repro golden`."""
    parser.add_argument("action", choices=["check", "regen"], help="check hashes and re-derive, or regenerate")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="golden directory (default: the repo's golden/)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="limit to these case names")
    parser.add_argument("--device", default="cpu", help="device for the batched re-derivation (check only)")


def main(args: argparse.Namespace) -> int:
    """Dispatch to check or regen; non-zero exit when any case fails."""
    if args.dir.exists() and not args.dir.is_dir():
        msg = f"--dir: {args.dir} is not a directory"
        raise UsageError(msg)
    return _check(args) if args.action == "check" else _regen(args)


def _device(name: str) -> str:
    """``--device`` if this machine has it: ``cpu``, or ``cuda``/``cuda:N`` with CUDA present."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        msg = f"--device must be cpu, cuda or cuda:N (got {name!r})"
        raise UsageError(msg)
    count = torch.cuda.device_count() if device.type == "cuda" else 1
    if device.type == "cuda" and (count == 0 or (device.index or 0) >= count):
        msg = f"--device {name}: this machine has {count} CUDA device(s)"
        raise UsageError(msg)
    return name


def _regen(args: argparse.Namespace) -> int:
    from repro.golden import cases
    from repro.stack.pins import fingerprint

    specs = cases.case_specs()
    known = {s.name for s in specs}
    unknown = sorted(set(args.only) - known)
    if unknown:
        msg = f"--only names unknown cases {unknown} (known: {len(known)} cases, see golden/manifest.json)"
        raise UsageError(msg)
    args.dir.mkdir(parents=True, exist_ok=True)
    manifest_path = args.dir / cases.MANIFEST
    old = cases.load_manifest(args.dir) if manifest_path.exists() else {"cases": []}
    entries = {e["name"]: e for e in old["cases"]}
    chosen = [s for s in specs if not args.only or s.name in args.only]
    for i, spec in enumerate(chosen, 1):
        entry = cases.write_case(args.dir, spec)
        changed = entries.get(spec.name, {}).get("sha256") != entry["sha256"]
        entries[spec.name] = entry
        print(f"[{i}/{len(chosen)}] {spec.name}: {'changed' if changed else 'unchanged'}", flush=True)
    ours = [entries[s.name] for s in specs if s.name in entries]
    others = [e for e in entries.values() if e.get("kind") != cases.KIND]
    manifest = {
        "format": 1,
        "regenerate": cases.REGEN_COMMAND,
        "fingerprint": fingerprint(),
        "cases": ours + others,
    }
    write_atomic(manifest_path, json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    print(f"wrote {len(chosen)} case(s) and {manifest_path}")
    return 0


def _check_kernel_hashes(golden_dir: Path) -> int:
    """Hash-check the SGLang kernel goldens (their outputs are re-derived on a GPU); failures."""
    from repro.golden import cases

    failures = 0
    for entry in cases.kernel_entries(golden_dir):
        path = golden_dir / entry["file"]
        if not path.is_file() or cases.sha256(path) != entry["sha256"]:
            print(f"FAIL {entry['name']}: {'missing' if not path.is_file() else 'sha256 differs'} ({entry['file']})")
            failures += 1
        else:
            print(f"ok   {entry['name']}: hash ok; outputs re-derived on sm{entry['sm']} by verify/sglang/test_sglang_kernels.py")
    return failures


def _check(args: argparse.Namespace) -> int:
    from repro.golden import cases

    if not (args.dir / cases.MANIFEST).exists():
        msg = f"no {cases.MANIFEST} in {args.dir} (run `repro golden regen` to create the set)"
        raise UsageError(msg)
    device = _device(args.device)
    stored_cases = list(cases.iter_cases(args.dir))
    failures, count = 0, 0
    t0 = time.perf_counter()
    for entry, spec in stored_cases:
        if args.only and spec.name not in args.only:
            continue
        count += 1
        path = args.dir / entry["file"]
        if not path.is_file():
            print(f"FAIL {spec.name}: missing file {entry['file']}")
            failures += 1
            continue
        if cases.sha256(path) != entry["sha256"]:
            print(f"FAIL {spec.name}: sha256 differs from the manifest")
            failures += 1
            continue
        try:
            inputs, stored = cases.load_case(args.dir, entry)
            bad = {p: cases.mismatches(stored, cases.derive(inputs, spec.budget, p, device),
                                       score_atol=cases.SCORE_ATOL)
                   for p in ("batched", "reference")}
        except ValueError as exc:  # a file that matches its hash but is no golden case
            print(f"FAIL {spec.name}: {exc}")
            failures += 1
            continue
        if any(bad.values()):
            print(f"FAIL {spec.name}: " + "; ".join(f"{p} differs on {b}" for p, b in bad.items() if b))
            failures += 1
        else:
            print(f"ok   {cases.summarize(spec, stored)}")
    if count == 0:
        msg = f"no DDTree cases matched in {args.dir / cases.MANIFEST}"
        raise UsageError(msg)
    failures += 0 if args.only else _check_kernel_hashes(args.dir)
    print(f"{count - failures}/{count} golden cases ok ({time.perf_counter() - t0:.1f} s, batched on {args.device})")
    return 1 if failures else 0
