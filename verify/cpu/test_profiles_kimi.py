"""The Kimi K2.6 profiles serve with the parsers SGLang documents for Kimi, and every algorithm's
server command (DDTREE's above all) carries them in a form SGLang's own argument parser accepts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from repro.serving.profiles import load_profiles
from repro.serving.sglang_server import server_argv

PARSERS = {"tool-call-parser": "kimi_k2", "reasoning-parser": "kimi_k2"}
KIMI = sorted(name for name, p in load_profiles().items() if p.model == "Kimi-K2.6")


def _argv(name: str, algorithm: str) -> list[str]:
    """The server command of profile ``name`` run with ``algorithm``, without ``python -m MODULE``."""
    profile = load_profiles()[name].with_algorithm(algorithm)
    return server_argv(profile, 30000, Path("models"))[3:]


def test_the_kimi_profiles_are_the_five_deployments():
    """Every profile of the real Kimi-K2.6 model is one of the five shipped deployments."""
    assert KIMI == ["k26-b300-ep8", "k26-b300-tp8", "k26-h200-tp8", "k26-pro6000-ep8", "k26-pro6000-tp8"]


@pytest.mark.parametrize("name", KIMI)
@pytest.mark.parametrize("algorithm", ["DDTREE", "DFLASH", "AR"])
def test_server_command_carries_the_kimi_parsers(name, algorithm):
    """The profile's sglang table holds both parsers, and its command passes each as --flag kimi_k2."""
    assert load_profiles()[name].sglang.items() >= PARSERS.items()
    argv = _argv(name, algorithm)
    for flag, value in PARSERS.items():
        assert argv[argv.index(f"--{flag}") + 1] == value
    assert ("--speculative-algorithm" in argv) == (algorithm != "AR")


@pytest.mark.sglang
@pytest.mark.parametrize("name", KIMI)
def test_sglang_parses_the_ddtree_command(name):
    """SGLang 0.5.17's own parser (its choices for both parsers) accepts every Kimi DDTREE command."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(_argv(name, "DDTREE"))
    assert (args.tool_call_parser, args.reasoning_parser, args.speculative_algorithm) == ("kimi_k2", "kimi_k2", "DDTREE")
