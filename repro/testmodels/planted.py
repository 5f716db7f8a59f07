"""The planted construction, shared by the small written targets and the full-size planted ones.

With every layer inert (attention ``o_proj`` and MLP ``down_proj`` zero), the residual stream of
context token ``t`` is its embedding, the one-hot vector of coordinate ``c = t mod H``; the final
RMSNorm (weight 1) scales it to ``h = rsqrt(1 / H + eps)`` at ``c``, and the LM head row of token
``u = ranked[k][c]`` holds ``LOGITS[k] / sqrt(H)`` at ``c``. So after ``t`` the logits are exactly
``served_logits(H, eps)[k]`` for the three ranked tokens and 0 for every other token: greedy
decoding follows ``successor[t] = ranked[0][t mod H]`` with a one-logit margin, and sampling at
temperature T has the law of :func:`next_token_probs`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

LOGITS = (16.0, 15.0, 14.0)  # rank-0/1/2 logits of the planted target
RANK_OFFSETS = (0, 17, 34)  # ranked[k][c] = perm[(c + offset_k) mod H]: distinct per context
DEFAULT_RANK_PROBS = (0.6, 0.2, 0.1)  # hook: P(correct token at rank j), absent otherwise


def planted_ranked(hidden: int, seed: int) -> list[list[int]]:
    """ranked[k][c]: the rank-k next token after any context token t with t mod H == c."""
    perm = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed)).tolist()
    return [[perm[(c + off) % hidden] for c in range(hidden)] for off in RANK_OFFSETS]


def successor_table(ranked: list[list[int]], vocab: int) -> list[int]:
    """successor[t] for every token t: the planted target's greedy next token."""
    hidden = len(ranked[0])
    return [ranked[0][t % hidden] for t in range(vocab)]


def head_values(hidden: int) -> list[float]:
    """The LM head entry of each rank (before the bf16 cast): ``LOGITS[k] / sqrt(H)``."""
    return [lg / math.sqrt(hidden) for lg in LOGITS]


def served_logits(hidden: int, eps: float) -> list[float]:
    """The rank-0/1/2 logits the bf16 model really produces.

    RMSNorm in float32 of the one-hot residual gives ``rsqrt(1 / H + eps)``, cast to bf16; the
    head's single nonzero product is exact in float32 and cast to bf16.
    """
    mean_sq = torch.tensor(1.0 / hidden, dtype=torch.float32)
    h = torch.rsqrt(mean_sq + eps).to(torch.bfloat16)
    return [float((h * torch.tensor(v).to(torch.bfloat16)).to(torch.bfloat16)) for v in head_values(hidden)]


@torch.no_grad()
def fill_embedding_(weight: torch.Tensor, vocab: int) -> None:
    """Row ``t < vocab`` of ``weight`` [rows >= vocab, H] becomes the one-hot of ``t mod H``."""
    hidden = weight.shape[1]
    weight.zero_()
    tokens = torch.arange(vocab, device=weight.device)
    weight[tokens, tokens % hidden] = 1.0


@torch.no_grad()
def fill_head_(weight: torch.Tensor, ranked: list[list[int]]) -> None:
    """The planted LM head in ``weight`` [rows >= vocab, H]: rank k's token at each context."""
    hidden = weight.shape[1]
    weight.zero_()
    cols = torch.arange(hidden, device=weight.device)
    for tokens, value in zip(ranked, head_values(hidden), strict=True):
        weight[torch.tensor(tokens, device=weight.device), cols] = value


def planted_info(ranked: list[list[int]], *, vocab: int, eps: float, **extra: object) -> dict:
    """The ``planted.json`` content: the ranked tokens and served logits (plus ``extra`` keys)."""
    hidden = len(ranked[0])
    return {"ranked": ranked, "logits": served_logits(hidden, eps), "vocab_size": vocab,
            "hidden_size": hidden, **extra}


def greedy_continuation(planted: dict, last_token: int, n: int) -> list[int]:
    """The planted target's greedy output of ``n`` tokens after a prompt ending in ``last_token``."""
    succ = successor_table(planted["ranked"], planted["vocab_size"])
    out, t = [], last_token
    for _ in range(n):
        t = succ[t]
        out.append(t)
    return out


def next_token_probs(planted: dict, last_token: int, temperature: float) -> dict[int, float]:
    """Exact next-token distribution after ``last_token`` at ``temperature`` > 0 (no top-k/p).

    The three ranked tokens get their planted logits, every other token logit 0.
    """
    hid, vocab = planted["hidden_size"], planted["vocab_size"]
    c = last_token % hid
    weights = {planted["ranked"][k][c]: math.exp(lg / temperature) for k, lg in enumerate(planted["logits"])}
    rest = (vocab - len(weights)) * 1.0  # exp(0 / T) for every other token
    total = sum(weights.values()) + rest
    return {tok: w / total for tok, w in weights.items()} | {-1: rest / total}  # -1: any other


def write_hook(
    path: Path,
    planted: dict,
    *,
    rank_probs: Sequence[float] = DEFAULT_RANK_PROBS,
    seed: int = 0,
    profile: str | None = None,
) -> None:
    """The drafter test-hook file for a planted target (format: repro.drafter_hook.hook).

    ``profile`` names a profile of repro/data/drafter_profiles.toml; the file then carries its
    table inline (it reads the same wherever it is loaded) instead of ``rank_probs``.
    """
    from repro.drafter_hook.profiles import named_profile

    rows = {"rank_probs": list(rank_probs)} if profile is None else {"profile": named_profile(profile)}
    spec = {"successor": successor_table(planted["ranked"], planted["vocab_size"]), **rows, "seed": seed}
    path.write_text(json.dumps(spec) + "\n")
