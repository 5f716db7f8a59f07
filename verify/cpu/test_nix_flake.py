"""Offline checks of flake.nix, nix/ and flake.lock, each shown to fail on the mistake it guards.

Real nixpkgs cannot be evaluated here (no GitHub, Nix 2.8), so the flake is evaluated with every
input overridden by the stub flakes in nix/stubs; everything runs on a temporary copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from repro.stack.lockcheck import flake_lock_problems, shell_env_problems
from repro.stack.pins import load_stack

pytestmark = pytest.mark.nix

ROOT = Path(__file__).resolve().parents[2]
# Everything the flake reads. A file the flake starts reading must be added here.
FLAKE_FILES = ("flake.nix", "flake.lock", "nix", "patches", "pyproject.toml", "uv.lock", "repro")
STUBS = {
    "nixpkgs": "nixpkgs",
    "pyproject-nix": "pyproject-nix",
    "uv2nix": "uv2nix",
    "pyproject-build-systems": "build-system-pkgs",
}
SYSTEM = "x86_64-linux"
NIX_ENV = {
    **os.environ,
    # Flakes on Debian's Nix 2.8, no build users, no registry or binary cache lookups.
    "NIX_CONFIG": "experimental-features = nix-command flakes\nbuild-users-group =\n"
    "flake-registry =\nsubstituters =\n",
}
# Removes the attribute at `path` from a set, keeping everything else.
DROP = """let drop = set: path: let h = builtins.head path; in
  if builtins.length path == 1 then builtins.removeAttrs set [ h ]
  else set // { ${h} = drop set.${h} (builtins.tail path); }; in drop"""


