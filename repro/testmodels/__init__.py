"""Test models the project makes itself (``python -m repro.testmodels OUT_DIR``).

- ``planted``: the planted construction (a target whose greedy output and sampling law are known
  exactly) and the drafter test-hook file;
- ``small``: the 4-layer written targets (``planted/``, ``random/``, ``mla-planted/``,
  ``mla-random/``), their DFlash drafter (``dflash/``), ``hook.json``, and the config-only
  ``moe/`` + ``moe-dflash/`` pair;
- ``fullsize``: full-size planted targets as data (``repro/data/models/``): Qwen3-8B and the
  one-GPU share of Kimi-K2.6 under TP8, with drafters of their published DFlash drafters' shapes,
  written as configs and planted in memory at load;
- ``plant``: planting a loaded model in place (patch 0005, ``SGLANG_REPRO_PLANT``).

``OUT_DIR`` receives every model: the small ones with weights, the full-size ones as
``NAME/`` (config.json, planted.json, hook.json) and ``NAME-dflash/`` (config.json).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.testmodels.fullsize import MODELS, expert_spread, load_model, write_fullsize
from repro.testmodels.planted import (
    DEFAULT_RANK_PROBS,
    LOGITS,
    greedy_continuation,
    next_token_probs,
    planted_ranked,
    successor_table,
    write_hook,
)
from repro.testmodels.small import (
    DEEPSEEK_V3,
    DFLASH,
    KIMI_MOE,
    QWEN3,
    write_drafter,
    write_mla_moe,
    write_moe_pair,
    write_planted,
    write_random,
)

__all__ = [
    "DEEPSEEK_V3", "DEFAULT_RANK_PROBS", "DFLASH", "KIMI_MOE", "LOGITS", "QWEN3", "greedy_continuation",
    "main", "next_token_probs", "planted_ranked", "successor_table", "write_all", "write_drafter",
    "write_hook", "write_mla_moe", "write_moe_pair", "write_planted", "write_random",
]
SPREAD_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 513)


def write_all(out: Path, *, seed: int = 0) -> dict:
    """Write every test model under ``out``; return the small planted target's planted.json.

    planted/, random/ (Qwen3), mla-planted/, mla-random/ (DeepseekV3: MLA + MoE), dflash/ (the
    drafter for all of them), hook.json, the config-only moe/ + moe-dflash/ pair, and each
    full-size model's two directories.
    """
    planted = write_planted(out / "planted", seed=seed)
    write_random(out / "random", seed=seed + 1)
    write_mla_moe(out / "mla-planted", planted=planted, seed=seed + 3)
    write_mla_moe(out / "mla-random", planted=None, seed=seed + 4)
    write_drafter(out / "dflash", seed=seed + 2)
    write_hook(out / "hook.json", planted, seed=seed)
    write_moe_pair(out)
    write_fullsize(out)
    return planted


def _print_spread(name: str) -> None:
    spread = expert_spread(load_model(name), list(SPREAD_COUNTS))
    print(f"{name}: distinct experts per MoE layer for N distinct tokens (min / mean / max over layers)")
    for n, per_layer in spread.items():
        print(f"  N={n:4d}  {min(per_layer):4d} / {sum(per_layer) / len(per_layer):6.1f} / {max(per_layer):4d}")


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.testmodels OUT_DIR [--seed N]`` or ``--spread NAME``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", help="directory to write every test model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", choices=[m for m in MODELS if "n_routed_experts" in load_model(m).target],
                        help="print the router spread of a full-size MoE target instead of writing")
    args = parser.parse_args(argv)
    if args.spread:
        _print_spread(args.spread)
        return 0
    if args.out is None:
        parser.error("OUT_DIR is required (or --spread NAME)")
    write_all(args.out, seed=args.seed)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} under {args.out}")
    return 0
