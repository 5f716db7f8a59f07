"""Whole decode loops with `repro.toy`: DDTree is lossless against plain autoregressive decoding.

Greedy: token-for-token equality (and equal committed hidden states) over many rounds, batch
sizes and budgets. T > 0: the distribution of DDTree-sampled continuations matches the toy
target's exact distribution (chi-square, alpha and sample count from thresholds.toml).
"""

from __future__ import annotations

import random
import tomllib
from importlib import resources

import pytest
import torch

from repro.schedule import BudgetSchedule
from repro.toy import Sampling, ToyDrafter, ToyTarget, decode_ar, decode_ddtree, prefill
from verify.chi_square import chi_square_p

STATS = tomllib.loads(resources.files("repro.data").joinpath("thresholds.toml").read_text())["stats"]


def _prompts(bs: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (bs, length), generator=torch.Generator().manual_seed(seed))


class TestGreedyLossless:
    @pytest.mark.parametrize(("budget", "bs", "seed"), [(0, 1, 0), (1, 3, 1), (4, 2, 2), (16, 4, 3), (64, 2, 4), (256, 1, 5)])
    def test_tokens_and_hidden_states_equal_ar(self, budget, bs, seed):
        """Every generated token and every committed hidden state equals greedy AR decoding."""
        target = ToyTarget(seed=seed)
        drafter = ToyDrafter(target, seed=seed + 10)
        prompts = _prompts(bs, 9, target.vocab, seed)
        ar = decode_ar(target, prompts, 40, Sampling())
        dd = decode_ddtree(target, drafter, prompts, 40, budget, Sampling())
        assert dd.tokens == ar.tokens
        for ar_h, dd_h in zip(ar.hidden, dd.hidden, strict=True):
            common = min(len(ar_h), len(dd_h))
            assert torch.allclose(torch.stack(ar_h[:common]), torch.stack(dd_h[:common]), rtol=0, atol=1e-12)
        if budget >= 16:  # the tree really took side branches and multi-token rounds
            assert max(t for rnd in dd.taus for t in rnd) > 2

    def test_larger_budgets_accept_more(self):
        """Mean tau grows with the budget on the toy pair (same prompts, same drafter seed)."""
        target = ToyTarget(seed=7)
        prompts = _prompts(4, 9, target.vocab, 7)
        means = []
        for budget in (1, 16, 128):
            dd = decode_ddtree(target, ToyDrafter(target, seed=8), prompts, 48, budget, Sampling())
            taus = [t for rnd in dd.taus for t in rnd]
            means.append(sum(taus) / len(taus))
        assert means[0] < means[1] < means[2]


class TestBudgetPerRound:
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_a_random_budget_each_round_equals_ar(self, seed):
        """Greedy decoding with a new random budget every round (0 to wider than the horizon)
        emits AR's tokens: nothing a round keeps depends on the budget of the round before."""
        target = ToyTarget(seed=seed)
        prompts = _prompts(4, 9, target.vocab, seed)
        rng = random.Random(seed)  # noqa: S311 - a seeded test sequence
        used = []

        def budget(_bs: int) -> int:
            used.append(rng.choice([0, 1, 3, 7, 15, 16, 40]))
            return used[-1]

        ar = decode_ar(target, prompts, 40, Sampling())
        dd = decode_ddtree(target, ToyDrafter(target, seed=seed + 10), prompts, 40, budget, Sampling(),
                           on_round=lambda rnd: used.append(-rnd.out.tree.budget))
        assert dd.tokens == ar.tokens
        chosen, built = used[0::2], [-b for b in used[1::2]]
        assert chosen == built and len(set(chosen)) >= 4  # each round built the tree it was given

    def test_a_schedule_follows_the_running_batch(self):
        """With a schedule, each round's budget is the schedule's at the batch still running."""
        target = ToyTarget(seed=5)
        prompts = _prompts(4, 9, target.vocab, 5)
        schedule = BudgetSchedule.parse("1:24,2:8,4:2")
        seen = []  # requests reach their 40 tokens at different rounds, so the batch shrinks 4 -> 1
        dd = decode_ddtree(target, ToyDrafter(target, seed=15), prompts, 40, schedule.budget, Sampling(),
                           on_round=lambda rnd: seen.append((len(rnd.requests), rnd.out.tree.budget)))
        assert all(b == schedule.budget(bs) for bs, b in seen)
        assert {b for _, b in seen} >= {2, 24}
        assert dd.tokens == decode_ar(target, prompts, 40, Sampling()).tokens


