"""`repro patch apply|check|revert [--site DIR]`: the DDTree patch series on the pinned SGLang.

The series lives in ``patches/sglang/<version>/`` (``series`` + numbered unified diffs against
the unpacked wheel, paths ``a/sglang/...``). ``DIR`` is a site-packages-like directory holding
``sglang/`` and ``sglang-<version>.dist-info/`` (an installed sglang or an unpacked wheel).

Before touching anything every file the series names is classified against the wheel's own
``RECORD`` hashes: *pristine* (hash matches the wheel), *applied* (reverse-applying its patch
gives the pristine bytes) or *modified* (neither: refuse). Apply and revert are idempotent and
strict (context must match exactly, no fuzz); files are written only after every patch of the
run has been computed in memory, each whole (a temporary file renamed into place). A file of the
series that resolves outside the site (a symlink out of its tree) is refused, never written through.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from repro.errors import ReproError, UsageError
from repro.files import check_inside, read_text, write_atomic

PATCH_ROOT = Path(__file__).resolve().parents[1] / "patches" / "sglang"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_EOL = "\\ No newline at end of file"


@dataclass(frozen=True)
class Hunk:
    """One hunk: the old and new lines (with their line endings) starting at ``old_start``."""

    old_start: int  # 1-based line of ``old`` in the original (0: file created from nothing)
    new_start: int  # 1-based line of ``new`` in the patched file
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    """The hunks of one file; ``created`` when the patch adds the file."""

    path: str  # relative to the site directory, e.g. sglang/srt/speculative/spec_info.py
    hunks: tuple[Hunk, ...]
    created: bool


@dataclass(frozen=True)
class Patch:
    """One numbered patch of the series."""

    name: str
    files: tuple[FilePatch, ...]


def parse_patch(name: str, text: str) -> Patch:  # noqa: C901, PLR0912 - one pass over the diff lines
    """Parse a unified diff (free-text header first); ValueError naming the patch on bad input."""
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_name, new_name = lines[i][4:].strip(), lines[i + 1][4:].strip()
        if not new_name.startswith("b/"):
            msg = f"{name}: file header must name b/<path> (got {new_name!r})"
            raise ValueError(msg)
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            n_old = int(m.group(2) if m.group(2) is not None else 1)
            n_new = int(m.group(4) if m.group(4) is not None else 1)
            old: list[str] = []
            new: list[str] = []
            i += 1
            while len(old) < n_old or len(new) < n_new:
                if i >= len(lines):
                    msg = f"{name}: hunk of {new_name} ends early"
                    raise ValueError(msg)
                tag, body = lines[i][:1], lines[i][1:]
                if tag in (" ", "\n"):
                    body = body if tag == " " else "\n"
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                else:
                    msg = f"{name}: unexpected line in hunk of {new_name}: {lines[i]!r}"
                    raise ValueError(msg)
                i += 1
                if i < len(lines) and lines[i].startswith(_NO_EOL):
                    target = new if tag == "+" else old if tag == "-" else None
                    for seq in (target,) if target is not None else (old, new):
                        seq[-1] = seq[-1].rstrip("\n")
                    i += 1
            hunks.append(Hunk(int(m.group(1)), int(m.group(3)), tuple(old), tuple(new)))
        if not hunks:
            msg = f"{name}: no hunk for {new_name}"
            raise ValueError(msg)
        files.append(FilePatch(new_name[2:], tuple(hunks), created=old_name == "/dev/null"))
    if not files:
        msg = f"{name}: contains no file diff"
        raise ValueError(msg)
    return Patch(name, tuple(files))


def apply_hunks(text: str, fp: FilePatch, *, reverse: bool = False) -> str | None:
    """``text`` with the hunks applied (or reverse-applied); None if any context differs."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unread line of ``lines``
    for h in fp.hunks:
        old, new, line = (h.new, h.old, h.new_start) if reverse else (h.old, h.new, h.old_start)
        start = line if not old else line - 1  # an empty side means "insert after line"
        if start < pos or tuple(lines[start : start + len(old)]) != old:
            return None
        out.extend(lines[pos:start])
        out.extend(new)
        pos = start + len(old)
    out.extend(lines[pos:])
    return "".join(out)


def load_series(version: str) -> list[Patch]:
    """The patches of ``patches/sglang/<version>/series`` in order; UsageError for an unknown one."""
    root = PATCH_ROOT / version
    known = sorted(p.name for p in PATCH_ROOT.iterdir() if (p / "series").is_file()) if PATCH_ROOT.is_dir() else []
    if not (root / "series").is_file():
        msg = f"sglang {version} is not supported (patch series exist for: {', '.join(known) or 'none'})"
        raise UsageError(msg)
    names = [s.strip() for s in (root / "series").read_text().splitlines() if s.strip() and not s.startswith("#")]
    return [parse_patch(n, (root / n).read_text()) for n in names]


