"""The performance docs state today's figures: short, no diary sections, every raw file cited and present."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PERF = DOCS / "perf"
PERFORMANCE = DOCS / "PERFORMANCE.md"
MAX_LINES = 250
TEXT_SUFFIXES = {".md", ".json", ".jsonl", ".py", ".sh", ".toml", ".txt"}
# A raw file named as docs/perf/NAME, or perf/NAME relative to docs/ (an image link); a * is a glob.
CITATION = re.compile(r"(?<![\w/])(?:docs/)?perf/([\w*.-]*[\w*])")
DIARY_WORDS = ("session", "superseded")


def cited_names(text: str) -> set[str]:
    """The raw-file names (or globs) under docs/perf/ that ``text`` cites."""
    return set(CITATION.findall(text))


def text_files(*roots: Path) -> list[Path]:
    """Text files at or under ``roots``, outside docs/perf/ (raw files cite nothing)."""
    found = []
    for root in roots:
        found.extend(path for path in ([root] if root.is_file() else sorted(root.rglob("*")))
                     if path.is_file() and path.suffix in TEXT_SUFFIXES and PERF not in path.parents)
    return found


def citations(*roots: Path) -> dict[str, list[str]]:
    """Each cited name or glob, with the files (relative to the repository) that cite it."""
    cited: dict[str, list[str]] = {}
    for path in text_files(*roots):
        if path == Path(__file__).resolve():
            continue
        for name in cited_names(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return cited


def headings(path: Path) -> list[str]:
    """The Markdown headings of ``path``, outside fenced code blocks."""
    found, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            found.append(line)
    return found


def raw_files() -> list[str]:
    """The names of the raw files kept under docs/perf/."""
    return sorted(p.name for p in PERF.iterdir() if p.is_file())


def test_citation_forms() -> None:
    """Backticked, image-link and glob citations are found; other folders named perf are not."""
    text = ("raw `docs/perf/a_1.json`, ![x](perf/b.png), see docs/perf/c.jsonl. and `docs/perf/d_*`; "
            "not build/perf/e.json, nor the folder `docs/perf/` alone")
    assert cited_names(text) == {"a_1.json", "b.png", "c.jsonl", "d_*"}


def test_performance_md_is_short() -> None:
    """docs/PERFORMANCE.md holds today's figures only, within a page budget."""
    lines = PERFORMANCE.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/PERFORMANCE.md has {lines} lines (at most {MAX_LINES}: today's figures only)"


def test_no_diary_sections() -> None:
    """No heading of the performance or SGLang docs is a session log, nor is anything marked superseded."""
    for doc in (PERFORMANCE, DOCS / "SGLANG.md"):
        diary = [h for h in headings(doc) if any(w in h.lower() for w in DIARY_WORDS)]
        assert not diary, f"{doc.name}: diary headings {diary}"
    assert "superseded" not in PERFORMANCE.read_text(encoding="utf-8").lower()


def test_every_cited_raw_file_exists() -> None:
    """Each docs/perf/ name cited by the docs, the README or the code is a file there (a glob matches one)."""
    names = raw_files()
    cited = citations(ROOT / "README.md", DOCS, ROOT / "repro", ROOT / "verify")
    missing = {c: where for c, where in cited.items() if not fnmatch.filter(names, c)}
    assert not missing, f"cited under docs/perf/ but absent: {missing}"


def test_every_raw_file_is_cited() -> None:
    """Each file in docs/perf/ backs a claim of the docs or the README, which name it in full (a glob
    names no file); the rest belongs to git history."""
    cited = citations(ROOT / "README.md", DOCS)
    uncited = [n for n in raw_files() if n not in cited]
    assert not uncited, f"docs/perf/ files no doc cites by name: {uncited}"
