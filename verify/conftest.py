"""Shared pytest set-up: hypothesis profiles and the hardware/software tiers.

Tiers are folders plus markers (registered in pyproject.toml). A test marked ``gpu`` skips with a
stated reason when CUDA is absent; ``sglang`` skips when the pinned SGLang is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=120,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (gpu tier runs on the GPU machine)"
    return None


def _sglang_reason() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed (install the pinned stack: `repro install-offline`)"
    return _cuda_reason()


def _nix_reason() -> str | None:
    if shutil.which("nix") is None or shutil.which("nix-instantiate") is None:
        return "the nix CLI is not installed (.ci/run installs Debian's nix-bin)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tier tests whose hardware or software is missing, saying why."""
    reasons = {"gpu": _cuda_reason(), "sglang": _sglang_reason(), "nix": _nix_reason()}
    for item in items:
        for marker, reason in reasons.items():
            if reason and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=f"[{marker} tier] {reason}"))
