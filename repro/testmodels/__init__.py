"""`repro testmodels OUT`: write the test models the project makes itself (or ``--spread NAME``).

Their configurations are data, ``repro/data/models/*.toml`` (read by ``configs``); the modules
here make the rest:

- ``planted``: the planted construction (a target whose greedy output and sampling law are known
  exactly) and the drafter test-hook file;
- ``small``: the 4-layer written targets (``planted/``, ``random/``, ``mla-planted/``,
  ``mla-random/``), their DFlash drafter (``dflash/``), ``hook.json``, and the config-only
  ``moe/`` + ``moe-dflash/`` pair;
- ``fullsize``: full-size planted targets, Qwen3-8B and the one-GPU share of Kimi-K2.6 under TP8,
  with drafters of their published DFlash drafters' shapes, written as configs and planted in
  memory at load;
- ``plant``: planting a loaded model in place (patch 0005, ``SGLANG_REPRO_PLANT``);
- ``tokenizer``: the planted targets' tokenizer (a word per id, byte fallback, a chat template).

``OUT`` receives every model: the small ones with weights, the full-size ones as ``NAME/``
(config.json, planted.json, hook.json) and ``NAME-dflash/`` (config.json); each planted target
(``planted/``, ``mla-planted/``, ``NAME/``) also gets its tokenizer. ``--spread NAME``
prints, instead, how many distinct experts N distinct tokens activate per MoE layer of a
full-size target, and how many a DDTREE tree's tokens do. torch is imported only when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.argtypes import integer
from repro.errors import UsageError
from repro.evidence.prompts import DISTINCT
from repro.testmodels.configs import FULLSIZE, read_model

PLANTED_TARGETS = ("planted", "mla-planted", *FULLSIZE)  # the directories that get a tokenizer
SPREAD_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 513)
SPREAD_BUDGETS = (16, 32, 64, 128, 256, 512)
SPREAD_PROMPTS, SPREAD_NUM_PROMPTS = DISTINCT, 16  # repro bench's, as the bench-* experiments run it
OUT_EXPECTED = "a directory to write the test models into"


def write_all(out: Path, *, seed: int = 0) -> dict:
    """Write every test model under ``out``; return the small planted target's planted.json.

    The small models (repro.testmodels.small.write_small; ``seed`` seeds their weights), each
    full-size model's two directories, and the planted targets' tokenizers.
    """
    from repro.testmodels.fullsize import write_fullsize
    from repro.testmodels.small import write_small
    from repro.testmodels.tokenizer import write_tokenizer

    planted = write_small(out, seed=seed)
    write_fullsize(out)
    for name in PLANTED_TARGETS:
        write_tokenizer(out / name)
    return planted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``OUT [--seed N]`` or ``--spread NAME``."""
    moe = [name for name in FULLSIZE if "n_routed_experts" in read_model(name)["target"]]
    parser.add_argument("out", type=Path, nargs="?", metavar="OUT", help=OUT_EXPECTED)
    parser.add_argument("--seed", type=integer(0, 2**32 - 1), default=0,
                        help="seed of the small models' weights (default 0)")
    parser.add_argument("--spread", choices=moe, metavar="NAME",
                        help=f"print the router spread of a full-size MoE target ({', '.join(moe)}) instead")


def _check_out(out: Path) -> None:
    """UsageError when ``out``, or the nearest of its parents that exists, is not a directory."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        msg = f"OUT: {existing} is not a directory (expected {OUT_EXPECTED})"
        raise UsageError(msg)


def _print_spread(name: str) -> None:
    from repro.testmodels import fullsize

    model = fullsize.load_model(name)
    spread = fullsize.expert_spread(model, list(SPREAD_COUNTS))
    print(f"{name}: distinct experts per MoE layer for N distinct tokens (min / mean / max over layers)")
    for n, per_layer in spread.items():
        print(f"  N={n:4d}  {min(per_layer):4d} / {sum(per_layer) / len(per_layer):6.1f} / {max(per_layer):4d}")
    prompts = fullsize.prompt_ids(model, SPREAD_NUM_PROMPTS, SPREAD_PROMPTS)
    print(f"{name}: a DDTREE tree's B + 1 tokens as the test hook drafts them (first round of {len(prompts)} "
          f"{SPREAD_PROMPTS} prompts): distinct tokens and mean distinct experts per MoE layer")
    for budget, (tokens, experts) in fullsize.tree_spread(model, list(SPREAD_BUDGETS), prompts).items():
        print(f"  B={budget:4d}  tokens {tokens:6.1f}  experts {experts:6.1f}")


def main(args: argparse.Namespace) -> int:
    """Write every test model into OUT, or print a full-size target's router spread."""
    if args.spread and args.out is not None:
        msg = f"give OUT or --spread, not both (got OUT {args.out} and --spread {args.spread})"
        raise UsageError(msg)
    if args.spread:
        _print_spread(args.spread)
        return 0
    if args.out is None:
        msg = f"OUT is required ({OUT_EXPECTED}), or --spread NAME"
        raise UsageError(msg)
    _check_out(args.out)
    write_all(args.out, seed=args.seed)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} under {args.out}")
    return 0
