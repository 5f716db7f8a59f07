"""Tests for `repro.drafter_hook.hook` (the reference rows, the profiles and their fits) and
for `repro.drafter_hook.rows` under the Triton interpreter (TRITON_INTERPRET=1, in a subprocess)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import torch

from repro.drafter_hook.hashes import FLOOR_LEVELS, floor_logits
from repro.drafter_hook.hook import DrafterTestHook
from repro.drafter_hook.profiles import compile_profile, load_profiles, named_profile
from repro.kernels.topk_lse import TopKConfig, make_plan
from repro.testmodels.planted import write_hook
from verify.bench import fit_hook_profile as fit
from verify.chi_square import chi_square_p

REPO = Path(__file__).resolve().parents[2]
STATS = tomllib.loads(resources.files("repro.data").joinpath("thresholds.toml").read_text())["stats"]
V = 64
PAPER = "paper-qwen3-8b-math500"
KIMI = "kimi-k2.5-dflash-gsm8k"


def _hook(tmp_path, probs=(0.5, 0.3, 0.1), horizon=6):
    succ = [(5 * t + 3) % V for t in range(V)]
    path = tmp_path / "hook.json"
    path.write_text(json.dumps({"successor": succ, "rank_probs": list(probs), "seed": 3}))
    return DrafterTestHook.from_file(path, horizon=horizon, vocab_size=V, device="cpu"), succ


def _named(name: str, vocab: int = V, horizon: int = 15, seed: int = 0) -> DrafterTestHook:
    succ = [(7 * t + 1) % vocab for t in range(vocab)]
    return DrafterTestHook.build(succ, named_profile(name), horizon=horizon, seed=seed, name=name)


def _draws(n: int, vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.arange(n)
    return (i * 31 + 5) % vocab, 3 + 13 * i


class TestDrafterTestHook:
    def test_correct_token_sits_at_the_drawn_rank(self, tmp_path):
        """At every depth the planted continuation has the rank the hook drew (absent at R)."""
        hook, succ = _hook(tmp_path)
        roots, prefix = torch.arange(20) % V, torch.arange(20) * 3
        logits = hook.logits(roots, prefix)
        ranks = hook.ranks(roots, prefix)
        order = torch.argsort(logits, dim=-1, descending=True, stable=True)
        for b in range(20):
            tok = int(roots[b])
            for d in range(hook.horizon):
                tok = succ[tok]
                r = int(ranks[b, d])
                if r < 3:
                    assert int(order[b, d, r]) == tok
                    assert float(logits[b, d, tok]) == -r
                else:
                    assert float(logits[b, d, tok]) == float(floor_logits(torch.tensor(tok)))

    def test_rank_frequencies_follow_rank_probs(self, tmp_path):
        """Over many (root, prefix) pairs the drawn ranks match rank_probs within 2%."""
        hook, _ = _hook(tmp_path, probs=(0.6, 0.25, 0.1))
        n = 20000
        ranks = hook.ranks(torch.arange(n) % V, torch.arange(n))
        freq = torch.bincount(ranks.flatten(), minlength=4).double() / ranks.numel()
        assert torch.allclose(freq, torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64), atol=0.02)

    def test_default_profile_rows_are_unchanged(self, tmp_path):
        """The default hook's ranks on a fixed sample hash as they did before profiles existed
        (sha256 of the outputs of the implementation at 5683caa), its rows as since its decoys
        were spread over the vocabulary at an odd stride (``decoy_stride``) and its unranked tokens
        over the floor's levels (``floor_logits``)."""
        vocab = 4096
        path = tmp_path / "hook.json"
        succ = [(t * 2654435761 + 12345) % vocab for t in range(vocab)]
        path.write_text(json.dumps({"successor": succ, "rank_probs": [0.6, 0.2, 0.1], "seed": 7}))
        hook = DrafterTestHook.from_file(path, horizon=15, vocab_size=vocab, device="cpu")
        roots, prefix = (torch.arange(64) * 37) % vocab, torch.arange(64) * 101 + 5
        digest = lambda t: hashlib.sha256(t.numpy().tobytes()).hexdigest()  # noqa: E731
        assert digest(hook.logits(roots, prefix)) == "ed084ee48bd5056cf6a3752401f775b1dd8422a3289a6c05a61b3cf05f235016"
        assert digest(hook.ranks(roots, prefix)) == "2a60f303a37b524f82bec4d8156fdde5b19e40ef9c9ba34e823dbf1feb46fbd1"

    def test_named_default_profile_equals_bare_rank_probs(self, tmp_path):
        """A hook file naming the `default` profile gives the rows of the bare rank_probs file."""
        bare, succ = _hook(tmp_path, probs=(0.6, 0.2, 0.1))
        path = tmp_path / "named.json"
        path.write_text(json.dumps({"successor": succ, "profile": "default", "seed": 3}))
        named = DrafterTestHook.from_file(path, horizon=6, vocab_size=V, device="cpu")
        roots, prefix = _draws(50)
        assert named.profile == "default"
        assert torch.equal(named.logits(roots, prefix), bare.logits(roots, prefix))

    @pytest.mark.parametrize("name", ["default", PAPER, KIMI])
    def test_rank_zero_is_the_unique_maximum(self, name):
        """Every row's argmax is its rank-0 token, above every other logit of the row."""
        hook = _named(name)
        rows = hook.logits(*_draws(200))
        top = rows.max(-1, keepdim=True).values
        assert ((rows == top).sum(-1) == 1).all()

    def test_draws_are_deterministic(self, tmp_path):
        """The same (root, prefix) always gets the same rows: identical on every TP rank."""
        hook, _ = _hook(tmp_path)
        a = hook.logits(torch.tensor([1, 2]), torch.tensor([7, 9]))
        assert torch.equal(a, hook.logits(torch.tensor([1, 2]), torch.tensor([7, 9])))

    def test_rejects_a_wrong_size_successor_table(self, tmp_path):
        """A successor table of the wrong length is one ValueError naming the field."""
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"successor": [0, 1], "rank_probs": [0.5]}))
        with pytest.raises(ValueError, match="'successor' must list 64 token ids"):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")

    def test_rejects_successor_ids_out_of_range(self, tmp_path):
        """A successor id outside the vocabulary is one ValueError naming the field."""
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"successor": [*range(V - 1), V], "rank_probs": [0.5]}))
        with pytest.raises(ValueError, match=r"'successor' must hold token ids in \[0, 64\)"):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")

    def test_rejects_rank_probs_above_one(self, tmp_path):
        """rank_probs summing past 1 is one ValueError naming the field."""
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"successor": list(range(V)), "rank_probs": [0.8, 0.5]}))
        with pytest.raises(ValueError, match="'rank_probs' must be non-negative and sum to <= 1"):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")

    @pytest.mark.parametrize(
        ("edit", "match"),
        [
            ({"profile": "no-such"}, r"'profile' must name a profile of drafter_profiles.toml \(.*got 'no-such'\)"),
            ({"profile": 3}, "'profile' must be a profile name or a table"),
            ({"seed": -1}, r"'seed' must be an integer in \[0, 2\^31\)"),
            ({"rank_probs": None}, "needs 'profile'"),
        ],
    )
    def test_rejects_a_malformed_hook_file(self, tmp_path, edit, match):
        """Each malformed hook-file field is one ValueError naming it."""
        spec = {"successor": list(range(V)), "rank_probs": [0.5]} | edit
        spec = {k: v for k, v in spec.items() if v is not None}
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(spec))
        with pytest.raises(ValueError, match=match):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")

    @pytest.mark.parametrize(
        ("edit", "match"),
        [
            ({"kind": "sharp"}, "'kind' must be one of fixed, calibrated"),
            ({"stay": 1.5}, r"'stay' must be a number in \[0, 1\] \(got 1.5\)"),
            ({"ranks": 2.5}, r"'ranks' must be an integer >= 2"),
            ({"typo": 1}, "unknown key 'typo'"),
            ({"levels": []}, "'levels' must be a non-empty list of tables"),
            ({"levels": [{"choices": 1, "weight": 1.0}]}, r"levels\[0\]: 'miss' must be a number"),
            ({"levels": [{"choices": 40, "weight": 1.0, "miss": 0}]}, r"levels\[0\]: 'choices' must be an integer in \[1, 32\]"),
            ({"levels": [{"choices": 1, "weight": 0.0, "miss": 0}]}, "'weight' must not all be 0"),
            ({"spread": 0.0}, "level 1's logits must start at 0, strictly decrease"),
            ({"ranks": 70}, "needs fewer than 63 ranks for a vocabulary of 64"),
        ],
    )
    def test_rejects_a_malformed_profile(self, edit, match):
        """Each malformed profile field is one ValueError naming it."""
        profile = named_profile(PAPER) | edit
        with pytest.raises(ValueError, match=match):
            compile_profile(profile, vocab_size=V, where=PAPER)

    def test_inline_profile_in_a_hook_file(self, tmp_path):
        """A hook file may carry a profile table inline (as write_hook writes it)."""
        succ = [(7 * t + 1) % V for t in range(V)]
        path = tmp_path / "hook.json"
        path.write_text(json.dumps({"successor": succ, "profile": named_profile(KIMI), "seed": 0}))
        hook = DrafterTestHook.from_file(path, horizon=7, vocab_size=V, device="cpu")
        assert hook.profile == KIMI
        assert torch.equal(hook.logits(*_draws(30)), _named(KIMI, horizon=7).logits(*_draws(30)))


