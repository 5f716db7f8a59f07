"""A cell's latency figures as SGLang's ``bench_serving`` reports them, from its completed requests.

TTFT is the wait for the first token; TPOT a request's time per output token after its first,
``(latency - TTFT) / (tokens - 1)``; ITL the gap between streamed tokens (a chunk of k tokens after a
gap g counts as k gaps of g/k, so a speculative round's tokens are not read as one slow token); E2E a
request's latency from its send to its last token. Each is given as mean, median, p90 and p99 in ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Spread:
    """Mean, median, p90 and p99 of one figure over a cell's requests, in milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread | None:
        """The spread of ``seconds`` (linear interpolation between order statistics); None for none."""
        if not len(seconds):
            return None
        ms = np.asarray(seconds, dtype=float) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(float(ms.mean()), float(p50), float(p90), float(p99))

    def text(self, digits: int = 1) -> str:
        """``mean / p50 / p90 / p99``."""
        return " / ".join(f"{v:.{digits}f}" for v in (self.mean, self.p50, self.p90, self.p99))


@dataclass(frozen=True)
class Samples:
    """Per completed request of a cell, in record order: what its intervals resample."""

    tokens: tuple[int, ...]
    e2e_s: tuple[float, ...]
    tpot_s: tuple[float, ...]  # requests of two tokens or more only


def e2e_s(record: dict[str, Any]) -> float:
    """A request's latency: send to last token (send to answer for records without one)."""
    return record.get("latency_s", record["end"] - record["start"])


def tpot_s(record: dict[str, Any]) -> float | None:
    """A completed request's time per output token after its first; None under two tokens."""
    tokens = record["completion_tokens"]
    return (e2e_s(record) - record["ttft_s"]) / (tokens - 1) if tokens > 1 else None


def itl_s(records: Iterable[dict[str, Any]]) -> list[float]:
    """The inter-token gaps of ``records``, a chunk of k tokens counting as k gaps."""
    return [gap / n for r in records for gap, n in r.get("chunks", []) for _ in range(n)]


def samples(records: Sequence[dict[str, Any]]) -> Samples:
    """The per-request figures of completed ``records``."""
    tpots = (tpot_s(r) for r in records)
    return Samples(tuple(r["completion_tokens"] for r in records), tuple(e2e_s(r) for r in records),
                   tuple(t for t in tpots if t is not None))


LATENCY_HEADERS = ("profile", "algorithm", "c", "rate", "T", "n", "failed", "req/s", "in flight",
                   "TTFT ms", "TPOT ms", "ITL ms", "E2E ms")
SPREAD_NOTE = "latency columns: mean / p50 / p90 / p99"


def latency_rows(summaries: Iterable[Any]) -> list[list[str]]:
    """One row per cell summary (``results.CellSummary``), in :data:`LATENCY_HEADERS` order."""
    def spread(s: Spread | None, digits: int = 1) -> str:
        return "-" if s is None else s.text(digits)

    return [[s.cell.source, s.cell.label, str(s.cell.concurrency), rate_text(s.cell.request_rate),
             f"{s.cell.temperature:g}", str(s.requests), str(s.failed), f"{s.request_s:.2f}",
             "-" if s.in_flight is None else f"{s.in_flight:.1f}", spread(s.ttft_ms), spread(s.tpot_ms, 2),
             spread(s.itl_ms, 2), spread(s.e2e_ms)] for s in summaries]


def rate_text(rate: float | None) -> str:
    """An open-loop cell's request rate as a table shows it (``-`` for closed loop)."""
    return "-" if rate is None else f"{rate:g}/s"
