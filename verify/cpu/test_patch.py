"""Tests for `repro.patch`: the DDTree patch series against the pristine sglang 0.5.17 wheel.

The wheel is downloaded once from the package index into the repository's ignored ``.cache/``
(override with $REPRO_WHEEL_CACHE) and checked against the sha256 that uv.lock pins. Each test
unpacks only what the series touches (plus the wheel's dist-info) into a temporary directory.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tomllib
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from repro import cli, patch
from repro.errors import ReproError, UsageError

ROOT = Path(__file__).resolve().parents[2]
SGLANG = tomllib.loads((ROOT / "repro" / "data" / "stack.toml").read_text())["stack"]["sglang"]
WHEEL = f"sglang-{SGLANG}-cp312-cp312-manylinux_2_34_x86_64.whl"
SERIES_DIR = ROOT / "patches" / "sglang" / SGLANG


def locked_sha256(filename: str) -> str:
    """The sha256 uv.lock records for the wheel ``filename``."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    for pkg in lock["package"]:
        for wheel in pkg.get("wheels", []):
            if wheel["url"].rsplit("/", 1)[-1] == filename:
                return wheel["hash"].removeprefix("sha256:")
    msg = f"uv.lock pins no wheel named {filename}"
    raise AssertionError(msg)


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The pinned sglang wheel, downloaded once and verified against uv.lock."""
    cache = Path(os.environ.get("REPRO_WHEEL_CACHE") or ROOT / ".cache" / "wheels")
    path = cache / WHEEL
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", f"sglang=={SGLANG}", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               "--platform", "manylinux_2_34_x86_64", "-d", str(cache)]
        subprocess.run(cmd, check=True, timeout=600)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == locked_sha256(WHEEL), f"{path} does not match uv.lock"
    return path


@pytest.fixture
def site(wheel, tmp_path) -> Path:
    """A site directory holding the wheel's dist-info and every file the series names."""
    wanted = {fp.path for p in patch.load_series(SGLANG) for fp in p.files}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name in wanted or name.startswith(f"sglang-{SGLANG}.dist-info/"):
                zf.extract(name, tmp_path)
    (tmp_path / "sglang").mkdir(exist_ok=True)
    return tmp_path


def _pristine(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)


class TestSeries:
    def test_series_lists_every_patch_file(self):
        """Every .patch file is in `series` and every `series` entry exists (no orphans)."""
        listed = [s for s in (SERIES_DIR / "series").read_text().splitlines() if s and not s.startswith("#")]
        assert sorted(listed) == sorted(p.name for p in SERIES_DIR.glob("*.patch"))

    def test_patches_are_numbered_kebab_names_with_a_header(self):
        """Each patch is NNNN-kebab-name.patch and starts with what/why/upstream prose."""
        for p in SERIES_DIR.glob("*.patch"):
            assert p.name[:4].isdigit() and p.name[4] == "-" and p.name == p.name.lower()
            header = p.read_text().split("\n--- ", 1)[0]
            for key in ("What:", "Why:", "Upstream:"):
                assert key in header, f"{p.name} lacks {key}"

    def test_each_file_is_patched_by_one_patch(self):
        """No two patches touch the same file (states are then per file, per patch)."""
        paths = [fp.path for p in patch.load_series(SGLANG) for fp in p.files]
        assert len(paths) == len(set(paths))


class TestWheel:
    def test_wheel_matches_the_uv_lock_hash(self, wheel):
        """The downloaded wheel's sha256 is the one uv.lock pins."""
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == locked_sha256(WHEEL)


