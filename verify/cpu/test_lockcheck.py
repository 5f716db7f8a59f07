"""Tests for `repro.stack.lockcheck` on the real uv.lock, pyproject.toml and stack.toml, and on mutated
copies showing each check fails on the mistake it guards. Checks that need Nix (flake.lock against
flake.nix, the evaluated shells) are exercised in test_nix_flake.py."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path

import pytest

from repro.stack.lockcheck import parse_flake_url, shell_env_problems, target_problems, uv_lock_problems
from repro.stack.pins import STACK_TOML, load_stack, parse_stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real() -> dict:
    """The parsed pyproject.toml and uv.lock of the repository (never mutated)."""
    return {
        name: tomllib.loads((ROOT / name).read_text()) for name in ("pyproject.toml", "uv.lock")
    }


@pytest.fixture
def files(real: dict) -> dict:
    """The pinned stack and deep copies of the parsed files, safe to mutate."""
    parsed = copy.deepcopy(real)
    return {
        "stack": load_stack(),
        "pyproject": parsed["pyproject.toml"],
        "uvlock": parsed["uv.lock"],
    }


def _with_pin(files: dict, **pins: str) -> None:
    stack = files["stack"]
    files["stack"] = dataclasses.replace(stack, packages={**stack.packages, **pins})


def _package(uvlock: dict, name: str) -> dict:
    return next(p for p in uvlock["package"] if p["name"] == name)


class TestUvLock:
    def test_real_lock_matches_the_stack(self, files: dict):
        """uv.lock and the gpu extra pin exactly stack.toml's versions, every file hashed."""
        assert uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"]) == []

    def test_every_pinned_wheel_has_a_sha256(self, files: dict):
        """Each wheel of each pinned package carries a sha256 hash."""
        for name in files["stack"].packages:
            wheels = _package(files["uvlock"], name)["wheels"]
            assert all(w["hash"].startswith("sha256:") for w in wheels)

    def test_fails_on_a_lock_at_another_version(self, files: dict):
        """A stack.toml pin that uv.lock does not hold is reported."""
        _with_pin(files, torch="2.12.0")
        problems = uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"])
        assert "uv.lock: torch must be locked once, at 2.12.0 (got ['2.11.0'])" in problems

    def test_fails_on_a_file_without_a_hash(self, files: dict):
        """A locked wheel without a sha256 hash is reported, naming the file."""
        del _package(files["uvlock"], "sglang")["wheels"][0]["hash"]
        problems = uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"])
        assert any(p.startswith("uv.lock: sglang file sglang-0.5.17-") for p in problems)

    def test_fails_on_a_gpu_extra_that_differs_from_the_stack(self, files: dict):
        """A gpu extra pinning another version than stack.toml is reported."""
        extra = files["pyproject"]["project"]["optional-dependencies"]["gpu"]
        extra[extra.index("triton==3.6.0")] = "triton==3.5.0"
        problems = uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"])
        assert any(p.startswith("pyproject.toml: extra gpu must be") for p in problems)

    def test_fails_on_a_lock_not_made_from_the_gpu_pins(self, files: dict):
        """A lock whose recorded gpu requirements differ from the pins is reported as stale."""
        project = _package(files["uvlock"], "k26-ddtree-repro")
        for req in project["metadata"]["requires-dist"]:
            if req["name"] == "sglang-kernel":
                req["specifier"] = "==0.4.4"
        problems = uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"])
        assert any(
            "was not locked from these gpu pins" in p and "sglang-kernel" in p for p in problems
        )

    def test_fails_on_a_cuda_toolkit_of_another_cuda(self, files: dict):
        """A cuda-toolkit wheel that is not the stack's CUDA version is reported."""
        files["stack"] = dataclasses.replace(files["stack"], cuda="12.9")
        problems = uv_lock_problems(files["stack"], files["pyproject"], files["uvlock"])
        assert any(p.startswith("uv.lock: cuda-toolkit must be one 12.9.x wheel") for p in problems)


class TestTargets:
    def test_real_targets_are_consistent(self):
        """Every target's arch lists follow from its capabilities."""
        assert target_problems(load_stack().targets) == []

    def test_fails_on_a_wrong_arch_list(self):
        """sm100 without 10.3 (B300) in its torch arch list is reported."""
        text = STACK_TOML.read_text()
        assert 'torch-cuda-arch-list = "10.0;10.3"' in text
        stack = parse_stack(text.replace('"10.0;10.3"', '"10.0"'))
        assert target_problems(stack.targets) == [
            "stack.toml: targets.sm100.torch-cuda-arch-list must be '10.0;10.3' (got '10.0')"
        ]

    def test_shell_env_check_reports_a_missing_shell(self):
        """A target without a devShell is reported."""
        stack = load_stack()
        assert shell_env_problems(stack, {}) == [
            f"flake: no devShell for target {name}" for name in sorted(stack.targets)
        ]


class TestParseFlakeUrl:
    def test_github_with_ref(self):
        """A github URL with a branch becomes owner, repo, ref and type."""
        assert parse_flake_url("github:NixOS/nixpkgs/nixos-26.05") == {
            "owner": "NixOS",
            "repo": "nixpkgs",
            "ref": "nixos-26.05",
            "type": "github",
        }

    def test_rejects_a_malformed_github_url(self):
        """A github URL without a repository is a ValueError naming the URL."""
        with pytest.raises(ValueError, match=r"github:owner/repo\[/ref\] \(got 'github:NixOS'\)"):
            parse_flake_url("github:NixOS")
