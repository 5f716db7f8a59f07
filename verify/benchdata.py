"""Builders of benchmark result records for the tests of results, verdicts and reports."""

from __future__ import annotations

from dataclasses import asdict

from repro.evidence.results import Cell


def cell(algorithm: str = "AR", budget: int | None = None, concurrency: int = 1,
         profile: str = "p", temperature: float = 0.0) -> Cell:
    """A cell of ``profile`` on HumanEval with 64 new tokens."""
    return Cell(profile, algorithm, budget, concurrency, temperature, "humaneval", 64)


def request(c: Cell, index: int, *, start: float = 0.0, end: float = 1.0, tokens: int = 64,
            verify: int | None = None, session: str = "s1") -> dict:
    """A finished-request record as `repro bench` writes it (tau = tokens / verify)."""
    return {"kind": "request", "session": session, "cell": asdict(c), "index": index,
            "start": start, "end": end, "completion_tokens": tokens, "spec_verify_ct": verify,
            "tau": tokens / verify if verify else None, "ttft_s": 0.01,
            "chunks": [[0.002, 2], [0.004, 1]]}
