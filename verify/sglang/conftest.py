"""Fixtures of the end-to-end tier: the project's test models, written once per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from repro import testmodels


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """planted/ (with its tokenizer), random/, dflash/ and hook.json (in $REPRO_E2E_MODELS if set,
    else a temp dir)."""
    root = Path(os.environ.get("REPRO_E2E_MODELS") or tmp_path_factory.mktemp("models"))
    if not (root / "planted" / "tokenizer.json").exists():
        testmodels.write_all(root)
    return root


@pytest.fixture(scope="session")
def planted(models) -> dict:
    """planted.json of the planted target: ranked next tokens and their served logits."""
    return json.loads((models / "planted" / "planted.json").read_text())
