"""Tests for `repro.files`: reading the files a user names, atomic writes, names and trees."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.files import (
    atomic_output,
    check_inside,
    check_name,
    parse_json,
    read_json,
    read_text,
    read_toml,
    safe_relative,
    write_atomic,
)


class TestRead:
    @pytest.mark.parametrize(("make", "message"), [
        (lambda p: None, r"--x: .*f does not exist \(expected a text file\)"),
        (lambda p: p.mkdir(), r"--x: .*f is a directory \(expected a text file\)"),
        (lambda p: p.write_bytes(b"ok\x00"), r"--x: .*f is binary or not UTF-8 text \(byte 2;"),
        (lambda p: p.write_bytes(b"caf\xe9"), r"--x: .*f is binary or not UTF-8 text \(byte 3;"),
    ])
    def test_unreadable_files_are_one_usage_error(self, tmp_path: Path, make, message) -> None:
        """Missing, directory, NUL-holding and non-UTF-8 files name the flag, path and problem."""
        make(tmp_path / "f")
        with pytest.raises(UsageError, match=message):
            read_text(tmp_path / "f", "--x")

    def test_a_gz_name_is_read_through_gzip(self, tmp_path: Path) -> None:
        """run.jsonl.gz reads as the text it compresses; a cut or plain file under a .gz name is one
        UsageError; without .gz the compressed bytes are binary."""
        text = '{"kind": "run"}\n' * 100
        whole = gzip.compress(text.encode())
        (tmp_path / "run.jsonl.gz").write_bytes(whole)
        assert read_text(tmp_path / "run.jsonl.gz", "--x") == text
        (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
        (tmp_path / "plain.jsonl.gz").write_text(text)
        for name in ("cut.jsonl.gz", "plain.jsonl.gz"):
            with pytest.raises(UsageError, match=rf"--x: .*{name} is not a whole gzip file"):
                read_text(tmp_path / name, "--x")
        (tmp_path / "run.jsonl").write_bytes(whole)
        with pytest.raises(UsageError, match="is binary or not UTF-8"):
            read_text(tmp_path / "run.jsonl", "--x")

    def test_toml_and_json_errors_name_the_flag(self, tmp_path: Path) -> None:
        """Malformed TOML and JSON are UsageErrors naming the flag and the file."""
        (tmp_path / "a.toml").write_text("[x\n")
        (tmp_path / "a.json").write_text("{1: 2}")
        with pytest.raises(UsageError, match=r"--t: .*a\.toml is not valid TOML"):
            read_toml(tmp_path / "a.toml", "--t")
        with pytest.raises(UsageError, match=r"--j: .*a\.json is not valid JSON \(.* line 1 column 2\)"):
            read_json(tmp_path / "a.json", "--j")

    def test_json_refuses_nan_and_infinity(self, tmp_path: Path) -> None:
        """NaN and Infinity are not JSON numbers, so no reader meets a non-finite float."""
        for text in ('{"a": NaN}', "[Infinity]", "-Infinity"):
            with pytest.raises(ValueError, match=r"is not a JSON number"):
                parse_json(text)
        assert parse_json('{"a": 1.5}') == {"a": 1.5}


def _write_then_fail(path: Path) -> None:
    """Write half a file inside atomic_output, then fail as a full disk would."""
    with atomic_output(path) as tmp:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")


class TestAtomic:
    def test_write_replaces_the_file_whole(self, tmp_path: Path) -> None:
        """write_atomic leaves the new bytes and no temporary file behind."""
        path = tmp_path / "out" / "r.md"
        write_atomic(path, "one")
        write_atomic(path, b"two")
        assert path.read_bytes() == b"two" and [p.name for p in path.parent.iterdir()] == ["r.md"]

    def test_a_failed_write_keeps_the_old_file(self, tmp_path: Path) -> None:
        """An exception inside atomic_output leaves the destination as it was, and no debris."""
        path = tmp_path / "r.json"
        path.write_text("old")
        with pytest.raises(OSError, match="No space left"):
            _write_then_fail(path)
        assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]

    def test_a_symlink_is_replaced_not_written_through(self, tmp_path: Path) -> None:
        """Writing to a symlink replaces the link; the file it pointed at is untouched."""
        target = tmp_path / "elsewhere.txt"
        target.write_text("keep")
        link = tmp_path / "r.md"
        link.symlink_to(target)
        write_atomic(link, "new")
        assert target.read_text() == "keep" and not link.is_symlink() and link.read_text() == "new"


class TestNamesAndTrees:
    @pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "", "a\\b", "x..y", "a b"])
    def test_unsafe_names_are_refused(self, name: str) -> None:
        """Names with separators, '..', a leading dot or spaces cannot become path components."""
        with pytest.raises(UsageError, match=r"profile name must be letters, digits"):
            check_name(name, "profile name")

    def test_safe_names_pass(self) -> None:
        """Letters, digits, '.', '_' and '-' pass unchanged."""
        assert check_name("k26-b300_tp8.v2", "profile name") == "k26-b300_tp8.v2"

    def test_relative_paths(self) -> None:
        """Only plain relative POSIX paths count as staying inside a tree."""
        assert safe_relative("sglang/srt/x.py")
        assert not any(safe_relative(p) for p in ("/etc/x", "a/../b", "a//b", "./a", "", None, "a\\b"))

    def test_symlink_out_of_the_tree_is_refused(self, tmp_path: Path) -> None:
        """A path that resolves outside its root (through a symlink) is a UsageError."""
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "f.py").symlink_to(tmp_path / "outside.py")
        with pytest.raises(UsageError, match=r"--site: .*f\.py resolves to .*outside\.py, outside"):
            check_inside(tmp_path / "site" / "f.py", tmp_path / "site", "--site")
        assert check_inside(tmp_path / "site" / "new.py", tmp_path / "site", "--site")