def nix(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the nix CLI with flakes enabled and no network lookups."""
    return subprocess.run(
        ["nix", *args], env=NIX_ENV, capture_output=True, text=True, timeout=300, check=False
    )


def stub_overrides(flake: Path) -> list[str]:
    """``--override-input`` arguments pointing every input at its stub."""
    args = ["--no-write-lock-file"]
    for name, stub in STUBS.items():
        args += ["--override-input", name, f"path:{flake}/nix/stubs/{stub}"]
    return args


def evaluate(flake: Path) -> subprocess.CompletedProcess[str]:
    """``nix flake check --no-build``, then apps and formatter, which Nix 2.8's check skips."""
    check = nix("flake", "check", "--no-build", f"path:{flake}", *stub_overrides(flake))
    if check.returncode != 0:
        return check
    programs = "builtins.mapAttrs (_: app: app.program)"
    apps = nix(
        "eval", "--json", f"path:{flake}#apps.{SYSTEM}", "--apply", programs, *stub_overrides(flake)
    )
    if apps.returncode != 0:
        return apps
    return nix("eval", "--raw", f"path:{flake}#formatter.{SYSTEM}.drvPath", *stub_overrides(flake))


def eval_json(flake: Path, attr: str, apply: str | None = None) -> object:
    """``nix eval --json`` of one flake attribute with the stubs; fails the test on an error."""
    extra = ["--apply", apply] if apply else []
    done = nix("eval", "--json", f"path:{flake}#{attr}", *extra, *stub_overrides(flake))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def flake_inputs(flake: Path) -> dict:
    """``(import ./flake.nix).inputs`` as JSON."""
    done = subprocess.run(
        [
            "nix-instantiate",
            "--eval",
            "--strict",
            "--json",
            "-E",
            f"(import {flake}/flake.nix).inputs",
        ],
        env=NIX_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def nix_literal(value: object) -> str:
    """A Nix expression for JSON-like data (attribute sets of strings)."""
    if isinstance(value, dict):
        return (
            "{ " + " ".join(f"{json.dumps(k)} = {nix_literal(v)};" for k, v in value.items()) + " }"
        )
    return json.dumps(value)


def shell_envs(flake: Path) -> dict[str, dict[str, str]]:
    """The environment attributes of every evaluated devShell."""
    keys = (
        "REPRO_TARGET REPRO_CAPABILITIES TORCH_CUDA_ARCH_LIST FLASHINFER_CUDA_ARCH_LIST CC "
        "CUDA_HOME TRITON_PTXAS_PATH C_INCLUDE_PATH REPRO_DRIVER_LIBS shellHook drvPath"
    )
    return eval_json(
        flake, f"devShells.{SYSTEM}", f"builtins.mapAttrs (_: d: {{ inherit (d) {keys}; }})"
    )


@pytest.fixture
def flake(tmp_path: Path) -> Path:
    """A copy of the files the flake reads, safe to mutate."""
    dest = tmp_path / "flake"
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    for name in FLAKE_FILES:
        src, dst = ROOT / name, dest / name
        shutil.copytree(src, dst, ignore=ignore) if src.is_dir() else shutil.copy2(src, dst)
    return dest


def _default_target() -> str:
    return tomllib.loads((ROOT / "repro/data/stack.toml").read_text())["default-target"]



def _parse(path: Path) -> subprocess.CompletedProcess:
    """``nix-instantiate --parse`` of one file, output captured."""
    return subprocess.run(["nix-instantiate", "--parse", str(path)], env=NIX_ENV,
                          capture_output=True, text=True, check=False)

class TestParse:
    def test_every_nix_file_parses(self):
        """nix-instantiate --parse accepts every .nix file of the repository."""
        files = [ROOT / "flake.nix", *sorted((ROOT / "nix").rglob("*.nix"))]
        for path in files:
            done = _parse(path)
            assert done.returncode == 0, f"{path}: {done.stderr}"

    def test_parse_rejects_a_syntax_error(self, tmp_path: Path):
        """A .nix file with a syntax error fails the parse check."""
        bad = tmp_path / "bad.nix"
        bad.write_text("{ a = ; }\n")
        done = _parse(bad)
        assert done.returncode != 0
        assert "syntax error" in done.stderr


class TestEvaluation:
    def test_flake_evaluates_with_stub_inputs(self, flake: Path):
        """Every output (checks, packages, apps, devShells, formatter) evaluates on the stubs."""
        done = evaluate(flake)
        assert done.returncode == 0, done.stderr

    def test_outputs_cover_every_target(self, flake: Path):
        """Each target has a devShell, a venv package and a verify app; defaults exist."""
        targets = set(load_stack().targets)
        names = "builtins.attrNames"
        assert set(eval_json(flake, f"devShells.{SYSTEM}", names)) == targets | {"default"}
        assert set(eval_json(flake, f"packages.{SYSTEM}", names)) == targets | {
            "default",
            "sglang-patched",
        }
        assert set(eval_json(flake, f"apps.{SYSTEM}", names)) == {
            f"verify-{t}" for t in targets
        } | {"verify"}

    @pytest.mark.parametrize(
        ("stub", "path"),
        [
            ("nixpkgs", ["symlinkJoin"]),
            ("nixpkgs", ["writeShellApplication"]),
            ("nixpkgs", ["nixfmt"]),
            ("nixpkgs", ["cudaPackages_13_0", "cuda_nvrtc"]),
            ("nixpkgs", ["lib", "getDev"]),
            ("uv2nix", ["lib", "workspace", "loadWorkspace"]),
            ("pyproject-build-systems", ["overlays", "wheel"]),
        ],
    )
    def test_evaluation_fails_when_a_stub_lacks_what_the_flake_uses(
        self, flake: Path, stub: str, path: list[str]
    ):
        """A stub without a function the flake calls makes the offline evaluation fail."""
        stub_dir = flake / "nix/stubs" / STUBS[stub]
        dropped = "[ " + " ".join(f'"{p}"' for p in path) + " ]"
        if stub == "nixpkgs":  # the flake calls `import nixpkgs { ... }`: wrap default.nix
            (stub_dir / "default.nix").rename(stub_dir / "real.nix")
            (stub_dir / "default.nix").write_text(
                f"args: ({DROP}) (import ./real.nix args) {dropped}\n"
            )
        else:  # wrap the stub flake's outputs
            inputs = nix_literal(flake_inputs(stub_dir))  # Nix wants `inputs` written out
            (stub_dir / "flake.nix").rename(stub_dir / "real.nix")
            (stub_dir / "flake.nix").write_text(
                f"{{\n  inputs = {inputs};\n"
                f"  outputs = args: ({DROP}) ((import ./real.nix).outputs args) {dropped};\n}}\n"
            )
        done = evaluate(flake)
        assert done.returncode != 0
        assert f"attribute '{path[-1]}' missing" in done.stderr


class TestPatchSeries:
    def test_evaluation_fails_on_a_patch_missing_from_the_series(self, flake: Path):
        """A .patch file in the series directory that series does not list fails evaluation."""
        series_dir = next((flake / "patches/sglang").iterdir())
        (series_dir / "0099-orphan.patch").write_text("--- a/x\n+++ b/x\n")
        done = evaluate(flake)
        assert done.returncode != 0
        assert "0099-orphan.patch not listed" in done.stderr

    def test_evaluation_fails_on_a_listed_patch_that_does_not_exist(self, flake: Path):
        """A series entry without its file fails evaluation, naming the file."""
        series = next((flake / "patches/sglang").iterdir()) / "series"
        series.write_text(series.read_text() + "0098-missing.patch\n")
        done = evaluate(flake)
        assert done.returncode != 0
        assert "lists 0098-missing.patch, which do not exist" in done.stderr

    def test_sglang_install_applies_the_series_with_repro_patch(self, flake: Path):
        """The sglang build runs repro.patch (the CLI's code path) on its installed tree."""
        script = eval_json(flake, f"packages.{SYSTEM}.sglang-patched.postInstall")
        assert "from repro.patch import run" in script
        assert '"$out/lib/python3.12/site-packages"' in script

    def test_patch_source_holds_what_repro_patch_needs(self, flake: Path, tmp_path: Path):
        """The source Nix hands the sglang build imports repro.patch and reads the series."""
        script = eval_json(flake, f"packages.{SYSTEM}.sglang-patched.postInstall")
        src = re.search(r"PYTHONPATH=(\S+)", script).group(1)
        version = load_stack().packages["sglang"]
        probe = f"from repro.patch import load_series; print(len(load_series({version!r})))"
        done = subprocess.run(
            [sys.executable, "-S", "-c", probe],
            env={"PYTHONPATH": src},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        series = (ROOT / f"patches/sglang/{version}/series").read_text().splitlines()
        assert int(done.stdout) == len([s for s in series if s.strip() and not s.startswith("#")])


class TestShells:
    def test_shell_env_matches_the_stack(self, flake: Path):
        """Each devShell carries its target's arch lists, capability and JIT paths."""
        shells = shell_envs(flake)
        assert shell_env_problems(load_stack(), shells) == []
        assert shells["default"]["drvPath"] == shells[_default_target()]["drvPath"]
        for shell in shells.values():  # exported again after nixpkgs' setup hooks reset CC
            assert f"export CC='{shell['CC']}'\n" in shell["shellHook"]
            assert shell["shellHook"].endswith("-shell-hook.sh\n")

    def test_evaluated_shell_hook_sets_the_target_environment(self, flake: Path, tmp_path: Path):
        """Bash running sm100's evaluated shellHook gets its arch lists, driver dir and cache."""
        hook = shell_envs(flake)["sm100"]["shellHook"]
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{hook}\nenv -0"],
            env={**env, "REPRO_DRIVER_SEARCH_PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)},
            capture_output=True,
            check=True,
        )
        out = dict(kv.split("=", 1) for kv in done.stdout.decode().split("\0") if "=" in kv)
        assert (out["TORCH_CUDA_ARCH_LIST"], out["FLASHINFER_CUDA_ARCH_LIST"]) == (
            "10.0;10.3",
            "10.0a 10.3a",
        )
        assert out["TRITON_LIBCUDA_PATH"] == out["LD_LIBRARY_PATH"] == out["REPRO_DRIVER_DIR"]
        assert out["TRITON_CACHE_DIR"] == str(tmp_path / "repro/triton-sm100")

    def test_shell_env_check_fails_on_a_wrong_arch_list(self, flake: Path):
        """A shell wired to the wrong arch list is reported against stack.toml."""
        env = flake / "nix/env.nix"
        wired = "TORCH_CUDA_ARCH_LIST = t.torch-cuda-arch-list;"
        assert wired in env.read_text()
        env.write_text(env.read_text().replace(wired, 'TORCH_CUDA_ARCH_LIST = "9.0";'))
        problems = shell_env_problems(load_stack(), shell_envs(flake))
        assert any(
            "devShells.sm100: TORCH_CUDA_ARCH_LIST must be '10.0;10.3'" in p for p in problems
        )


class TestFlakeLock:
    def test_flake_lock_matches_flake_inputs(self):
        """Every input of flake.nix has a real lock node (rev, narHash) whose original matches."""
        lock = json.loads((ROOT / "flake.lock").read_text())
        assert flake_lock_problems(flake_inputs(ROOT), lock) == []

    def test_lock_check_fails_on_an_input_missing_from_the_lock(self, flake: Path):
        """Dropping an input's node from flake.lock is reported, naming the input."""
        lock = json.loads((flake / "flake.lock").read_text())
        del lock["nodes"]["uv2nix"], lock["nodes"]["root"]["inputs"]["uv2nix"]
        problems = flake_lock_problems(flake_inputs(flake), lock)
        assert any("input uv2nix of flake.nix has no lock node" in p for p in problems)

    def test_stub_evaluation_alone_does_not_see_a_stale_lock(self, flake: Path):
        """Overrides hide a lock lacking an input, which is why the lock is checked separately."""
        lock_path = flake / "flake.lock"
        lock = json.loads(lock_path.read_text())
        del lock["nodes"]["uv2nix"], lock["nodes"]["root"]["inputs"]["uv2nix"]
        lock_path.write_text(json.dumps(lock))
        assert evaluate(flake).returncode == 0

    def test_lock_check_fails_on_a_changed_input_url(self, flake: Path):
        """flake.nix following another branch than the lock's original is reported."""
        nix_file = flake / "flake.nix"
        nix_file.write_text(nix_file.read_text().replace("nixos-26.05", "nixos-25.11"))
        lock = json.loads((flake / "flake.lock").read_text())
        problems = flake_lock_problems(flake_inputs(flake), lock)
        assert any(p.startswith("flake.lock: nixpkgs.original must be") for p in problems)

    def test_lock_check_fails_on_a_path_input_leaked_into_the_lock(self, flake: Path):
        """A lock that Nix wrote while the inputs were overridden by stubs is rejected."""
        args = [a for a in stub_overrides(flake) if a != "--no-write-lock-file"]
        done = nix("flake", "lock", f"path:{flake}", *args)
        assert done.returncode == 0, done.stderr
        lock = json.loads((flake / "flake.lock").read_text())
        problems = flake_lock_problems(flake_inputs(flake), lock)
        assert any("node nixpkgs holds a local path" in p for p in problems)
