"""SGLang's own load generator beside `repro bench --request-rate` on one running server: JSON + table.

    python -m verify.bench.bench_serving_check RESULTS.jsonl... --url URL --profile P --tokenizer MODEL_DIR
        --out DIR [--backends sglang,sglang-oai] [--seed 1] [--models-dir M] [--profile-file F]

RESULTS are `repro bench PROFILE --url URL --request-rate R,...` results (native and ``--api openai``).
For each of their open-loop cells this runs ``python -m sglang.bench_serving`` against the same server
with the same load: ``--request-rate``, ``--max-concurrency``, ``--num-prompts``, ``--seed`` (its Poisson
gaps are repro's, :func:`repro.evidence.load.arrival_offsets`), ``--sharegpt-output-len`` (the cell's
max new tokens, EOS ignored as repro does), ``--temperature``, ``--flush-cache`` (pair it with `repro
bench --flush-cache`: every cell starts cold), ``--tokenizer MODEL_DIR`` and HF_HUB_OFFLINE=1. The
prompts are the cell's own: the requests' token ids are rebuilt as `repro bench` built them (refused
unless their digest is the cells'), decoded to text with the model's tokenizer (refused unless the text
encodes back to the same ids: the server re-tokenizes it) and written as bench_serving's sharegpt
dataset, ordered so that its seeded shuffle sends them in repro's order (its ``input_lens`` show
whether it did). Backend ``sglang`` (``/generate``) is set beside the native cell, ``sglang-oai``
(``/v1/completions``) beside the ``--api openai`` one, figure by figure (request and output throughput,
TTFT / TPOT / ITL / E2E mean, median, p90, p99, failures, accept length) with repro / bench_serving;
verdict: output throughput and median TPOT within 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from repro.evidence import runconfig
from repro.evidence.bench import request_inputs
from repro.evidence.load import check_arrivals
from repro.evidence.prompts import load_prompts
from repro.evidence.results import Cell, CellSummary, format_table, load_records, summarize
from repro.serving.profiles import get_profile, models_dir

BACKENDS = {"sglang": None, "sglang-oai": "openai"}  # bench_serving backend: the Cell.api it is set beside
TOLERANCE = 0.10
VERDICT_FIGURES = ("output tok/s", "TPOT median ms")
SPREADS = (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99"))
FIGURES: dict[str, tuple[str, Any]] = {  # name: (bench_serving summary key, the repro summary's value)
    "req/s": ("request_throughput", lambda s: s.request_s),
    "output tok/s": ("output_throughput", lambda s: s.output_tok_s),
    **{f"{name} {label} ms": (f"{label}_{key}_ms", lambda s, a=attr, f=field: getattr(getattr(s, a), f, None))
       for name, key, attr in (("TTFT", "ttft", "ttft_ms"), ("TPOT", "tpot", "tpot_ms"), ("ITL", "itl", "itl_ms"),
                               ("E2E", "e2e_latency", "e2e_ms"))
       for label, field in SPREADS},
    "accept length": ("accept_length", lambda s: s.tau_mean),
}
HEADERS = ("backend", "rate", "figure", "repro", "bench_serving", "repro/bs", "within 10%")


def texts(inputs: list[dict[str, Any]], tokenizer_dir: Path) -> list[str]:
    """Each request input as the text bench_serving sends: token ids decoded with the model's
    tokenizer, a ValueError unless the text encodes back to exactly those ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    out = []
    for i, body in enumerate(inputs):
        if "text" in body:
            out.append(body["text"])
            continue
        text = tok.decode(body["input_ids"], skip_special_tokens=False)
        if tok.encode(text, add_special_tokens=False).ids != body["input_ids"]:
            msg = f"prompt {i}: its token ids do not survive decode + encode with {tokenizer_dir}'s tokenizer"
            raise ValueError(msg)
        out.append(text)
    return out


