"""Tests for `repro wheelhouse` on a fake serving stack: cached wheels, a uv.lock, the full wheelhouse
and its no-network install, and the trimmed archives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro import cli
from repro.stack import wheelhouse
from repro.stack.lockfile import load_lock
from repro.stack.pins import parse_stack
from verify.fake_stack import serve_set


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A fake serve set, with `repro wheelhouse` reading its stack.toml."""
    s = serve_set(tmp_path)
    monkeypatch.setattr(wheelhouse, "load_stack", lambda: parse_stack(s.stack_text))
    return s


def build(served, out, *extra: str) -> int:
    """Run `repro wheelhouse` for sm90 from the fake serve set into ``out``."""
    return cli.main(["wheelhouse", "--target", "sm90", "--cache", str(served.cache), "--lock", str(served.lock),
                     *extra, str(out)])


def manifest(out) -> dict:
    """The manifest.json of the wheelhouse ``out``."""
    return json.loads((out / "manifest.json").read_text())


class TestFull:
    def test_unmodified_wheels_and_requirements_with_the_locks_hashes(self, served, tmp_path, capsys):
        """The gpu extra's closure as the cached wheels byte for byte, and requirements.txt pinning
        each at its version with the sha256 uv.lock gives its file."""
        out = tmp_path / "wh"
        assert build(served, out) == 0
        assert sorted(p.name for p in out.glob("*.whl")) == sorted(w.name for w in served.wheels.values())
        for w in served.wheels.values():
            assert (out / w.name).read_bytes() == w.read_bytes()
        lock = load_lock(served.lock)
        pins = [line.split() for line in (out / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
        assert pins == [[f"{name}=={version}", f"--hash=sha256:{lock.wheel(served.wheels[name].name).sha256}"]
                        for name, version in (("fakekernel", "0.4.5"), ("fakeserver", "1.0"))]
        said = capsys.readouterr().out
        command = f"python3 -m pip install --no-index --find-links {out} --require-hashes -r {out / 'requirements.txt'}"
        assert f"install it with no network: {command}" in said
        assert "all 2 wheels matched uv.lock sha256" in said

    def test_the_install_command_installs_it_with_no_network_and_checks_every_hash(self, served, tmp_path):
        """The printed command (pip --no-index --require-hashes) installs the wheelhouse, the
        dependency fakeserver declares included; a wheel changed since is refused."""
        out = tmp_path / "wh"
        build(served, out)

        def install(site: Path) -> subprocess.CompletedProcess:
            command = [sys.executable, *wheelhouse.install_command(out)[1:], "--target", str(site), "--no-cache-dir"]
            return subprocess.run(command, capture_output=True, text=True, check=False,
                                  env={**os.environ, "PIP_CONFIG_FILE": os.devnull})

        done = install(tmp_path / "site")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "site" / "fakeserver" / "__init__.py").is_file()
        assert (tmp_path / "site" / "sgl_kernel" / "sm90" / "common_ops.abi3.so").is_file()
        kernel = out / served.wheels["fakekernel"].name
        kernel.write_bytes(kernel.read_bytes() + b"\0")
        refused = install(tmp_path / "other")
        assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr

    def test_max_mib(self, served, tmp_path, capsys):
        """A wheelhouse over --max-mib fails and suggests --trim."""
        assert build(served, tmp_path / "wh", "--max-mib", "0.0001") == 1
        assert "over --max-mib 0.0001 (try --trim)" in capsys.readouterr().err


class TestTrim:
    def test_archives_and_manifest(self, served, tmp_path, capsys):
        """Every serve package becomes one archive whose wheel sha256 is the lock's, plus the stubs."""
        assert build(served, tmp_path / "wh", "--trim") == 0
        m = manifest(tmp_path / "wh")
        assert [a["archive"] for a in m["archives"]] == [
            "fakekernel-0.4.5.tar.xz", "fakeserver-1.0.tar.xz", "serve-stubs.tar.xz"]
        assert m["archives"][2]["stubs"] == ["IPython", "xgrammar", "soundfile", "datasets"]
        assert "xgrammar/structural_tag.py" in m["archives"][2]["files"]
        assert (m["target"], m["trim"]) == ("sm90", True)
        assert "all 2 wheels matched uv.lock sha256" in capsys.readouterr().out

    def test_trim_keeps_only_the_targets_libraries(self, served, tmp_path):
        """--trim for sm90 keeps sm90/common_ops and spatial_ops and drops the trim patterns."""
        assert build(served, tmp_path / "wh", "--trim") == 0
        kernel, server = manifest(tmp_path / "wh")["archives"][:2]
        assert sorted(f for f in kernel["files"] if f.endswith(".so")) == [
            "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so"]
        assert kernel["dropped"] == ["sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so"]
        assert server["dropped"] == ["fakeserver/multimodal_gen/__init__.py"]

    def test_rebuild_reuses_archives_and_removes_stale_ones(self, served, tmp_path):
        """A second build with the same inputs keeps the archives; another target replaces them."""
        out = tmp_path / "wh"
        build(served, out, "--trim")
        first = (out / "fakekernel-0.4.5.tar.xz").stat().st_mtime_ns
        build(served, out, "--trim")
        assert (out / "fakekernel-0.4.5.tar.xz").stat().st_mtime_ns == first
        (out / "manifest.json").write_text((out / "manifest.json").read_text().replace(
            "fakeserver-1.0.tar.xz", "fakeserver-0.9.tar.xz"))
        (out / "fakeserver-0.9.tar.xz").write_bytes(b"old")
        build(served, out, "--trim")
        assert not (out / "fakeserver-0.9.tar.xz").exists()

    def test_max_mib(self, served, tmp_path, capsys):
        """A trimmed wheelhouse over --max-mib fails."""
        assert build(served, tmp_path / "wh", "--trim", "--max-mib", "0.0001") == 1
        assert "over --max-mib 0.0001\n" in capsys.readouterr().err


class TestIntegrity:
    def test_cached_wheel_with_wrong_hash(self, served, tmp_path, capsys):
        """A cached wheel whose bytes are not the locked ones is refused, naming both hashes."""
        served.wheels["fakeserver"].write_bytes(served.wheels["fakeserver"].read_bytes() + b"\0")
        assert build(served, tmp_path / "wh") == 1
        assert "uv.lock says" in capsys.readouterr().err

    def test_package_missing_from_lock(self, served, tmp_path, capsys):
        """A serve package the lock lacks is a usage error naming it."""
        served.lock.write_text(served.lock.read_text().replace('name = "fakeserver"', 'name = "other"'))
        assert build(served, tmp_path / "wh", "--trim") == 2
        assert "has no package 'fakeserver'" in capsys.readouterr().err

    def test_unknown_target(self, served, tmp_path, capsys):
        """An unknown --target is a usage error listing the targets."""
        code = cli.main(["wheelhouse", "--target", "sm80", "--lock", str(served.lock), str(tmp_path / "wh")])
        assert code == 2 and "target must be one of" in capsys.readouterr().err


class TestDownload:
    def test_missing_wheel_is_fetched_with_hashes(self, served, tmp_path, monkeypatch):
        """A wheel absent from the cache is pip-downloaded by exact version and locked hash."""
        stash = tmp_path / "stash"
        stash.mkdir()
        shutil.move(served.wheels["fakeserver"], stash)
        calls = []

        def fake_pip(command, **kwargs):
            requirements = command[command.index("--requirement") + 1]
            calls.append((command, Path(requirements).read_text()))
            shutil.copy(stash / served.wheels["fakeserver"].name, command[command.index("--dest") + 1])
            return type("Done", (), {"returncode": 0})()

        monkeypatch.setattr(wheelhouse.subprocess, "run", fake_pip)
        assert build(served, tmp_path / "wh") == 0
        (command, requirements), = calls
        assert command[:4] == [sys.executable, "-m", "pip", "download"]
        assert {"--no-deps", "--only-binary=:all:", "--require-hashes"} <= set(command)
        assert "manylinux_2_34_x86_64" in command and "any" not in command
        digest = served.lock.read_text().split('fakeserver-1.0-py3-none-any.whl", hash = "sha256:')[1][:64]
        assert requirements == f"fakeserver==1.0 --hash=sha256:{digest}\n"

    def test_pip_failure(self, served, tmp_path, monkeypatch, capsys):
        """A failing pip download is reported as such."""
        served.wheels["fakeserver"].unlink()
        monkeypatch.setattr(wheelhouse.subprocess, "run", lambda *a, **k: type("Done", (), {"returncode": 1})())
        assert build(served, tmp_path / "wh") == 1
        assert "pip download failed" in capsys.readouterr().err
