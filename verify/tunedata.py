"""Builders of synthetic acceptance recordings and bench results with known costs, for the tune tests.

``write_recording`` records random increasing paths through the real Recorder (CPU tensors), so
tau(B) comes from the same reader `repro tune` uses. ``bench_records`` simulates closed-loop cells
whose round time is a given function of (c, B): each of c clients runs its requests back to back,
a request taking TTFT + rounds x T_round with rounds = round((M - 1) / tau(B)).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from repro.ddtree import ChainFields
from repro.evidence.results import Cell
from repro.recording import Recorder
from repro.tuning.acceptance import budget_taus, read_recordings

HORIZON = 15


def write_recording(path: Path, budget: int = 128, rounds: int = 400, requests: int = 40, seed: int = 0,
                    prompts: str = "humaneval") -> list[float]:
    """A DDTREE recording of random paths (ids spread so larger budgets accept more); returns tau(B')."""
    rng = random.Random(seed)  # noqa: S311 - seeded synthetic data
    with Recorder(path, budget=budget, horizon=HORIZON, stack={"test": True}, config={"synthetic": seed},
                  prompts=prompts, source="test") as rec:
        for step in range(rounds):
            ids, node = [], 0
            while len(ids) < HORIZON and rng.random() < 0.8:
                node += 1 + int(rng.expovariate(1 / (2 + 3 * len(ids))))
                if node > budget:
                    break
                ids.append(node)
            index = torch.full((1, HORIZON + 1), -1)
            index[0, : len(ids) + 1] = torch.tensor([0, *ids])
            chain = rng.randint(len(ids), min(HORIZON, budget))
            rank0 = torch.zeros(1, HORIZON, dtype=torch.bool)
            rec.record([f"{prompts}/{step % requests}"], index, torch.tensor([len(ids) + 1]),
                       ChainFields(rank0, torch.tensor([chain])))
    (recording,) = read_recordings(path)
    return [e.value for e in budget_taus(recording.rounds, budget)]


def bench_records(taus: list[float], round_ms: Callable[[str, int | None, int], float], *,
                  budgets: list[int], concurrency: list[int], profile: str = "p", new_tokens: int = 128,
                  requests: int = 8, ttft_ms: float = 20.0, dflash_tau: float = 2.5,
                  scale: Callable[[str, int | None, int], float] = lambda a, b, c: 1.0) -> list[dict]:
    """Request records of AR, DFLASH and DDTREE at ``budgets`` for every concurrency.

    ``round_ms(algorithm, budget, c)`` is the round time; ``scale`` stretches a cell's latencies
    (a cell slower than its costs say, to make a prediction miss).
    """
    out = [{"kind": "run", "session": "s1", "fingerprint": {"gpus": [{"name": "Fake GPU"}]}, "profiles": {}}]
    cells = [("AR", None), ("DFLASH", None), *(("DDTREE", b) for b in budgets)]
    for algorithm, budget in cells:
        for c in concurrency:
            tau = {"AR": 1.0, "DFLASH": dflash_tau}.get(algorithm) or taus[budget]
            rounds = round((new_tokens - 1) / tau)
            latency = scale(algorithm, budget, c) * (ttft_ms + rounds * round_ms(algorithm, budget, c)) / 1e3
            cell = Cell(profile, algorithm, budget, c, 0.0, "humaneval", new_tokens)
            for i in range(requests):
                start = (i // c) * latency
                out.append({"kind": "request", "session": "s1", "cell": asdict(cell), "index": i, "start": start,
                            "end": start + latency, "completion_tokens": new_tokens,
                            "spec_verify_ct": None if algorithm == "AR" else rounds,
                            "tau": None if algorithm == "AR" else new_tokens / rounds,
                            "ttft_s": ttft_ms / 1e3, "latency_s": latency, "chunks": []})
    return out


def linear_round_ms(algorithm: str, budget: int | None, c: int) -> float:
    """A round: drafter 2 ms + 0.5 ms per request, verify 4 ms + 0.01 ms per verify token."""
    verify = 4.0 + 0.01 * c * ((budget or 0) + 1 if algorithm == "DDTREE" else 16 if algorithm == "DFLASH" else 1)
    return verify if algorithm == "AR" else verify + 2.0 + 0.5 * c