def sharegpt_rows(prompts: list[str], seed: int) -> list[dict[str, Any]]:
    """bench_serving's sharegpt dataset of ``prompts``, placed so that the shuffle it makes after
    ``random.seed(seed)`` puts them back in this order (the answer turn is a placeholder: the output
    length is ``--sharegpt-output-len``)."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)  # noqa: S311 - bench_serving's shuffle, not a secret
    rows: list[dict[str, Any]] = [{}] * len(prompts)
    for position, slot in enumerate(order):
        rows[slot] = {"conversations": [{"from": "human", "value": prompts[position]},
                                        {"from": "gpt", "value": "placeholder answer"}]}
    return rows


def command(cell: Cell, count: int, *, backend: str, url: str, dataset: Path, seed: int, tokenizer: Path,
            output: Path, python: str = sys.executable) -> list[str]:
    """The ``bench_serving`` command line of one open-loop ``cell`` of ``count`` requests."""
    assert cell.request_rate is not None
    argv = [python, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", str(count),
            "--sharegpt-output-len", str(cell.max_new_tokens), "--request-rate", f"{cell.request_rate:g}",
            "--max-concurrency", str(cell.concurrency), "--seed", str(seed), "--tokenizer", str(tokenizer),
            "--temperature", f"{cell.temperature:g}", "--flush-cache", "--output-file", str(output),
            "--output-details", "--disable-tqdm"]
    if backend == "sglang-oai":  # its completions take the temperature from the request body only
        argv += ["--extra-request-body", json.dumps({"temperature": cell.temperature})]
    return argv


def read_summary(path: Path) -> dict[str, Any]:
    """The last JSON line bench_serving appended to ``--output-file``; a ValueError without one."""
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    summary = json.loads(lines[-1]) if lines else None
    missing = [key for key, _ in FIGURES.values() if not isinstance(summary, dict) or key not in summary]
    if missing:
        msg = f"{path}: no bench_serving summary with {', '.join(missing[:3])}"
        raise ValueError(msg)
    return summary


def failed(summary: dict[str, Any], count: int) -> int:
    """Requests bench_serving counted as failed (an error each with --output-details)."""
    errors = summary.get("errors")
    return sum(1 for e in errors if e) if isinstance(errors, list) else count - summary["completed"]


def rows(backend: str, s: CellSummary, summary: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Figure by figure: repro's value, bench_serving's, their ratio and, for the verdict's figures,
    whether it is within :data:`TOLERANCE`."""
    out = []
    for name, (key, value) in FIGURES.items():
        mine, theirs = value(s), summary.get(key)
        ratio = mine / theirs if isinstance(mine, float | int) and isinstance(theirs, float | int) and theirs else None
        within = None if name not in VERDICT_FIGURES else ratio is not None and abs(ratio - 1) <= TOLERANCE
        out.append({"backend": backend, "rate": s.cell.request_rate, "figure": name, "repro": mine,
                    "bench_serving": theirs, "ratio": ratio, "within": within})
    out.append({"backend": backend, "rate": s.cell.request_rate, "figure": "failed", "repro": s.failed,
                "bench_serving": failed(summary, count), "ratio": None, "within": None})
    return out


def table(result: list[dict[str, Any]]) -> str:
    """The comparison rows as a text table."""
    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    return format_table(HEADERS, [[r["backend"], f"{r['rate']:g}/s", r["figure"], num(r["repro"]),
                                   num(r["bench_serving"]), "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
                                   {None: "", True: "yes", False: "NO"}[r["within"]]] for r in result], markdown=False)


def _cells(records: list[dict[str, Any]], profile: str, api: str | None) -> dict[float, tuple[CellSummary, int]]:
    """{rate: (summary, requests)} of the profile's open-loop cells measured through ``api``."""
    mine = [r for r in records if r["kind"] == "request" and r["cell"]["profile"] == profile
            and r["cell"].get("api") == api and r["cell"].get("request_rate") is not None]
    return {s.cell.request_rate: (s, s.requests + s.failed) for s in summarize(mine)}


