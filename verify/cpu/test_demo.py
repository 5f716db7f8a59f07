"""Tests for `repro demo` (and the CLI dispatcher it runs through)."""

from __future__ import annotations

import pytest

from repro.cli import VERBS
from repro.cli import main as cli


def test_demo_runs_lossless_end_to_end(capsys):
    """A small demo prints trees, a tau table and the lossless verdict, and exits 0."""
    assert cli(["demo", "--budgets", "0,4,32", "--new-tokens", "24", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "round 1, request 0, B=32" in out and "mean tau" in out
    assert "lossless: every DDTree decode equals greedy AR decoding" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budgets", "4,-1"], "--budgets must be integers >= 0 (got '4,-1')"),
        (["--budgets", "a"], "--budgets must be comma-separated integers (got 'a')"),
        (["--batch", "0"], "--batch must be >= 1 (got 0)"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0 (got -1.0)"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(flags, message, capsys):
    """User mistakes print `repro demo: <message>` and exit 2, never a traceback."""
    assert cli(["demo", *flags]) == 2
    assert capsys.readouterr().err.strip() == f"repro demo: {message}"


def test_help_lists_every_verb(capsys):
    """`repro --help` lists every verb without importing their modules."""
    with pytest.raises(SystemExit):
        cli(["--help"])
    out = capsys.readouterr().out
    assert all(verb in out for verb in VERBS)
