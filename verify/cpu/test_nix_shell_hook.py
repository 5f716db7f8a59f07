"""Tests for nix/shell-hook.sh, the hook every devShell and verify app sources: it links only the
driver's libraries into a private directory and gives Triton a writable cache (bash only)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from repro.stack.lockcheck import DRIVER_LIBS

HOOK = Path(__file__).resolve().parents[2] / "nix/shell-hook.sh"
DRIVER_FILES = (
    "libcuda.so",
    "libcuda.so.1",
    "libcuda.so.580.95.05",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
)
OTHER_FILES = ("libc.so.6", "libstdc++.so.6", "libnvidia-glcore.so.580.95.05", "libz.so.1")


def run_hook(tmp_path: Path, **env: str) -> dict[str, str]:
    """Source the hook under `set -euo pipefail` in a minimal environment; return the result."""
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "REPRO_TARGET": "sm90",
        "REPRO_DRIVER_LIBS": " ".join(DRIVER_LIBS),
        "PYTHONPATH": "/leaked",
    }
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {HOOK}; env -0"],
        env={**base, **env},
        capture_output=True,
        check=True,
    )
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


def fake_lib_dir(tmp_path: Path) -> Path:
    """A stand-in for /usr/lib/x86_64-linux-gnu with driver and non-driver libraries."""
    lib = tmp_path / "usr-lib"
    lib.mkdir()
    for name in DRIVER_FILES + OTHER_FILES:
        (lib / name).write_bytes(b"")
    return lib


class TestDriverLibraries:
    def test_links_only_the_driver_libraries(self, tmp_path: Path):
        """Only libcuda/libnvidia-ml/-ptxjitcompiler/-nvvm land in the private dir, nothing else."""
        lib = fake_lib_dir(tmp_path)
        env = run_hook(tmp_path, REPRO_DRIVER_SEARCH_PATH=str(lib), XDG_RUNTIME_DIR=str(tmp_path))
        private = Path(env["REPRO_DRIVER_DIR"])
        assert private.parent == tmp_path
        assert sorted(p.name for p in private.iterdir()) == sorted(DRIVER_FILES)
        assert all((private / n).resolve() == lib / n for n in DRIVER_FILES)

    def test_points_triton_and_the_loader_at_the_private_dir(self, tmp_path: Path):
        """TRITON_LIBCUDA_PATH is the private dir, which comes first on LD_LIBRARY_PATH."""
        env = run_hook(
            tmp_path,
            REPRO_DRIVER_SEARCH_PATH=str(fake_lib_dir(tmp_path)),
            XDG_RUNTIME_DIR=str(tmp_path),
            LD_LIBRARY_PATH="/opt/other",
        )
        assert env["TRITON_LIBCUDA_PATH"] == env["REPRO_DRIVER_DIR"]
        assert env["LD_LIBRARY_PATH"] == f"{env['REPRO_DRIVER_DIR']}:/opt/other"

    def test_keeps_a_given_driver_dir(self, tmp_path: Path):
        """A REPRO_DRIVER_DIR set by the user is used as is and nothing is linked."""
        env = run_hook(tmp_path, REPRO_DRIVER_DIR="/run/opengl-driver/lib")
        assert env["TRITON_LIBCUDA_PATH"] == "/run/opengl-driver/lib"
        assert env["LD_LIBRARY_PATH"] == "/run/opengl-driver/lib"


class TestEnvironment:
    def test_gives_triton_a_writable_cache_per_target(self, tmp_path: Path):
        """TRITON_CACHE_DIR is created under XDG_CACHE_HOME, one per target."""
        env = run_hook(
            tmp_path,
            REPRO_DRIVER_SEARCH_PATH=str(tmp_path / "none"),
            XDG_RUNTIME_DIR=str(tmp_path),
            XDG_CACHE_HOME=str(tmp_path / "cache"),
        )
        cache = Path(env["TRITON_CACHE_DIR"])
        assert cache == tmp_path / "cache/repro/triton-sm90"
        assert cache.is_dir()

    def test_unsets_a_leaked_pythonpath(self, tmp_path: Path):
        """A PYTHONPATH from the host does not leak into the pinned environment."""
        env = run_hook(
            tmp_path, REPRO_DRIVER_SEARCH_PATH=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path)
        )
        assert "PYTHONPATH" not in env
