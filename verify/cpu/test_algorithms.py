"""Tests for `repro.algorithms`: the one table of algorithms, and the modules that read it."""

from __future__ import annotations

import pytest

from repro import algorithms
from repro.algorithms import ALGORITHMS, AR, DDTREE, DFLASH, TABLE, budgeted, drafts, from_sglang
from repro.evidence.records import ALGORITHM_ORDER
from repro.serving.profiles import get_profile
from repro.serving.sglang_server import server_argv


def test_the_names_and_their_order():
    """Profiles, results and CLIs spell them AR, DFLASH, DDTREE, and list them in that order."""
    assert ALGORITHMS == (AR, DFLASH, DDTREE) == ("AR", "DFLASH", "DDTREE")
    assert sorted(ALGORITHMS, key=ALGORITHM_ORDER.__getitem__) == list(ALGORITHMS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_sglang_values_map_back_to_their_names(name):
    """Each row's --speculative-algorithm value (none for AR) reads back as its name."""
    assert from_sglang(TABLE[name].sglang) == name
    assert (TABLE[name].sglang is None) == (not drafts(name))


def test_unknown_names_are_refused():
    """A name outside the table, or an SGLang value none of its rows has, is one ValueError."""
    with pytest.raises(ValueError, match="must be one of AR, DFLASH, DDTREE"):
        algorithms.algorithm("EAGLE")
    with pytest.raises(ValueError, match="EAGLE"):
        from_sglang("EAGLE")


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_server_command_follows_the_table(name, tmp_path):
    """server_argv passes --speculative-algorithm with the row's value only for an algorithm that
    drafts, and a budget flag only for one that takes a budget."""
    profile = get_profile("test-h200-tp1").with_algorithm(name, 8 if budgeted(name) else None)
    argv = server_argv(profile, 30000, tmp_path)
    spec = TABLE[name].sglang
    assert (argv[argv.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in argv else None) == spec
    assert ("--speculative-ddtree-budget" in argv) == budgeted(name)
