"""Tests for `repro.evidence.runconfig`: the digests `repro bench --resume` compares."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from repro.evidence import runconfig
from repro.serving.profiles import load_profiles
from verify.fake_sglang import make_models, write_profiles

INPUTS = [{"input_ids": [1, 2, 3]}]


def _profile(tmp_path: Path):
    return load_profiles(write_profiles(tmp_path / "p.toml", {"fake": {}}))["fake"]


class TestManaged:
    def test_moving_the_models_directory_changes_nothing(self, tmp_path: Path) -> None:
        """The same models under another directory give the same digests."""
        profile = _profile(tmp_path)
        make_models(tmp_path / "a")
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        assert runconfig.managed(profile, tmp_path / "a", INPUTS) == \
            runconfig.managed(profile, tmp_path / "b", INPUTS)

    def test_each_part_follows_what_it_covers(self, tmp_path: Path) -> None:
        """A server flag, a model's config and the prompts each change their own digest."""
        profile = _profile(tmp_path)
        root = make_models(tmp_path / "m")
        base = runconfig.managed(profile, root, INPUTS)
        flagged = runconfig.managed(dataclasses.replace(profile, sglang={"page-size": 2}), root, INPUTS)
        assert runconfig.differences(base, flagged) == ["server command"]
        assert runconfig.differences(base, runconfig.managed(profile, root, [{"text": "x"}])) == ["prompt set"]
        (root / "drafter" / "config.json").write_text('{"vocab_size": 8}')
        assert runconfig.differences(base, runconfig.managed(profile, root, INPUTS)) == ["model set"]
        assert runconfig.differences(None, base) == list(runconfig.PARTS.values())


class TestRunning:
    def test_launch_details_are_left_out(self) -> None:
        """Host, port and live states of a --url server do not count; its budget does."""
        info = {"model_path": "/m/t", "speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 8,
                "port": 30000, "host": "127.0.0.1", "internal_states": [{"x": 1}]}
        again = {**info, "port": 31000, "internal_states": [{"x": 2}]}
        assert runconfig.running(info, INPUTS) == runconfig.running(again, INPUTS)
        other = {**info, "speculative_ddtree_budget": 16}
        assert runconfig.differences(runconfig.running(info, INPUTS),
                                     runconfig.running(other, INPUTS)) == ["server command"]
