"""Tests for `repro install-offline` on wheelhouses built from a fake serving stack."""

from __future__ import annotations

import json
import sys

import pytest

from repro import cli
from repro.stack import offline, wheelhouse
from repro.stack.pins import parse_stack
from verify.fake_stack import dist, serve_set


@pytest.fixture
def house(tmp_path, monkeypatch):
    """A trimmed sm90 wheelhouse of the fake serve set, and its uv.lock."""
    s = serve_set(tmp_path)
    monkeypatch.setattr(wheelhouse, "load_stack", lambda: parse_stack(s.stack_text))
    out = tmp_path / "wh"
    assert cli.main(["wheelhouse", "--target", "sm90", "--trim", "--cache", str(s.cache), "--lock", str(s.lock),
                     str(out)]) == 0
    return out, s.lock


def install(house, site, *extra: str) -> int:
    """Run `repro install-offline` on the wheelhouse ``house`` into ``site``."""
    directory, lock = house
    return cli.main(["install-offline", str(directory), "--site", str(site), "--lock", str(lock), *extra])


class TestInstall:
    def test_installs_every_file_and_is_idempotent(self, house, tmp_path, capsys):
        """Every manifest file lands with its hash; a second run installs nothing."""
        site = tmp_path / "site"
        assert install(house, site) == 0
        out = capsys.readouterr().out
        assert "all 2 wheels match uv.lock" in out and "installed          fakekernel 0.4.5" in out
        manifest = offline.read_manifest(house[0])
        for archive in manifest.archives:
            assert offline.compare_files(site, archive.files) == ([], [])
        assert not (site / "sgl_kernel" / "flash_ops.abi3.so").exists()
        assert install(house, site) == 0
        again = capsys.readouterr().out
        assert "\n  installed" not in again and again.count("\n  already installed") == 3

    def test_changed_file_is_kept_unless_forced(self, house, tmp_path, capsys):
        """A file changed after install (as `repro patch apply` does) is reported and kept; --force restores it."""
        site = tmp_path / "site"
        install(house, site)
        init = site / "fakeserver" / "__init__.py"
        init.write_text("patched = True\n")
        (site / "sgl_kernel" / "__init__.py").unlink()
        capsys.readouterr()
        assert install(house, site) == 0
        out = capsys.readouterr().out
        assert "repaired           fakekernel 0.4.5 (1 of" in out
        assert "fakeserver 1.0: kept 1 changed files, e.g. fakeserver/__init__.py (--force restores them)" in out
        assert init.read_text() == "patched = True\n"
        assert install(house, site, "--force") == 0
        assert init.read_text() == "VERSION = '1.0'\n"

    def test_stub_is_skipped_where_the_real_package_exists(self, house, tmp_path, monkeypatch, capsys):
        """A stub is not installed when a real package of that name is importable elsewhere."""
        real = tmp_path / "real"
        (real / "IPython").mkdir(parents=True)
        (real / "IPython" / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(real))
        assert install(house, tmp_path / "site") == 0
        assert "stub IPython: not installed, the real package is at" in capsys.readouterr().out
        assert not (tmp_path / "site" / "IPython").exists() and (tmp_path / "site" / "xgrammar").is_dir()


class TestRefusals:
    def test_corrupt_archive(self, house, tmp_path, capsys):
        """A damaged archive is refused before anything is installed."""
        path = house[0] / "fakeserver-1.0.tar.xz"
        path.write_bytes(path.read_bytes()[:-5])
        assert install(house, tmp_path / "site") == 1
        assert "does not match manifest.json (corrupt or partial copy)" in capsys.readouterr().err
        assert not (tmp_path / "site").exists()

    def test_truncated_archive_with_a_matching_manifest_installs_nothing(self, house, tmp_path, capsys):
        """An archive cut short whose manifest was rewritten to match: exit 1 and an untouched site
        (every file is extracted and checked before the first one is moved into place)."""
        manifest = json.loads((house[0] / "manifest.json").read_text())
        last = manifest["archives"][-1]
        path = house[0] / last["archive"]
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        last["sha256"], last["bytes"] = offline.sha256_file(path), path.stat().st_size
        (house[0] / "manifest.json").write_text(json.dumps(manifest))
        site = tmp_path / "site"
        assert install(house, site) == 1
        err = capsys.readouterr().err
        assert f"{last['archive']} cannot be extracted" in err and "nothing was installed" in err
        assert "Traceback" not in err and err.count("\n") == 1
        assert list(site.iterdir()) == []

    def test_manifest_path_outside_the_site_is_refused(self, house, tmp_path, capsys):
        """A manifest naming a file outside the site ('../x') is malformed: nothing is written."""
        manifest = json.loads((house[0] / "manifest.json").read_text())
        files = manifest["archives"][0]["files"]
        files["../escape.py"] = next(iter(files.values()))
        (house[0] / "manifest.json").write_text(json.dumps(manifest))
        assert install(house, tmp_path / "site") == 2
        assert "files must map plain relative paths" in capsys.readouterr().err
        assert not (tmp_path / "escape.py").exists() and not (tmp_path / "site").exists()

    def test_other_version_in_site(self, house, tmp_path, capsys):
        """Another version of a distribution in the site is not overwritten."""
        dist(tmp_path / "site", "fakeserver", "0.9")
        assert install(house, tmp_path / "site") == 1
        assert "holds fakeserver 0.9, the wheelhouse has 1.0" in capsys.readouterr().err

    def test_wheel_not_in_lock(self, house, tmp_path, capsys):
        """A wheel whose hash is not the lock's is refused."""
        lock = house[1]
        text = lock.read_text()
        at = text.index("sha256:") + len("sha256:")
        lock.write_text(text[:at] + ("1" if text[at] == "0" else "0") + text[at + 1:])
        assert install(house, tmp_path / "site") == 1
        assert "is not the one uv.lock pins" in capsys.readouterr().err

    def test_other_python(self, house, tmp_path, capsys):
        """A wheelhouse for another Python version is refused."""
        path = house[0] / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "python": "2.7"}))
        assert install(house, tmp_path / "site") == 1
        running = f"{sys.version_info.major}.{sys.version_info.minor}"
        assert f"for Python 2.7, this interpreter is {running}" in capsys.readouterr().err

    def test_not_a_wheelhouse(self, tmp_path, capsys):
        """A directory without manifest.json is a usage error."""
        assert cli.main(["install-offline", str(tmp_path)]) == 2
        assert "is not a wheelhouse: manifest.json is missing" in capsys.readouterr().err
