"""The tuning acceptance bounds on the toy: tau for every budget from one B = 256 recording.

One greedy B = 256 decode of the toy pair is recorded through `repro.recording` (the file is read
back with `repro.tuning.acceptance`). In every round the hook also builds the trees of B' = 1, 4, 16, 64
and the DFLASH chain from that round's drafter rows and verifies them against the same cache with
the toy target: the recorded offline tau must equal each walk exactly, and the chain's tau must
equal the recording's figure where it decides and lie inside its bounds where it is censored.

Separate decodes at each B' must then reach a tau within 5% of the offline figure. At T = 0 every
decode emits the same (greedy) tokens, so the two figures are paired by request; the test checks
that 5% is at least 3.5 standard errors of their difference (requests are the independent units:
paired linearised ratio variance), so passing is not luck and a bias of 5% would be seen.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from repro.ddtree import DraftTree, greedy_tokens, topk_logprobs, verify_tensors, walk
from repro.recording import Recorder
from repro.toy import Sampling, ToyDrafter, ToyRound, ToyTarget, decode_ddtree, toy_round
from repro.tuning.acceptance import chain_tau, read_recordings, tau_at

BUDGET, SMALL = 256, (1, 4, 16, 64)
BATCH, NEW_TOKENS, SEED = 32, 160, 11
TOLERANCE = 0.05  # separate decodes within 5% of the offline figure
MIN_SIGMAS = 3.5  # the tolerance must be at least this many standard errors of the difference


class Greedy(Sampling):
    """Temperature 0 straight to argmax (what `Sampling()` computes, without the sampler's sort)."""

    def choose(self, logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Argmax per row."""
        return greedy_tokens(logits)


def _chain_tree(roots: torch.Tensor, chain: torch.Tensor) -> DraftTree:
    """The DFLASH chain as a tree: root, then one node per depth holding that depth's rank-0 token."""
    bs, horizon = chain.shape
    idx = torch.arange(horizon + 1).expand(bs, -1)
    return DraftTree(tokens=torch.cat([roots[:, None], chain], 1), parents=idx - 1, depths=idx.clone(),
                     num_nodes=torch.full((bs,), horizon + 1), scores=-idx.double(), budget=horizon,
                     horizon=horizon, has_root=True)


def _toy():
    target = ToyTarget(seed=SEED)
    prompts = torch.randint(0, target.vocab, (BATCH, 12), generator=torch.Generator().manual_seed(SEED + 2))
    return target, prompts


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The toy's tensors are tiny: intra-op threads only add overhead (5x slower with 2 threads on
    2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, _one_thread):
    """The recording of one B = 256 decode, and per (step, request) what B' and the chain accept."""
    target, prompts = _toy()
    path = tmp_path_factory.mktemp("rec") / "toy.jsonl"
    truth: dict[tuple[int, str], tuple[list[int], int]] = {}
    recorder = Recorder(path, budget=BUDGET, horizon=15, config={"test": "toy"}, source="toy")

    def hook(rnd: ToyRound) -> None:
        ids = [f"toy/{i}" for i in rnd.requests]
        rank0_ids = topk_logprobs(rnd.draft_logits, 1).ids[..., 0]
        step = recorder.step
        recorder.record_round(ids, rnd.out.tree, rank0_ids, rnd.out.walk)
        lens = rnd.cache.lens
        gen = torch.Generator()  # greedy: never drawn from
        small = [toy_round(target, rnd.draft_logits, rnd.cache.clone(), rnd.roots, b, Greedy(), gen).accepted.accept_len
                 for b in SMALL]
        chain = _chain_tree(rnd.roots, rank0_ids)
        vt = verify_tensors(chain, lens, int(lens.sum()))
        logits = target.verify(vt.input_ids, vt.positions, vt.full_mask, chain.n, rnd.cache)[0]  # the round's own cache
        chain_tau_true = walk(chain, greedy_tokens(logits)).accept_len
        for b, req in enumerate(ids):
            truth[step, req] = ([int(t[b]) for t in small], int(chain_tau_true[b]))

    decode_ddtree(target, ToyDrafter(target, seed=SEED + 1), prompts, NEW_TOKENS, BUDGET, Greedy(), on_round=hook)
    recorder.close()
    (recording,) = read_recordings(path)
    return recording, truth


def test_offline_tau_equals_the_walk_at_every_smaller_budget(recorded):
    """In every round, 1 + #(path ids <= B') is exactly what the B' tree built from the same rows
    accepts against the same cache."""
    recording, truth = recorded
    assert len(recording.rounds) == len(truth) > 500
    for r in recording.rounds:
        assert [tau_at(r.path, b) for b in SMALL] == truth[r.step, r.req][0], (r.step, r.req, r.path)
    # the check discriminates: B = 256 often accepts nodes past 64, and the budgets differ
    assert sum(bool(r.path) and r.path[-1] > 64 for r in recording.rounds) > 50
    assert sum(tau_at(r.path, 1) < tau_at(r.path, 16) for r in recording.rounds) > 100


def test_chain_tau_is_decided_or_bounded(recorded):
    """The chain's recorded tau equals a real chain verify where it decides; censored rounds bound it."""
    recording, truth = recorded
    decided = 0
    for r in recording.rounds:
        low, high = chain_tau(r, recording.horizon)
        true = truth[r.step, r.req][1]
        assert low <= true <= high, (r.step, r.req)
        if low == high:
            decided += 1
            assert true == low
    assert decided > 0.9 * len(recording.rounds)


def _per_request(rows: list[tuple[str, float]]) -> dict[str, tuple[float, int]]:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for req, tau in rows:
        out[req][0] += tau
        out[req][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.slow
def test_separate_decodes_are_within_5_percent(recorded):
    """Decoding the same prompts at each B' gives a tau within 5% of the offline figure, and 5% is
    at least 3.5 standard errors of the paired difference."""
    recording, _ = recorded
    target, prompts = _toy()
    report = []
    for budget in SMALL:
        rows: list[tuple[str, float]] = []

        def hook(rnd: ToyRound, rows=rows) -> None:
            rows.extend((f"toy/{i}", t) for i, t in zip(rnd.requests, rnd.out.walk.accept_len.tolist(), strict=True))

        decode_ddtree(target, ToyDrafter(target, seed=SEED + 1), prompts, NEW_TOKENS, budget, Greedy(), on_round=hook)
        offline = _per_request([(r.req, tau_at(r.path, budget)) for r in recording.rounds])
        decoded = _per_request(rows)
        assert offline.keys() == decoded.keys()
        reqs = sorted(offline)
        r1 = sum(offline[q][0] for q in reqs) / sum(offline[q][1] for q in reqs)
        r2 = sum(decoded[q][0] for q in reqs) / sum(decoded[q][1] for q in reqs)
        x1 = sum(offline[q][1] for q in reqs) / len(reqs)
        x2 = sum(decoded[q][1] for q in reqs) / len(reqs)
        z = [(offline[q][0] - r1 * offline[q][1]) / x1 - (decoded[q][0] - r2 * decoded[q][1]) / x2 for q in reqs]
        se = math.sqrt(sum(v * v for v in z) / (len(reqs) * (len(reqs) - 1))) / r1
        report.append(f"B'={budget}: offline {r1:.3f} decode {r2:.3f} ({100 * (r2 / r1 - 1):+.1f}%, se {100 * se:.2f}%)")
        assert MIN_SIGMAS * se <= TOLERANCE, "; ".join(report)
        assert abs(r2 / r1 - 1) <= TOLERANCE, "; ".join(report)