class TestRun:
    def test_apply_compiles_reverts_and_reapplies(self, site, wheel):
        """apply -> every patched file byte-compiles -> revert restores the wheel -> re-apply."""
        series = patch.load_series(SGLANG)
        assert set(patch.run(site, "check").values()) == {"not applied"}
        assert set(patch.run(site, "apply").values()) == {"applied"}
        for fp in (fp for p in series for fp in p.files):
            compile((site / fp.path).read_bytes(), fp.path, "exec")
        assert set(patch.run(site, "revert").values()) == {"not applied"}
        for fp in (fp for p in series for fp in p.files):
            if fp.created:
                assert not (site / fp.path).exists()
            else:
                assert (site / fp.path).read_bytes() == _pristine(wheel, fp.path)
        assert set(patch.run(site, "apply").values()) == {"applied"}
        assert set(patch.run(site, "check").values()) == {"applied"}

    def test_apply_twice_changes_nothing(self, site):
        """A second apply is a no-op: same bytes, every patch still applied."""
        patch.run(site, "apply")
        before = {p: p.read_bytes() for p in site.rglob("*.py")}
        assert set(patch.run(site, "apply").values()) == {"applied"}
        assert {p: p.read_bytes() for p in site.rglob("*.py")} == before

    def test_refuses_a_locally_modified_file(self, site):
        """A file matching neither the wheel nor its patch is never touched."""
        target = site / patch.load_series(SGLANG)[0].files[0].path
        target.write_bytes(target.read_bytes() + b"# local edit\n")
        with pytest.raises(ReproError, match="matches neither the sglang wheel"):
            patch.run(site, "apply")

    def test_refuses_a_file_symlinked_out_of_the_site(self, site, tmp_path_factory, capsys):
        """A series file that is a symlink to outside the site is refused (exit 2), never written
        through: the outside file and every file of the site keep their bytes."""
        target = site / next(fp.path for p in patch.load_series(SGLANG) for fp in p.files if not fp.created)
        outside = tmp_path_factory.mktemp("elsewhere") / target.name
        data = target.read_bytes()
        outside.write_bytes(data)
        target.unlink()
        target.symlink_to(outside)
        before = {p: p.read_bytes() for p in site.rglob("*.py") if not p.is_symlink()}
        assert cli.main(["patch", "apply", "--site", str(site)]) == 2
        err = capsys.readouterr().err
        assert f"resolves to {outside}, outside {site}; refusing to write there" in err
        assert outside.read_bytes() == data
        assert {p: p.read_bytes() for p in site.rglob("*.py") if not p.is_symlink()} == before

    def test_refuses_an_unknown_sglang_version(self, site):
        """Another sglang version is refused in one line naming both versions."""
        meta = next(site.glob("sglang-*.dist-info")) / "METADATA"
        meta.write_text(meta.read_text().replace(f"Version: {SGLANG}", "Version: 0.5.99"))
        with pytest.raises(UsageError, match=rf"sglang 0\.5\.99 is not supported .*{SGLANG}"):
            patch.run(site, "check")

    def test_cli_prints_each_patch_state(self, site):
        """`repro patch check --site DIR` prints one line per patch and a summary."""
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli.main(["patch", "apply", "--site", str(site)]) == 0
        lines = out.getvalue().splitlines()
        assert all(line.startswith("applied") for line in lines[:-1])
        assert lines[-1].endswith(f"{len(lines) - 1}/{len(lines) - 1} patches applied")

    def test_cli_rejects_a_site_without_sglang(self, tmp_path, capsys):
        """A --site without sglang/ and its dist-info is a one-line usage error, exit 2."""
        assert cli.main(["patch", "check", "--site", str(tmp_path)]) == 2
        assert "--site must hold sglang/" in capsys.readouterr().err


class TestHunks:
    FP = patch.parse_patch(
        "t.patch",
        "hdr\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,4 @@\n a\n-b\n+B\n+C\n c\n",
    ).files[0]

    def test_apply_and_reverse_are_inverse(self):
        """Applying then reverse-applying a hunk gives the original text back."""
        new = patch.apply_hunks("a\nb\nc\n", self.FP)
        assert new == "a\nB\nC\nc\n"
        assert patch.apply_hunks(new, self.FP, reverse=True) == "a\nb\nc\n"

    def test_context_must_match_exactly(self):
        """Changed context makes the hunk fail (no fuzz)."""
        assert patch.apply_hunks("a\nb\nX\n", self.FP) is None

    def test_garbage_is_rejected(self):
        """A file without any unified diff is a ValueError naming the patch."""
        with pytest.raises(ValueError, match=r"bad\.patch: contains no file diff"):
            patch.parse_patch("bad.patch", "just prose\n")
