"""Every file a `repro` verb reads from the user, as slots to fill with bad content, and a workspace
to run them in (used by verify/cpu/test_bad_input.py and test_cli_fuzz.py).

The workspace is valid everywhere except in the slot under test and has no model directories, so
no server can start and no verb reaches the network: every run ends in a check. ``run`` calls
``repro.cli.main`` in-process and returns (exit code, stdout, stderr).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro import cli
from repro.stack import offline
from verify.fake_sglang import write_profiles


@dataclass(frozen=True)
class Slot:
    """A file argument of one verb: the argv (``{ws}`` is the workspace), the file it names
    (relative to the workspace), what the file should hold, and the exit codes the verb documents
    for a file that is wrong (2) or happens to be a valid one (0, or 1 for a failed check)."""

    name: str
    argv: tuple[str, ...]
    file: str
    holds: str  # toml | jsonl | json | text | bytes
    codes: frozenset[int] = frozenset({2})


def _bench(*extra: str) -> tuple[str, ...]:
    return ("bench", "--profile-file", "{ws}/profiles.toml", "--models-dir", "{ws}/models",
            "--log-dir", "{ws}/logs", "--concurrency", "1", "--num-prompts", "2",
            "--algorithms", "AR", "fake", *extra)


BENCH = _bench()  # a bench command that ends at the missing models
SLOTS = (
    Slot("bench --profile-file", ("bench", "--profile-file", "{ws}/slot.toml", "fake"), "slot.toml", "toml"),
    Slot("bench --prompts", _bench("--prompts", "{ws}/slot.jsonl"), "slot.jsonl", "jsonl"),
    Slot("bench -o --resume", _bench("-o", "{ws}/slot.jsonl", "--resume"), "slot.jsonl", "jsonl"),
    Slot("serve --profile-file", ("serve", "--profile-file", "{ws}/slot.toml", "--models-dir",
                                  "{ws}/models", "--log", "{ws}/serve.log", "fake"), "slot.toml", "toml"),
    Slot("report RESULTS", ("report", "{ws}/slot.jsonl", "-o", "{ws}/report"), "slot.jsonl", "jsonl",
         frozenset({0, 2})),
    Slot("report --tiers", ("report", "--tiers", "{ws}/slot.xml", "-o", "{ws}/report"), "slot.xml",
         "text", frozenset({0, 2})),
    Slot("report --profile-file", ("report", "{ws}/empty.jsonl", "--profile-file", "{ws}/slot.toml",
                                   "-o", "{ws}/report"), "slot.toml", "toml", frozenset({0, 2})),
    Slot("report --thresholds-file", ("report", "{ws}/empty.jsonl", "--thresholds-file",
                                      "{ws}/slot.toml", "-o", "{ws}/report"), "slot.toml", "toml",
         frozenset({0, 2})),
    Slot("topology --from", ("topology", "--from", "{ws}/slot.txt"), "slot.txt", "text"),
    Slot("golden check manifest", ("golden", "check", "--dir", "{ws}/golden"), "golden/manifest.json",
         "json", frozenset({1, 2})),
    Slot("cubins PATH", ("cubins", "{ws}/slot.so"), "slot.so", "bytes"),
    Slot("cubins PATH wheel", ("cubins", "{ws}/slot.whl"), "slot.whl", "bytes"),
    Slot("patch --site METADATA", ("patch", "check", "--site", "{ws}/site"),
         "site/sglang-0.5.17.dist-info/METADATA", "text"),
    Slot("patch --site RECORD", ("patch", "check", "--site", "{ws}/site"),
         "site/sglang-0.5.17.dist-info/RECORD", "text", frozenset({1, 2})),
    Slot("install-offline manifest", ("install-offline", "{ws}/slot-house", "--site", "{ws}/installed",
                                      "--lock", "{ws}/no.lock"), "slot-house/manifest.json", "json"),
    Slot("install-offline --lock", ("install-offline", "{ws}/house", "--site", "{ws}/installed",
                                    "--lock", "{ws}/slot.lock"), "slot.lock", "toml", frozenset({1, 2})),
    Slot("wheelhouse --lock", ("wheelhouse", "--target", "sm90", "--cache", "{ws}/cache", "--lock",
                               "{ws}/slot.lock", "{ws}/out"), "slot.lock", "toml"),
    Slot("tau RECORDING", ("tau", "{ws}/slot.jsonl"), "slot.jsonl", "jsonl", frozenset({0, 2})),
    Slot("tune --results", ("tune", "--profile-file", "{ws}/profiles.toml", "--results", "{ws}/slot.jsonl",
                            "--recording", "{ws}/empty.jsonl", "-o", "{ws}/tune", "fake"), "slot.jsonl", "jsonl",
         frozenset({1, 2})),
    Slot("tune --recording", ("tune", "--profile-file", "{ws}/profiles.toml", "--results", "{ws}/empty.jsonl",
                              "--recording", "{ws}/slot.jsonl", "-o", "{ws}/tune", "fake"), "slot.jsonl", "jsonl",
         frozenset({1, 2})),
    Slot("testmodels OUT", ("testmodels", "{ws}/slot-out"), "slot-out", "bytes"),
)

# Flags whose values a user types, in a command that fails after them (bench and serve at the
# missing models, golden at the workspace's manifest, wheelhouse at its missing lock, demo at
# --budgets x, testmodels at an OUT that is a file): whatever the value, exit 2.
FLAGS = (
    (_bench(), ("--concurrency", "--temperatures", "--budgets", "--num-prompts", "--max-new-tokens",
                "--time-limit", "--start-timeout", "--request-timeout", "--port", "--warmup",
                "--algorithms", "--prompts", "--request-rate", "--max-concurrency", "--seed")),
    (("serve", "--profile-file", "{ws}/profiles.toml", "--models-dir", "{ws}/models", "--log",
      "{ws}/serve.log", "fake"), ("--port", "--budget", "--start-timeout", "--algorithm")),
    (("golden", "check", "--dir", "{ws}/golden"), ("--device", "--only")),
    (("wheelhouse", "--cache", "{ws}/cache", "--lock", "{ws}/no.lock", "{ws}/out"), ("--target", "--max-mib")),
    (("demo", "--budgets", "x"), ("--batch", "--new-tokens", "--show-rounds", "--temperature")),
    (("tau", "{ws}/empty.jsonl"), ("--budgets",)),
    (("tune", "--profile-file", "{ws}/profiles.toml", "--results", "{ws}/empty.jsonl", "-o", "{ws}/tune", "fake"),
     ("--budgets", "--holdout", "--concurrency", "--temperature", "--num-prompts", "--max-new-tokens")),
    (("testmodels", "{ws}/empty.jsonl"), ("--seed", "--spread")),
)


def workspace(root: Path) -> Path:
    """Valid inputs for every slot's verb (profiles, empty results, a golden dir, an sglang site, a
    wheelhouse), and no models; returns ``root``."""
    write_profiles(root / "profiles.toml", {"fake": {"sglang": {"fake-step-ms": 3}}})
    (root / "empty.jsonl").write_text("")
    (root / "golden").mkdir()
    (root / "golden" / "manifest.json").write_text('{"cases": [{"kind": "ddtree-case"}]}\n')
    info = root / "site" / "sglang-0.5.17.dist-info"
    info.mkdir(parents=True)
    (root / "site" / "sglang").mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.17\n")
    (info / "RECORD").write_text("")
    (root / "slot-house").mkdir()
    house = root / "house"
    (house / "pkg").mkdir(parents=True)
    (house / "pkg" / "a.py").write_text("A = 1\n")
    offline.write_archive(house, ["pkg/a.py"], house / "pkg-1.tar.xz")
    archive = offline.Archive("pkg-1.tar.xz", offline.sha256_file(house / "pkg-1.tar.xz"),
                              (house / "pkg-1.tar.xz").stat().st_size, "pkg", "1", "pkg-1-py3-none-any.whl",
                              "0" * 64, files={"pkg/a.py": offline.sha256_file(house / "pkg" / "a.py")})
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    offline.Manifest("sm90", python, False, "0" * 64, [archive]).write(house)
    return root


def argv_of(argv: tuple[str, ...], ws: Path) -> list[str]:
    """``argv`` with ``{ws}`` replaced by the workspace path."""
    return [a.replace("{ws}", str(ws)) for a in argv]


def run(argv: list[str]) -> tuple[int, str, str]:
    """``repro.cli.main(argv)`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root``, by relative path."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if not p.is_symlink()}


def changed(before: dict[str, bytes | None], root: Path) -> list[str]:
    """Entries of ``before`` (a :func:`snapshot`) that are gone or differ under ``root`` now."""
    after = snapshot(root)
    return [name for name, data in before.items() if name not in after or after[name] != data]


def toml_text(data: dict[str, Any]) -> str:
    """``data`` as TOML: tables for top-level dicts, inline tables below (nan/inf spelled as TOML)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v, ensure_ascii=False)

    lines = [f"{json.dumps(k)} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(sk)} = {value(sv)}" for sk, sv in v.items()]
    return "\n".join(lines) + "\n"