def test_decoys_lie_in_distinct_groups_of_32():
    """The paper profile's decoys (the ranked tokens but the correct one) sit in different groups
    of 32 ids, so the top-K's group keys see them apart, at V 4096 and at Qwen3's 151936."""
    for vocab in (4096, 151936):
        hook = _named("paper-qwen3-8b-math500", vocab=vocab, horizon=4)
        roots, prefix_lens = _draws(8, vocab)
        ranked = hook.logits(roots, prefix_lens) > -30
        ranked.scatter_(2, hook.correct_tokens(roots)[..., None], False)
        assert int(ranked.sum(-1).min()) >= 31  # 32 ranks, the correct token's among them or not
        for ids in (r.nonzero().flatten() for r in ranked.flatten(0, 1)):
            assert len(set((ids // 32).tolist())) == len(ids)

def test_the_floor_is_128_exact_levels_a_few_tokens_each():
    """Unranked tokens' logits: 128 values from -30 down, each exact in bfloat16 and float16, the
    top 127 holding about V / 8192 tokens each at Qwen3's vocabulary, the rest the lowest."""
    floor = floor_logits(torch.arange(151936))
    values, counts = torch.unique(floor, return_counts=True)
    assert len(values) == FLOOR_LEVELS and float(values.max()) == -30.0 and float(values.min()) == -59.75
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(floor.to(dtype).float(), floor)
    assert int(counts[1:].min()) >= 10 and int(counts[1:].max()) <= 30  # 151936 / 8192 = 18.5


@pytest.mark.parametrize("vocab", [151936, 163840])
def test_a_top_k_past_the_ranks_finds_few_tokens_at_its_threshold(vocab):
    """DDTREE's top-K at K 63-1023 on the paper profile's rows: the tokens reaching the select's
    threshold (the K-th largest super key, each the maximum of R group keys of 32 tokens) fit its
    candidate buffer, so no row takes the top-K's slow path. With every unranked token at -30
    (before the floor), 150 K tokens tied there past K 32."""
    hook = _named(PAPER, vocab=vocab, horizon=4)
    rows = hook.logits(*_draws(4, vocab)).flatten(0, 1).to(torch.bfloat16).float()
    for k in (63, 127, 255, 511, 1023):
        plan = make_plan(rows.shape[0], vocab, k, TopKConfig())
        groups = torch.nn.functional.pad(rows, (0, plan.groups * plan.group - vocab), value=float("-inf"))
        keys = groups.view(rows.shape[0], plan.groups, plan.group).amax(-1)
        keys = torch.nn.functional.pad(keys, (0, -plan.groups % plan.super_keys), value=float("-inf"))
        supers = keys.view(rows.shape[0], -1, plan.super_keys).amax(-1)
        threshold = supers.topk(k, dim=-1).values[:, -1:]
        assert int((rows >= threshold).sum(-1).max()) <= plan.cap, k


class TestWriteHook:
    def test_writes_a_profile_inline(self, tmp_path):
        """write_hook(profile=NAME) writes that profile's table into the hook file, which loads as
        the named profile; without it the file keeps the rank_probs format."""
        planted = {"ranked": [[(3 * i + 1) % V for i in range(16)]], "vocab_size": V}
        write_hook(tmp_path / "paper.json", planted, profile=PAPER, seed=4)
        write_hook(tmp_path / "default.json", planted)
        spec = json.loads((tmp_path / "paper.json").read_text())
        assert spec["profile"] == named_profile(PAPER) and spec["seed"] == 4 and "rank_probs" not in spec
        assert set(json.loads((tmp_path / "default.json").read_text())) == {"successor", "rank_probs", "seed"}
        hook = DrafterTestHook.from_file(tmp_path / "paper.json", horizon=15, vocab_size=V, device="cpu")
        want = DrafterTestHook.build(spec["successor"], named_profile(PAPER), horizon=15, seed=4)
        assert hook.profile == PAPER
        assert torch.equal(hook.logits(*_draws(20)), want.logits(*_draws(20)))

    def test_unknown_profile_is_refused(self, tmp_path):
        """An unknown profile name is one ValueError listing the known ones."""
        planted = {"ranked": [[1, 2]], "vocab_size": V}
        with pytest.raises(ValueError, match=r"no profile 'nope' \(known: default, kimi"):
            write_hook(tmp_path / "x.json", planted, profile="nope")


@pytest.fixture(scope="module")
def drawn():
    """(hook, profile, levels, ranks) of the paper profile over 40000 rounds."""
    hook = _named(PAPER)
    roots, prefix = _draws(40000)
    return hook, named_profile(PAPER), hook.levels(roots, prefix), hook.ranks(roots, prefix)


class TestCalibratedProfile:
    """The paper profile's draws against its own parameters (chi-square at thresholds.toml's alpha)."""

    def test_levels_follow_the_weights(self, drawn):
        """The first row's level is drawn by the levels' weights."""
        _, profile, levels, _ = drawn
        weights = torch.tensor([lv["weight"] for lv in profile["levels"]], dtype=torch.float64)
        counts = torch.bincount(levels[:, 0], minlength=len(weights)).double()
        assert chi_square_p(counts, weights) > STATS["alpha"]

    def test_levels_persist_along_the_block(self, drawn):
        """A row keeps the previous row's level with probability stay + (1 - stay) * weight."""
        _, profile, levels, _ = drawn
        pi = torch.tensor([lv["weight"] for lv in profile["levels"]], dtype=torch.float64)
        pi = pi / pi.sum()
        for k in range(len(pi)):
            prev = levels[:, :-1] == k
            kept = (levels[:, 1:] == k) & prev
            p = profile["stay"] + (1 - profile["stay"]) * pi[k]
            counts = torch.tensor([kept.sum(), (prev & ~kept).sum()], dtype=torch.float64)
            assert chi_square_p(counts, torch.tensor([p, 1 - p])) > STATS["alpha"], k

    def test_correct_rank_follows_the_rows_own_probabilities(self, drawn):
        """On the drafter's path (depth 1) the correct rank of a level-k row is drawn from that
        row's softmax times (1 - miss), absent otherwise: the rows are calibrated."""
        hook, profile, levels, ranks = drawn
        n_ranks = hook.tables.ranks
        for k, level in enumerate(profile["levels"]):
            q = torch.softmax(hook.tables.logits[k].double(), 0) * (1 - level["miss"])
            probs = torch.cat([q, 1 - q.sum()[None]])
            counts = torch.bincount(ranks[levels[:, 0] == k, 0], minlength=n_ranks + 1).double()
            assert chi_square_p(counts, probs) > STATS["alpha"], k

    def test_off_the_path_the_correct_token_is_missing_more(self, drawn):
        """Once an earlier correct token was not rank 0, a row's correct token is also absent with
        probability miss_off."""
        hook, profile, levels, ranks = drawn
        n_ranks = hook.tables.ranks
        k0 = (levels[:, 1] == 0) & (ranks[:, 0] != 0)  # level-0 rows at depth 2 after leaving the path
        q = torch.softmax(hook.tables.logits[0].double(), 0) * (1 - profile["levels"][0]["miss"])
        present = q.sum() * (1 - profile["miss_off"])
        counts = torch.tensor([(ranks[k0, 1] < n_ranks).sum(), (ranks[k0, 1] == n_ranks).sum()], dtype=torch.float64)
        assert chi_square_p(counts, torch.stack([present, 1 - present])) > STATS["alpha"]


class TestRows:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("name", ["default", PAPER])
    def test_cpu_rows_are_the_reference(self, name, dtype):
        """On CPU tensors rows() writes the reference rows, a vocabulary slice of them, and each
        row's argmax."""
        hook = _named(name, vocab=300)
        roots, prefix = _draws(7, 300)
        ref = hook.logits(roots, prefix)
        out, top1 = torch.empty(7, 15, 300, dtype=dtype), torch.empty(7, 15, dtype=torch.int64)
        assert hook.rows(roots, prefix.int(), out, top1) is out
        assert torch.equal(out.float(), ref) and torch.equal(top1, ref.argmax(-1))
        shard = hook.rows(roots, prefix, vocab_start=100, vocab_end=220)
        assert shard.dtype == torch.float32 and torch.equal(shard, ref[..., 100:220])

    @pytest.mark.parametrize("name", ["default", PAPER])
    def test_top1_is_the_rows_argmax(self, name):
        """top1() gives each row's argmax without the rows, into ``out`` when given."""
        hook = _named(name, vocab=300)
        roots, prefix = _draws(9, 300)
        want = hook.logits(roots, prefix).argmax(-1)
        out = torch.full((9, 15), -1, dtype=torch.int64)
        assert hook.top1(roots, prefix, out) is out and torch.equal(out, want)
        assert torch.equal(hook.top1(roots, prefix.int()), want)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"out": torch.empty(2, 15, 299)}, r"out must be \[2, 15, 300\]"),
            ({"out": torch.empty(2, 15, 300, dtype=torch.int32)}, "float32/bfloat16/float16"),
            ({"out": torch.empty(2, 300, 15).transpose(1, 2)}, "contiguous last dim"),
            ({"top1_out": torch.empty(2, 15, dtype=torch.int32)}, r"top1_out must be \[2, 15\] int64"),
            ({"vocab_start": 300}, r"0 <= start < end <= 300 \(got 300:300\)"),
        ],
    )
    def test_rejects_bad_arguments(self, kwargs, match):
        """Wrong output shapes, dtypes, layouts and slices are one ValueError each."""
        hook = _named("default", vocab=300)
        with pytest.raises(ValueError, match=match):
            hook.rows(torch.tensor([1, 2]), torch.tensor([5, 6]), **kwargs)