def sglang_version(site: Path) -> str:
    """The version in ``sglang-*.dist-info/METADATA`` under ``site``; UsageError if absent."""
    infos = sorted(site.glob("sglang-*.dist-info"))
    if not (site / "sglang").is_dir() or not infos:
        msg = f"--site must hold sglang/ and sglang-<version>.dist-info/ (got {site})"
        raise UsageError(msg)
    for line in read_text(infos[-1] / "METADATA", "--site", "a dist-info METADATA file").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    msg = f"--site: {infos[-1]}/METADATA has no Version line (not an installed sglang)"
    raise UsageError(msg)


def record_hashes(site: Path) -> dict[str, str]:
    """path -> urlsafe-base64 sha256 from the wheel's RECORD (the pristine file hashes)."""
    info = max(site.glob("sglang-*.dist-info"))
    out = {}
    for row in read_text(info / "RECORD", "--site", "the wheel's RECORD file").splitlines():
        parts = row.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[parts[0]] = parts[1][len("sha256=") :]
    return out


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _text(path: Path) -> str | None:
    """A file's UTF-8 text, or None when it is not a UTF-8 file (then it is no patched source)."""
    try:
        return path.read_bytes().decode()
    except (UnicodeDecodeError, IsADirectoryError):
        return None


def file_state(site: Path, fp: FilePatch, record: dict[str, str]) -> str:
    """'pristine', 'applied' or 'modified' for one file of the series."""
    path = check_inside(site / fp.path, site, "--site")
    if fp.created:
        if not path.exists():
            return "pristine"
        text = _text(path)
        return "applied" if text is not None and apply_hunks(text, fp, reverse=True) == "" else "modified"
    if not path.is_file() or fp.path not in record:
        return "modified"
    data = path.read_bytes()
    if _digest(data) == record[fp.path]:
        return "pristine"
    text = _text(path)
    back = None if text is None else apply_hunks(text, fp, reverse=True)
    return "applied" if back is not None and _digest(back.encode()) == record[fp.path] else "modified"


def patch_states(site: Path, series: list[Patch]) -> dict[str, str]:
    """Patch name -> 'applied', 'not applied', or a ReproError for a modified/partial site."""
    record = record_hashes(site)
    seen: dict[str, str] = {}
    states = {}
    for p in series:
        per_file = []
        for fp in p.files:
            if fp.path in seen:
                msg = f"{p.name}: {fp.path} is also patched by {seen[fp.path]} (one patch per file)"
                raise ReproError(msg)
            seen[fp.path] = p.name
            state = file_state(site, fp, record)
            if state == "modified":
                msg = f"{site / fp.path} matches neither the sglang wheel nor {p.name}; refusing to touch it"
                raise ReproError(msg)
            per_file.append(state)
        if len(set(per_file)) > 1:
            msg = f"{p.name} is partly applied under {site}; restore the wheel's files first"
            raise ReproError(msg)
        states[p.name] = "applied" if per_file[0] == "applied" else "not applied"
    return states


def run(site: Path, action: str) -> dict[str, str]:
    """Check, apply or revert the series under ``site``; return each patch's state afterwards."""
    version = sglang_version(site)
    series = load_series(version)
    states = patch_states(site, series)
    if action == "check":
        return states
    todo = [p for p in series if states[p.name] == ("not applied" if action == "apply" else "applied")]
    writes: dict[Path, str | None] = {}
    for p in todo if action == "apply" else reversed(todo):
        for fp in p.files:
            path = site / fp.path
            cur = writes.get(path, "" if fp.created and not path.exists() else None)
            if cur is None:
                cur = path.read_bytes().decode()
            new = apply_hunks(cur, fp, reverse=action == "revert")
            if new is None:
                msg = f"{p.name} does not {action} cleanly to {fp.path}"
                raise ReproError(msg)
            writes[path] = None if (fp.created and action == "revert") else new
    for path, text in writes.items():
        if text is None:
            path.unlink()
        else:
            write_atomic(path, text)
        for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
            cached.unlink()
    return {p.name: ("applied" if action == "apply" else "not applied") for p in series}


def default_site() -> Path:
    """The directory holding the importable sglang package (without importing it)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        msg = "--site not given and no sglang is importable here (pass --site DIR)"
        raise UsageError(msg)
    return Path(next(iter(spec.submodule_search_locations))).parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`repro patch ACTION [--site DIR]`."""
    parser.add_argument("action", choices=("apply", "check", "revert"), help="what to do with the series")
    parser.add_argument("--site", type=Path, help="directory holding sglang/ and its dist-info (default: the importable sglang)")


def main(args: argparse.Namespace) -> int:
    """Print each patch's state; exit 0 when the site is consistent."""
    site = args.site if args.site is not None else default_site()
    if not site.is_dir():
        msg = f"--site must be a directory (got {site})"
        raise UsageError(msg)
    states = run(site, args.action)
    for name, state in states.items():
        print(f"{state:12s} {name}")
    applied = sum(s == "applied" for s in states.values())
    print(f"sglang {sglang_version(site)} at {site}: {applied}/{len(states)} patches applied")
    return 0
