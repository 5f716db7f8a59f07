"""CPU checks of verify/bench/hook_law.py: the rounds the drafter test hook makes a served request
take, and the committed H200 runs against them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from repro.ddtree import build_trees, walk
from repro.drafter_hook.hook import DrafterTestHook
from repro.drafter_hook.profiles import load_profiles
from repro.evidence.prompts import load_prompts, request_input
from repro.files import read_text
from repro.testmodels.fullsize import load_model, write_model
from verify.bench import hook_law

PERF = Path(__file__).resolve().parents[2] / "docs" / "perf"
SIDE = PERF / "side_qwen3-8b_h200_2026-12-03.jsonl.gz"  # AR, DFLASH, DDTREE B 63 / 127 on qwen3-8b
K26 = PERF / "fullsize_k26-tp8_h200_2026-12-03.jsonl.gz"  # DDTREE B 16 / 17 on k26-tp8
K26_WIDE = PERF / "fullsize_k26-tp8_h200_2026-12-04.jsonl.gz"  # DDTREE B 128 / 256 on k26-tp8, T 0 and 1
K26_B512 = PERF / "fullsize_k26-tp8_h200_2026-12-04b.jsonl.gz"  # B 512 at T 0 (and AR, T 1 cells) on k26-tp8
K26_DISTINCT = PERF / "fullsize_k26-tp8_h200_2026-12-04c.jsonl.gz"  # DFLASH, B 16 / 32 / 64 at c 4, 16, distinct roots
SIDE_B = PERF / "side_qwen3-8b_h200_2026-12-03b.jsonl.gz"  # DFLASH, DDTREE B 16 / 63 / 127 after the top-K scan
SIDE_ATTN = [PERF / f"side_qwen3-8b_h200_2026-12-04{r}.jsonl.gz" for r in ("", "b", "c")]  # split-KV verify attention
SIDE_HEAD = [PERF / f"side_qwen3-8b_h200_2026-12-04{r}.jsonl.gz" for r in "def"]  # DFLASH on it too; the hook after the head
SIDE_ODD = [PERF / f"side_qwen3-8b_h200_2026-12-04{r}.jsonl.gz" for r in "ghi"]  # decoys at an odd stride; tree-wide key blocks
SIDE_WIDE = PERF / "side_qwen3-8b_h200_2026-12-04j.jsonl.gz"  # B 63's tree in the attention's wide tiles
SIDE_FLOOR = [PERF / f"side_qwen3-8b_h200_2026-12-04{r}.jsonl.gz" for r in "lmop"]  # the hook's floor levels: B 16-256


def _hook(profile: dict, vocab: int, horizon: int) -> DrafterTestHook:
    return DrafterTestHook.build([(5 * t + 3) % vocab for t in range(vocab)], profile, horizon=horizon)


@pytest.mark.parametrize(("name", "vocab", "horizon", "budgets"), [
    ("paper-qwen3-8b-math500", 151936, 15, [16, 64, 512]),
    ("kimi-k2.5-dflash-gsm8k", 163840, 7, [16, 64]),
])
def test_rank_rows_accept_what_the_full_rows_do(name, vocab, horizon, budgets):
    """Every round's τ from the rows over the ranked tokens alone equals repro.ddtree's walk over the
    hook's full rows at the target's vocabulary, with the planted successor as the target (and
    DFLASH's chain of row argmaxes): the extra tokens only add logits of -30."""
    hook = _hook(load_profiles()[name], vocab, horizon)
    i = torch.arange(32, dtype=torch.int64)
    roots, prefix_lens = (i * 40503 + 7) % vocab, 200 + 37 * i
    rows = hook.logits(roots, prefix_lens)
    chain = 1 + (rows.argmax(-1) == hook.correct_tokens(roots)).long().cumprod(1).sum(1)
    assert torch.equal(hook_law.round_lengths(hook, roots, prefix_lens, None), chain)
    for budget in budgets:
        tree = build_trees(rows, budget, roots)
        full = walk(tree, hook.successor[tree.tokens.clamp(min=0)]).accept_len
        assert torch.equal(hook_law.round_lengths(hook, roots, prefix_lens, budget), full), budget


@pytest.mark.parametrize("budget", [None, 4, 7])
def test_a_certain_drafter_accepts_whole_blocks_and_a_hopeless_one_single_tokens(budget):
    """Correct token always at rank 0: every round accepts L + 1 tokens, the last one what is left
    of max_new_tokens; never ranked: one token a round."""
    prompts, horizon, max_new = [[3, 1, 4], [1, 5, 9, 2, 6], [5]], 7, 50
    certain = _hook({"kind": "fixed", "rank_probs": [1.0]}, 64, horizon)
    hopeless = _hook({"kind": "fixed", "rank_probs": [0.0]}, 64, horizon)
    full = math.ceil((max_new - 1) / (horizon + 1)) if budget is None or budget >= horizon else \
        math.ceil((max_new - 1) / (budget + 1))  # a chain of B nodes: B + 1 tokens a round
    assert hook_law.request_rounds(certain, prompts, max_new, budget) == [full] * 3
    assert hook_law.request_rounds(hopeless, prompts, max_new, budget) == [max_new - 1] * 3


def test_a_tree_that_reaches_the_unranked_tokens_is_refused():
    """One ranked token a row and B 8 > L 7: the tree's eighth node is a -30 token, which of them
    depends on the vocabulary's order, so the law refuses it (one ValueError) rather than guess."""
    hook = _hook({"kind": "fixed", "rank_probs": [0.5]}, 64, 7)
    with pytest.raises(ValueError, match="the law is not defined there"):
        hook_law.round_lengths(hook, torch.tensor([1, 2]), torch.tensor([10, 20]), 8)


def test_batched_requests_take_the_rounds_of_one_request_at_a_time():
    """request_rounds over many prompts at once equals it prompt by prompt (prompts of several
    lengths finish in different rounds)."""
    hook = _hook(load_profiles()["paper-qwen3-8b-math500"], 997, 15)
    prompts = [[(7 * k + j) % 997 for j in range(5 + 3 * k)] for k in range(6)]
    for budget in (None, 24):
        together = hook_law.request_rounds(hook, prompts, 120, budget)
        assert together == [hook_law.request_rounds(hook, [p], 120, budget)[0] for p in prompts]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The full-size targets' configs and hook files (no weights), as `repro testmodels` writes them."""
    root = tmp_path_factory.mktemp("models")
    for name in ("qwen3-8b", "k26-tp8"):
        write_model(root, load_model(name))
    return root


@pytest.mark.slow  # minutes: every committed request re-walked through the law
@pytest.mark.parametrize(("raw", "requests"), [(SIDE, 144), (K26, 192), (SIDE_B, 112),
                                               *zip(SIDE_ATTN, (96, 32, 48), strict=True),
                                               *zip(SIDE_HEAD, (192, 192, 144), strict=True),
                                               *zip(SIDE_ODD, (144, 656, 984), strict=True), (SIDE_WIDE, 984),
                                               *zip(SIDE_FLOOR, (144, 192, 984, 1292), strict=True), (K26_WIDE, 96),
                                               (K26_B512, 48), (K26_DISTINCT, 128)])
def test_the_committed_served_requests_take_exactly_the_laws_rounds(models, raw, requests, capsys):
    """Every T = 0 DFLASH and DDTREE request the H200 served in these runs (`repro bench`'s
    spec_verify_ct) took the law's rounds: also the served check of the top-K kernel's exactness
    (SIDE_B ran its chunked slow path on the hook's tied rows, B 63 / 127), and of the split-KV
    verify attention with the hook's spread decoys (SIDE_ATTN: B 15 / 31 / 63 at c 1, 4, 16), and of
    DFLASH's chains on it and the hook's rows written over DDTREE's drafter LM head (SIDE_HEAD), and
    of the hook's rows at an odd decoy stride and the attention's tree-wide key blocks (SIDE_ODD,
    two of them over all 164 prompts), and of its wide query tiles (SIDE_WIDE: B 63 at c 1 and 4),
    and of the hook's floor levels (SIDE_FLOOR: B 16-256 at c 1, 4, 16; B 31 / 63 / 95 / 127 over all
    164), and k26-tp8's B 128 / 256 (K26_WIDE) and B 512, its verify graphs captured to bs 8 and
    bs 16 eager (K26_B512), and its batches of distinct last tokens (K26_DISTINCT: each request its
    own experts). Run n (B 512) is left out: one of its 96 requests, at c 16, was retracted for KV
    cache (a 1.55 s stall, then a one-token re-prefill) and took 25 rounds where the law, which knows
    no retraction, says 26; run q (B 512 on the split-KV attention) likewise (c 16, a 1.26 s stall)."""
    assert hook_law.main([str(raw), "--models-dir", str(models)]) == 0
    assert f"{requests} of {requests} requests took exactly the law's rounds" in capsys.readouterr().out


def test_a_request_that_took_another_round_count_fails(models, tmp_path, capsys):
    """One served request with one round more than the law: named in its cell, exit 1."""
    lines = read_text(SIDE, "SIDE").splitlines()
    at = next(i for i, line in enumerate(lines) if '"DDTREE"' in line and '"kind": "request"' in line)
    row = json.loads(lines[at])
    row["spec_verify_ct"] += 1
    lines[at] = json.dumps(row)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert hook_law.main([str(bad), "--models-dir", str(models), "--json"]) == 1
    cells = json.loads(capsys.readouterr().out)
    assert [(c["label"], c["mismatched"]) for c in cells if c["mismatched"]] == [
        (f"DDTREE B={row['cell']['budget']}", [row["index"]])]


def test_the_population_is_the_whole_prompt_set(models, capsys):
    """--population: the law's τ over every prompt of the set, the served prompts among them."""
    assert hook_law.main([str(SIDE), "--models-dir", str(models), "--population", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["population_prompts"] for r in rows} == {len(load_prompts("humaneval").prompts)}
    dflash = next(r for r in rows if r["label"] == "DFLASH")
    hook = DrafterTestHook.from_file(models / "qwen3-8b" / "hook.json", horizon=15, vocab_size=151936, device="cpu")
    ids = [request_input(p, tokenizer="none", vocab_size=151936, max_tokens=1024)["input_ids"]
           for p in load_prompts("humaneval").prompts]
    counts = hook_law.request_rounds(hook, ids, 256, None)
    assert dflash["population_tau"] == pytest.approx(sum(256 / n for n in counts) / len(counts))
    assert dflash["law_tau"] == pytest.approx(sum(256 / n for n in counts[:16]) / 16)


@pytest.mark.parametrize(("edit", "message"), [
    ("missing", "does not exist"),
    ("ar-only", "no T = 0 DFLASH or DDTREE request"),
    ("no-models", "repro testmodels"),
])
def test_bad_input_is_one_line_exit_2(models, tmp_path, capsys, edit, message):
    """A missing file, results without a speculative T = 0 request, or models not written: one
    line on stderr, exit 2."""
    path, root = SIDE, models
    if edit == "missing":
        path = tmp_path / "nope.jsonl"
    elif edit == "ar-only":
        path = tmp_path / "ar.jsonl"
        path.write_text("".join(line + "\n" for line in read_text(SIDE, "SIDE").splitlines()
                                if '"algorithm": "DFLASH"' not in line and '"algorithm": "DDTREE"' not in line))
    else:
        root = tmp_path / "empty"
    assert hook_law.main([str(path), "--models-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