def _rule_probs(logits: torch.Tensor, rule: Sampling) -> torch.Tensor:
    """The exact distribution of a decoding rule over logits [..., V] (independent of the sampler)."""
    p = torch.softmax(logits.double() / rule.temperature, -1)
    sorted_p, order = torch.sort(p, -1, descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if rule.top_k > 0:
        keep[..., rule.top_k:] = False
    keep &= (torch.cumsum(sorted_p, -1) - sorted_p) < rule.top_p
    kept = torch.where(keep, sorted_p, 0.0)
    return torch.zeros_like(p).scatter(-1, order, kept / kept.sum(-1, keepdim=True))


def _exact_three_token_distribution(target: ToyTarget, prompt: torch.Tensor, rule: Sampling) -> torch.Tensor:
    """P(t0, t1, t2 | prompt) under ``rule``, shape [V, V, V], by enumerating every context."""
    v = target.vocab
    gen = torch.Generator().manual_seed(0)
    cache, _ = prefill(target, prompt.expand(v * v, -1).contiguous(), prompt.shape[0] + 3, rule, gen)
    p0 = _rule_probs(_last_logits(target, prompt), rule)
    t0 = torch.arange(v).repeat_interleave(v)
    t1 = torch.arange(v).repeat(v)
    l1, _ = target.step(t0, cache)
    l2, _ = target.step(t1, cache)
    p1 = _rule_probs(l1, rule).view(v, v, v)[:, 0, :]  # P(t1 | t0): same for every t1 slot
    p2 = _rule_probs(l2, rule).view(v, v, v)  # P(t2 | t0, t1)
    return p0[:, None, None] * p1[:, :, None] * p2


def _last_logits(target: ToyTarget, prompt: torch.Tensor) -> torch.Tensor:
    from repro.toy import KVCache

    cache = KVCache.empty(1, prompt.shape[0] + 1, target.dim)
    for tok in prompt:
        logits, _ = target.step(tok[None], cache)
    return logits[0]


def _ddtree_samples(target, rule: Sampling, budget: int, n: int, seed: int):
    prompt = torch.tensor([1, 4, 2])
    drafter = ToyDrafter(target, horizon=4, noise=0.3, seed=seed)
    dd = decode_ddtree(target, drafter, prompt.expand(n, -1).contiguous(), 3, budget, rule, seed=seed)
    return prompt, torch.tensor(dd.tokens), dd.taus


def _chi_square_p(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the first three tokens of ``samples`` against their exact distribution ``probs``."""
    v = probs.shape[0]
    cells = (samples[:, 0] * v + samples[:, 1]) * v + samples[:, 2]
    return chi_square_p(torch.bincount(cells, minlength=v**3), probs)


class TestSamplingLossless:
    @pytest.mark.parametrize("rule", [Sampling(temperature=0.9), Sampling(temperature=0.7, top_k=4, top_p=0.9)])
    def test_first_three_tokens_follow_the_target_distribution(self, rule):
        """DDTree (B = 8) samples of the first three tokens pass a chi-square test against the
        target's exact distribution at alpha; fixed seeds keep the outcome deterministic."""
        target = ToyTarget(vocab=6, dim=8, seed=3, sharpness=1.5)
        prompt, samples, taus = _ddtree_samples(target, rule, 8, STATS["samples"], seed=11)
        probs = _exact_three_token_distribution(target, prompt, rule)
        assert _chi_square_p(samples, probs) > STATS["alpha"]
        flat = [t for rnd in taus for t in rnd]
        assert sum(flat) / len(flat) > 1.3  # the tree, not just the root, produced tokens

    def test_a_random_budget_each_round_keeps_the_distribution(self):
        """With a random budget every round (0 to 12, horizon 4), the first three tokens still pass
        the chi-square test against the target's exact distribution."""
        target = ToyTarget(vocab=6, dim=8, seed=3, sharpness=1.5)
        rule = Sampling(temperature=0.9)
        rng = random.Random(4)  # noqa: S311 - a seeded test sequence
        prompt, samples, _ = _ddtree_samples(target, rule, lambda _bs: rng.choice([0, 1, 2, 5, 12]),
                                             STATS["samples"], seed=11)
        assert _chi_square_p(samples, _exact_three_token_distribution(target, prompt, rule)) > STATS["alpha"]

    def test_negative_control_detects_the_wrong_distribution(self):
        """The same test rejects (p < alpha) samples compared against a different temperature."""
        target = ToyTarget(vocab=6, dim=8, seed=3, sharpness=1.5)
        prompt, samples, _ = _ddtree_samples(target, Sampling(temperature=0.9), 8, STATS["samples"], seed=11)
        wrong = _exact_three_token_distribution(target, prompt, Sampling(temperature=1.2))
        assert _chi_square_p(samples, wrong) < STATS["alpha"]
