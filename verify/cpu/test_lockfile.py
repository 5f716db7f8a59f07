"""Tests for `repro.stack.lockfile` on a small uv.lock fixture and on the repository's uv.lock."""

from __future__ import annotations

import pytest

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
