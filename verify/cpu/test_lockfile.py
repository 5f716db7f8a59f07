"""Tests for `repro.stack.lockfile` on a small uv.lock fixture and on the repository's uv.lock."""

from __future__ import annotations

import pytest

from repro.stack import offline
from repro.stack.lockfile import UV_LOCK, load_lock, normalize, parse_lock
from repro.stack.pins import load_stack
from verify.fake_stack import FIXTURES

LOCK = FIXTURES / "lock" / "uv.lock"


class TestLock:
    def test_package_by_any_spelling(self):
        """A package is found under its canonical name whatever the spelling, with its wheels."""
        lock = load_lock(LOCK)
        package = lock.package("demo.pkg")
        assert (package.name, package.version) == ("Demo_Pkg", "1.2.0")
        assert [w.filename for w in package.wheels] == [
            "demo_pkg-1.2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "demo_pkg-1.2.0-cp312-cp312-macosx_11_0_arm64.whl"]

    def test_wheel_by_file_name(self):
        """A wheel file name maps to its sha256 and size; unknown files give None."""
        lock = load_lock(LOCK)
        wheel = lock.wheel("demo_pkg-1.2.0-cp312-cp312-macosx_11_0_arm64.whl")
        assert (wheel.sha256, wheel.size) == ("3" * 64, 1100)
        assert lock.wheel("demo_pkg-9.9-py3-none-any.whl") is None

    def test_absent_package_is_named(self):
        """Asking for a package the lock lacks says which and how to fix it."""
        with pytest.raises(ValueError, match=r"uv.lock has no package 'missing': add it and re-lock"):
            load_lock(LOCK).package("missing")

    def test_package_locked_twice_is_ambiguous(self):
        """A package locked at two versions is refused, listing both."""
        with pytest.raises(ValueError, match=r"locks 'twice' at several versions \(1.0, 2.0\)"):
            load_lock(LOCK).package("twice")

    def test_wheel_without_sha256_is_rejected(self):
        """A wheel entry whose hash is not sha256 makes the lock invalid."""
        text = LOCK.read_text().replace("sha256:4444", "md5:4444")
        with pytest.raises(ValueError, match=r"twice 1.0 has a wheel without a sha256 hash"):
            parse_lock(text, LOCK)

    def test_missing_file_says_how_to_make_it(self, tmp_path):
        """A missing lock file points at `uv lock`."""
        with pytest.raises(ValueError, match=r"does not exist: generate it with `uv lock`"):
            load_lock(tmp_path / "uv.lock")

    def test_install_set_follows_markers_versions_and_extras(self):
        """The project's dependencies and extra, transitively: the locked version whose marker holds
        for the Python asked about, a dependency's extra, nothing under a false marker."""
        text = """
[[package]]
name = "proj"
version = "0.1"
source = { editable = "." }
dependencies = [{ name = "num", version = "1.0", marker = "python_full_version < '3.12'" },
                { name = "num", version = "2.0", marker = "python_full_version >= '3.12'" }]
[package.optional-dependencies]
gpu = [{ name = "server", extra = ["cu13"] }, { name = "winonly", marker = "sys_platform == 'win32'" }]

[[package]]
name = "num"
version = "1.0"
[[package]]
name = "num"
version = "2.0"
[[package]]
name = "server"
version = "3.0"
dependencies = [{ name = "num", version = "1.0", marker = "python_full_version < '3.12'" },
                { name = "num", version = "2.0", marker = "python_full_version >= '3.12'" }]
[package.optional-dependencies]
cu13 = [{ name = "kernels" }]
[[package]]
name = "kernels"
version = "4.0"
[[package]]
name = "winonly"
version = "5.0"
"""
        lock = parse_lock(text, LOCK)
        found = lambda python: [(p.name, p.version) for p in lock.install_set(["gpu"], python)]  # noqa: E731
        assert found("3.12") == [("kernels", "4.0"), ("num", "2.0"), ("server", "3.0")]
        assert found("3.11") == [("kernels", "4.0"), ("num", "1.0"), ("server", "3.0")]
        with pytest.raises(ValueError, match="needs num at two versions"):
            parse_lock(text.replace('"num", version = "1.0", marker', '"num", version = "2.0", marker', 1), LOCK) \
                .install_set(["gpu"], "3.11")
        with pytest.raises(ValueError, match="the project has no extra 'dev'"):
            lock.install_set(["dev"], "3.12")

    def test_normalize(self):
        """Names normalise per PEP 503."""
        assert normalize("Typing_Extensions") == normalize("typing.extensions") == "typing-extensions"


@pytest.mark.skipif(not UV_LOCK.is_file(), reason="the repository has no uv.lock yet")
def test_repository_lock_pins_every_wheelhouse_package_once():
    """The repository's uv.lock locks each [wheelhouse] serve package at exactly one version."""
    lock = load_lock()
    stack = load_stack()
    for name in stack.wheelhouse.serve:
        assert lock.package(name).wheels, name
    for name, version in stack.packages.items():
        assert lock.package(name).version == version, name


@pytest.mark.skipif(not UV_LOCK.is_file(), reason="the repository has no uv.lock yet")
def test_repository_gpu_extra_has_a_wheel_for_every_package():
    """`repro wheelhouse` (no --trim) can be built: every package of the gpu extra's closure on
    CPython 3.12 has a cp312 wheel for manylinux_2_34 x86_64, the pinned stack among them."""
    stack = load_stack()
    packages = load_lock().install_set(["gpu"], stack.python)
    versions = {normalize(p.name): p.version for p in packages}
    assert len(versions) == len(packages)  # one version a name
    for name, version in stack.packages.items():
        assert versions[normalize(name)] == version, name
    assert "nvidia-cutlass-dsl" in versions  # flashinfer-python[cu13]'s extra, followed
    for package in packages:
        assert any(offline.wheel_rank(w.filename, stack.python, stack.wheelhouse.manylinux) is not None
                   for w in package.wheels), package.name
