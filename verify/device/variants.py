"""Profile variants as data: the packaged ``profiles.toml`` with some tables changed, for ``--profile-file``.

A variant table updates the profile of its name key by key (nested tables such as ``sglang`` and
``env`` merged, not replaced), or, with ``base = "OTHER"``, adds a profile: a copy of OTHER updated
so. A KV cap is the variant ``{ sglang = { max-total-tokens = N } }``: SGLang takes
``mem-fraction-static`` of the memory free at each server's start, which servers started together
share, so each is capped instead.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.files import read_toml
from repro.serving.profiles import load_profiles
from verify.cli_inputs import toml_text

PACKAGED = Path(__file__).resolve().parents[2] / "repro" / "data" / "profiles.toml"


def _merge(table: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(table)
    for key, value in changes.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def kv_cap(profiles: list[str], tokens: int) -> dict[str, dict[str, Any]]:
    """The variants capping each of ``profiles`` at ``tokens`` KV-cache tokens."""
    return {name: {"sglang": {"max-total-tokens": tokens}} for name in profiles}


def apply_variants(variants: dict[str, dict[str, Any]], where: str) -> str:
    """The packaged profiles with ``variants`` applied, as TOML text, validated as ``repro bench``
    reads it; a UsageError naming ``where`` and the profile otherwise."""
    profiles = copy.deepcopy(read_toml(PACKAGED, "profiles.toml")["profiles"])
    for name, changes in variants.items():
        base = changes.get("base", name)
        if base not in profiles:
            msg = f"{where}: profile variant '{name}' changes no profile (no profile {base!r})"
            raise UsageError(msg)
        profiles[name] = _merge(profiles[base], {k: v for k, v in changes.items() if k != "base"})
    text = toml_text({"profiles": profiles})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profiles.toml"
        path.write_text(text)
        try:
            load_profiles(path)
        except UsageError as exc:
            msg = f"{where}: profile variants: {str(exc).replace(str(path), 'profiles.toml')}"
            raise UsageError(msg) from None
    return text
