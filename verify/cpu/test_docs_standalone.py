"""The repository stands alone: its docs exist, its links resolve, nothing names a file outside it
or an issue number of its own history."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = [ROOT / "README.md", ROOT / "Makefile", ROOT / "flake.nix", DOCS, ROOT / "nix", ROOT / "patches",
           ROOT / "repro", ROOT / "verify"]
SUFFIXES = {".md", ".py", ".toml", ".sh", ".nix", ".patch", ".json", ".txt", ""}
# Notes kept beside the repository while it was built; the repository's own docs replace them.
OUTSIDE = re.compile(r"ddtree-spec|sglang-notes|device-notes|\.\./shared|shared/docs")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d")
UPSTREAM_ISSUE = re.compile(r"[\w.-]+/[\w.-]+ issues? #?\d")  # another project's tracker, e.g. NVIDIA/nccl-tests
DOC_PATH = re.compile(r"(?<![\w/.-])docs/([A-Z][A-Z0-9-]*\.md)\b")  # the repository's docs are upper case
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def text_files() -> list[Path]:
    """The repository's text files in SOURCES, without the raw measurements under docs/perf/."""
    found = []
    for root in SOURCES:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        found += [p for p in paths if p.is_file() and p.suffix in SUFFIXES and DOCS / "perf" not in p.parents
                  and "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    return found


def offending_lines(pattern: re.Pattern[str], allowed: re.Pattern[str] | None = None) -> list[str]:
    """``path:line`` of every line of the text files that matches ``pattern`` and not ``allowed``."""
    hits = []
    for path in text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line) and not (allowed and allowed.search(line)):
                hits.append(f"{path.relative_to(ROOT)}:{n}")
    return hits


def test_own_docs_exist() -> None:
    """The spec, the SGLang design and the GPU notes are documents of the repository."""
    for name in ("SPEC.md", "SGLANG-DESIGN.md", "GPU-NOTES.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"


def test_no_reference_outside_the_repository() -> None:
    """No file names a note that lives outside the repository."""
    hits = offending_lines(OUTSIDE)
    assert not hits, f"references to files outside the repository: {hits}"


def test_no_issue_numbers() -> None:
    """Docs and code cite documents and measurements, not the issue that asked for them."""
    hits = offending_lines(ISSUE, UPSTREAM_ISSUE)
    assert not hits, f"issue numbers: {hits}"


def test_cited_docs_exist() -> None:
    """Every docs/NAME.md that a file names is in docs/ (another project's docs/x.md is lower case)."""
    missing = set()
    for path in text_files():
        missing |= {n for n in DOC_PATH.findall(path.read_text(encoding="utf-8", errors="replace"))
                    if not (DOCS / n).is_file()}
    assert not missing, f"docs named but absent: {sorted(missing)}"


def test_markdown_links_resolve() -> None:
    """Each relative link of README.md and docs/*.md points at a file or folder of the repository."""
    broken = []
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        broken += [f"{doc.name}: {target}" for target in MD_LINK.findall(doc.read_text(encoding="utf-8"))
                   if "://" not in target and not (doc.parent / target).exists()]
    assert not broken, f"broken links: {broken}"


def test_the_checks_can_fail() -> None:
    """The patterns catch what they are for and pass an upstream tracker's issue."""
    assert OUTSIDE.search("see ../shared/docs/x.md") and OUTSIDE.search("(ddtree-spec.md §2)")
    assert ISSUE.search("as issue 20 asks") and ISSUE.search("issues 2 and 6")
    assert UPSTREAM_ISSUE.search("NVIDIA/nccl-tests issue #212")
    assert not UPSTREAM_ISSUE.search("as issue 20 asks")
    assert DOC_PATH.findall("see docs/NOPE.md, DeepEP (docs/legacy.md)") == ["NOPE.md"]
    assert MD_LINK.findall("[a](docs/X.md#part) and ![b](img/y.png)") == ["docs/X.md", "img/y.png"]