INTERPRETED = r"""
import sys, torch
from verify.kernel_cases import _fix_interpreter_for_numpy_2_4
_fix_interpreter_for_numpy_2_4()
from repro.drafter_hook.profiles import named_profile
from repro.kernels.topk_lse import TopKConfig, make_plan
from repro.drafter_hook.hashes import FLOOR_LEVELS, floor_logits
from repro.drafter_hook.hook import DrafterTestHook
one_level = {"kind": "calibrated", "ranks": 8, "spread": 0.25, "gap": 3.0, "slope": 1.0, "stay": 0.0,
             "miss_off": 0.5, "levels": [{"choices": 2, "weight": 1.0, "miss": 0.1}]}
cases = 0
for name, bs, horizon, vocab, dtype in [
    ("default", 3, 4, 50, torch.float32), ("paper-qwen3-8b-math500", 2, 15, 300, torch.bfloat16),
    ("kimi-k2.5-dflash-gsm8k", 1, 7, 4100, torch.float16), ("one-level", 1, 3, 40, torch.float32),
]:
    profile = one_level if name == "one-level" else named_profile(name)
    hook = DrafterTestHook.build([(7 * t + 1) % vocab for t in range(vocab)], profile, horizon=horizon, seed=5)
    block = torch.full((bs, 3), -1)  # roots as a strided column, as SGLang's block ids are
    block[:, 0] = (torch.arange(bs) * 97 + 11) % vocab
    prefix = torch.arange(bs, dtype=torch.int32) * 29 + 2
    ref = hook.logits(block[:, 0], prefix)
    out = torch.full((bs, horizon, vocab), 7.0, dtype=dtype)  # poisoned: every element must be written
    top1 = torch.full((bs, horizon), -7, dtype=torch.int64)
    hook.rows(block[:, 0], prefix, out, top1)
    assert torch.equal(out.float(), ref) and torch.equal(top1, ref.argmax(-1)), name
    block[:, 0] = (block[:, 0] * 5 + 3) % vocab  # new inputs in the same buffers, as a graph replay sees
    hook.rows(block[:, 0], prefix + 1, out, top1)
    ref = hook.logits(block[:, 0], prefix + 1)
    assert torch.equal(out.float(), ref) and torch.equal(top1, ref.argmax(-1)), name
    lo, hi = vocab // 3, vocab - 5  # a vocabulary shard
    shard = torch.full((bs, horizon, hi - lo), 7.0, dtype=dtype)
    hook.rows(block[:, 0], (prefix + 1).long(), shard, vocab_start=lo, vocab_end=hi)
    assert torch.equal(shard.float(), ref[..., lo:hi]), name
    top1.fill_(-7)
    assert hook.top1(block[:, 0], prefix + 1, top1) is top1 and torch.equal(top1, ref.argmax(-1)), name
    cases += 1
print(f"{cases} profiles equal")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_kernel_equals_the_reference_under_the_interpreter():
    """The one-launch kernel writes the reference rows bit for bit (float32, bfloat16, float16)
    and each row's argmax for the default, paper, Kimi and a one-level profile at bs 1-3, L 3-15,
    V 40-4100 (one and two vocabulary tiles), from strided roots and int32/int64 prefix lengths,
    into poisoned buffers, twice on the same buffers, for a vocabulary shard, and the argmax alone
    (top1)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "REPRO_DDTREE_KERNELS": "fused", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 profiles equal" in proc.stdout