def _write(out: Path, runs: list[dict[str, Any]], result: list[dict[str, Any]], *, complete: bool) -> bool:
    """Write ``bench_serving_check.json`` (``complete``: every cell's load has run); True when every verdict holds."""
    verdicts = [r["within"] for r in result if r["within"] is not None]
    passed = bool(verdicts) and all(verdicts)
    (out / "bench_serving_check.json").write_text(json.dumps(
        {"tolerance": TOLERANCE, "verdict_figures": VERDICT_FIGURES, "complete": complete, "passed": passed,
         "runs": runs, "rows": result}, indent=1) + "\n")
    return passed


def main(argv: list[str] | None = None) -> int:
    """Run bench_serving at each open-loop cell's load, write the comparison, print it; 1 if a verdict fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path, help="repro bench results (JSONL)")
    p.add_argument("--url", required=True, help="the server both measured, http://127.0.0.1:PORT")
    p.add_argument("--profile", required=True, help="the PROFILE repro bench measured it as")
    p.add_argument("--tokenizer", required=True, type=Path, help="the served model's directory (its tokenizer.json)")
    p.add_argument("--out", required=True, type=Path, help="folder for the dataset, bench_serving's output and the JSON")
    p.add_argument("--backends", default="sglang", help="comma list of sglang, sglang-oai (default sglang)")
    p.add_argument("--seed", type=int, default=1, help="repro bench's --seed (default 1)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="repro bench's (default 1024)")
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--profile-file", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per bench_serving run (default 240)")
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - set(BACKENDS):
        p.error(f"--backends must be a comma list of {', '.join(BACKENDS)}")
    records = load_records(args.results)
    profile = get_profile(args.profile, args.profile_file)
    args.out.mkdir(parents=True, exist_ok=True)
    result: list[dict[str, Any]] = []
    runs = []
    for backend in backends:
        for rate, (s, count) in sorted(_cells(records, profile.name, BACKENDS[backend]).items()):
            inputs = request_inputs(load_prompts(s.cell.prompts), profile, models_dir(args.models_dir),
                                    args.max_prompt_tokens)
            sent = [inputs[i % len(inputs)] for i in range(count)]
            cell_records = [r for r in records if r["kind"] == "request" and Cell(**r["cell"]).key == s.cell.key]
            if {r.get("config", {}).get("prompts") for r in cell_records} != {runconfig.digest(inputs)}:
                sys.exit(f"bench_serving_check: {s.cell.profile} rate {rate:g}: its requests were not built from "
                         f"{s.cell.prompts} as profile {profile.name} builds them (prompt digest differs)")
            check_arrivals(cell_records, {s.cell.key: s.cell}, args.seed, args.results[0])
            stem = args.out / f"bench_serving-{backend}-{rate:g}"
            dataset = stem.with_suffix(".dataset.json")
            dataset.write_text(json.dumps(sharegpt_rows(texts(sent, args.tokenizer), args.seed)))
            output = stem.with_suffix(".jsonl")
            output.unlink(missing_ok=True)
            argv_bs = command(s.cell, count, backend=backend, url=args.url, dataset=dataset, seed=args.seed,
                              tokenizer=args.tokenizer, output=output)
            with stem.with_suffix(".log").open("w") as log:
                code = subprocess.run(argv_bs, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout, check=False,
                                      env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).returncode
            if code != 0:
                sys.exit(f"bench_serving_check: bench_serving exited {code}; see {stem.with_suffix('.log')}")
            summary = read_summary(output)
            lens = summary.get("input_lens")
            runs.append({"backend": backend, "rate": rate, "argv": argv_bs[1:],
                         "in_repro_order": lens == [len(b.get("input_ids", [])) for b in sent] if lens else None})
            result += rows(backend, s, summary, count)
            _write(args.out, runs, result, complete=False)  # a run cut short keeps the rates it finished
    if not result:
        sys.exit(f"bench_serving_check: no open-loop cells of {profile.name} for {', '.join(backends)} in the results")
    passed = _write(args.out, runs, result, complete=True)
    print(table(result))
    print(f"\nverdict: {' and '.join(VERDICT_FIGURES)} within {TOLERANCE:.0%} of bench_serving's: "
          f"{'yes' if passed else 'NO'} ({args.out / 'bench_serving_check.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
