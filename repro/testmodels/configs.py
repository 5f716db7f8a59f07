"""The test models' configurations as data: ``repro/data/models/NAME.toml`` in, ``config.json`` out.

Every table holds a ``description`` and a ``target`` config (a model's ``config.json``); most
also a ``drafter`` config. The full-size ones add the memory ``budget``, the planting seeds
(``plant``), their ``sources`` and the published ``reference`` configs they derive from
(repro.testmodels.fullsize). Standard library only, so ``repro testmodels --help`` stays fast.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Collection
from importlib import resources
from pathlib import Path
from typing import Any

SMALL_QWEN3 = "small-qwen3"  # planted/, random/ and their drafter dflash/
SMALL_MLA_MOE = "small-mla-moe"  # mla-planted/, mla-random/
SMALL_KIMI_MOE = "small-kimi-moe"  # moe/ + moe-dflash/, configs only
FULLSIZE = ("qwen3-8b", "k26-tp8")
SHARES = ("k26-tp8", "k26-ep8")  # one GPU's share of Kimi-K2.6 at 8 GPUs: TP8, and TP8 + EP8 (repro.testmodels.shares)
_KEYS = frozenset({"description", "gpu-share", "sources", "budget", "plant", "reference", "target", "drafter", "share"})


def read_model(name: str, required: Collection[str] = ("description", "target")) -> dict[str, Any]:
    """The table ``repro/data/models/NAME.toml``; ValueError naming the file and the keys wrong."""
    path = Path(str(resources.files("repro") / "data" / "models" / f"{name}.toml"))
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        msg = f"{path}: cannot read the model table ({exc})"
        raise ValueError(msg) from None
    unknown, missing = set(data) - _KEYS, set(required) - set(data)
    if unknown or missing:
        msg = f"{path}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}"
        raise ValueError(msg)
    return data


def write_config(out_dir: Path, cfg: dict) -> None:
    """``out_dir/config.json`` (the directory made if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
