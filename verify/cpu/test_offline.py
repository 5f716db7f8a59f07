"""Tests for `repro.stack.offline`: wheel tags, unpacking against RECORD, archives and the manifest."""

from __future__ import annotations

import tarfile
import zipfile

import pytest

from repro.stack import offline
from verify.fake_stack import wheel


class TestWheelRank:
    @pytest.mark.parametrize(("name", "fits"), [
        ("a-1-cp312-cp312-manylinux_2_34_x86_64.whl", True),
        ("a-1-cp310-abi3-manylinux2014_x86_64.whl", True),        # abi3 from an older CPython
        ("a-1-py3-none-any.whl", True),
        ("a-1-py37-none-any.whl", True),                          # pure, for Python >= 3.7
        ("a-1-py313-none-any.whl", False),                        # pure, for a newer Python
        ("a-1-cp313-cp313-manylinux_2_17_x86_64.whl", False),     # another CPython
        ("a-1-cp313-abi3-manylinux_2_17_x86_64.whl", False),      # abi3 needing a newer CPython
        ("a-1-cp312-cp312-manylinux_2_35_x86_64.whl", False),     # newer glibc than the floor
        ("a-1-cp312-cp312-manylinux_2_17_aarch64.whl", False),
        ("a-1-cp312-cp312-macosx_11_0_arm64.whl", False),
    ])
    def test_fit(self, name, fits):
        """cp312, abi3 and pure wheels for x86_64 glibc <= 2.34 fit; others do not."""
        assert (offline.wheel_rank(name, "3.12", "2_34") is not None) is fits

    def test_more_specific_platform_ranks_first(self):
        """A manylinux_2_28 wheel beats a manylinux2014 one, which beats a pure one."""
        ranks = [offline.wheel_rank(n, "3.12", "2_34") for n in (
            "a-1-cp312-cp312-manylinux_2_28_x86_64.whl",
            "a-1-cp312-cp312-manylinux2014_x86_64.whl",
            "a-1-py3-none-any.whl")]
        assert ranks == sorted(ranks) and len(set(ranks)) == 3

    def test_platform_tags_include_legacy_aliases(self):
        """The tag list runs from the floor down and includes manylinux2014/2010/1."""
        tags = offline.platform_tags("2_34")
        assert tags[0] == "manylinux_2_34_x86_64" and tags[-1] == "any"
        assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
        assert "manylinux1_x86_64" in tags


class TestUnpackWheel:
    def test_tree_and_drops(self, tmp_path):
        """Members land as a site tree with their hashes; dropped and script members stay out."""
        whl = wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": b"x = 1\n", "pkg/big.so": b"\x7fELF",
                                              "pkg-1.0.data/scripts/tool": b"#!/bin/sh\n",
                                              "pkg-1.0.data/purelib/extra.py": b"y = 2\n"})
        files, dropped = offline.unpack_wheel(whl, tmp_path / "site", lambda p: p.endswith(".so"))
        assert (tmp_path / "site" / "extra.py").read_text() == "y = 2\n"
        assert "pkg/__init__.py" in files and "pkg-1.0.dist-info/RECORD" in files
        assert dropped == ["pkg-1.0.data/scripts/tool", "pkg/big.so"]
        assert not (tmp_path / "site" / "pkg" / "big.so").exists()

    def test_member_not_matching_record_is_refused(self, tmp_path):
        """A member whose bytes differ from the wheel's RECORD is an error."""
        whl = wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": b"x = 1\n"})
        with zipfile.ZipFile(whl) as src:
            members = {n: src.read(n) for n in src.namelist()}
        with zipfile.ZipFile(whl, "w") as dst:
            for name, data in members.items():
                dst.writestr(name, b"tampered\n" if name == "pkg/__init__.py" else data)
        with pytest.raises(ValueError, match=r"member 'pkg/__init__.py' does not match the wheel's RECORD"):
            offline.unpack_wheel(whl, tmp_path / "site", lambda p: False)

    def test_member_escaping_the_tree_is_refused(self, tmp_path):
        """A member path with .. is refused."""
        whl = wheel(tmp_path, "pkg", "1.0", {"../evil.py": b""})
        with pytest.raises(ValueError, match=r"escapes the install directory"):
            offline.unpack_wheel(whl, tmp_path / "site", lambda p: False)


class TestArchiveAndManifest:
    def test_archive_is_reproducible(self, tmp_path):
        """Packing the same files twice gives byte-identical archives, sorted, owned by root."""
        (tmp_path / "t" / "b").mkdir(parents=True)
        (tmp_path / "t" / "b" / "x.py").write_text("x")
        (tmp_path / "t" / "a.py").write_text("a")
        offline.write_archive(tmp_path / "t", ["b/x.py", "a.py"], tmp_path / "1.tar.xz")
        offline.write_archive(tmp_path / "t", ["a.py", "b/x.py"], tmp_path / "2.tar.xz")
        assert (tmp_path / "1.tar.xz").read_bytes() == (tmp_path / "2.tar.xz").read_bytes()
        with tarfile.open(tmp_path / "1.tar.xz") as tar:
            assert [(m.name, m.mtime, m.uid) for m in tar.getmembers()] == [("a.py", 0, 0), ("b/x.py", 0, 0)]

    def test_manifest_round_trip(self, tmp_path):
        """A written manifest reads back equal."""
        archive = offline.Archive("a.tar.xz", "0" * 64, 10, "a", "1", "a-1-py3-none-any.whl", "1" * 64,
                                  files={"a/__init__.py": "2" * 64})
        manifest = offline.Manifest("sm90", "3.12", True, "3" * 64, [archive])
        manifest.write(tmp_path)
        assert offline.read_manifest(tmp_path) == manifest

    def test_bad_manifest(self, tmp_path):
        """A missing or foreign manifest is a one-line error."""
        with pytest.raises(ValueError, match=r"is not a wheelhouse: manifest.json is missing"):
            offline.read_manifest(tmp_path)
        (tmp_path / "manifest.json").write_text('{"format": 7}')
        with pytest.raises(ValueError, match=r"malformed: format must be 1 \(got 7\)"):
            offline.read_manifest(tmp_path)

    def test_compare_files(self, tmp_path):
        """compare_files separates missing files from changed ones."""
        (tmp_path / "same").write_text("s")
        (tmp_path / "changed").write_text("new")
        expected = {"same": offline.sha256_file(tmp_path / "same"), "changed": "0" * 64, "gone": "0" * 64}
        assert offline.compare_files(tmp_path, expected) == (["gone"], ["changed"])