@pytest.fixture(scope="module")
def record():
    """The committed fit record, drafter_profiles_fit.json."""
    return json.loads(fit.FIT_JSON.read_text())


class TestProfileFits:
    """The committed profiles against the figures they were fitted to (drafter_profiles_fit.json)."""

    def test_every_fitted_profile_is_recorded(self, record):
        """drafter_profiles_fit.json covers each profile with a [fit] table, with its targets."""
        profiles = load_profiles()
        fitted = {n for n, p in profiles.items() if "fit" in p}
        assert set(record["profiles"]) == fitted
        for name in fitted:
            assert record["profiles"][name]["targets"] == fit.targets(profiles[name])

    @pytest.mark.slow  # a minute a profile: thousands of rounds through repro.ddtree
    @pytest.mark.parametrize("name", [PAPER, KIMI])
    def test_check_sample_meets_the_targets(self, record, name):
        """Re-simulated on the record's first rounds (repro.ddtree's trees and walk over the hook's
        rows), τ equals the record and is within the tolerance of every target; so is the record's
        full sample."""
        entry, profile = record["profiles"][name], load_profiles()[name]
        check = entry["check"]
        got = fit.taus(fit.hook_for(profile, name=name), check["rounds"], fit.budgets_of(profile),
                       dflash_rounds=check["dflash_rounds"])
        assert got == pytest.approx(check["tau"], abs=1e-9)
        assert fit.misses(got, entry["targets"], entry["tolerance"]) == []
        assert fit.misses(entry["sample"]["tau"], entry["targets"], entry["tolerance"]) == []
