"""CPU checks of verify/bench/verify_cost.py (its timings run on the GPU machine only) and of the
figure it draws (repro.handoff.plots.verify_cost_vs_tokens)."""

from __future__ import annotations

import json

import pytest
import torch

from repro.handoff import plots
from repro.testmodels import fullsize
from verify.bench import verify_cost


class TestBusyTime:
    def test_overlapping_kernels_count_once(self):
        """The union of intervals: overlaps count once, gaps not at all, order does not matter."""
        assert verify_cost.busy_time([(5, 7), (0, 2), (1, 3), (10, 11)]) == 3 + 2 + 1
        assert verify_cost.busy_time([(0, 10), (2, 3)]) == 10
        assert verify_cost.busy_time([]) == 0


def _rows() -> list[dict]:
    return [{"bs": bs, "n": n, "wall_ms": 2.0 + n / 100, "gpu_busy_ms": 1.5 + n / 100, "kernels": 900}
            for bs in (1, 4) for n in verify_cost.TOKENS]


class TestFigure:
    def test_replot_draws_a_png_beside_the_json(self, tmp_path, capsys):
        """--replot draws a real PNG from saved rows, with no GPU."""
        saved = tmp_path / "verify_cost.json"
        saved.write_text(json.dumps({"model": "k26-tp8", "rows": _rows()}))
        assert verify_cost.main(["--replot", str(saved)]) == 0
        assert saved.with_suffix(".png").read_bytes().startswith(b"\x89PNG") and "wrote" in capsys.readouterr().out

    def test_replot_of_another_file_is_a_usage_error(self, tmp_path, capsys):
        """A JSON without rows exits 2 with one line naming the file."""
        bad = tmp_path / "other.json"
        bad.write_text("{}")
        assert verify_cost.main(["--replot", str(bad)]) == 2
        assert f"needs a verify_cost JSON with 'rows' ({bad}" in capsys.readouterr().err

    def test_nothing_timed_is_said_not_drawn(self, tmp_path):
        """Rows without timings give the sentence the report prints instead of a figure."""
        assert "no (bs, N) point was timed" in plots.verify_cost_vs_tokens([{"bs": 1, "n": 1}], tmp_path / "x.png")


class TestArguments:
    def test_model_dir_must_hold_planted_json(self, tmp_path, capsys):
        """A directory that is not a planted target is a usage error (exit 2) before any GPU check."""
        with pytest.raises(SystemExit) as exc:
            verify_cost.main([str(tmp_path)])
        assert exc.value.code == 2
        assert "MODEL_DIR must be a planted target directory holding planted.json" in capsys.readouterr().err

    def test_non_positive_counts_are_usage_errors(self, tmp_path, capsys):
        """--tokens 0 exits 2 naming the flags."""
        fullsize.write_model(tmp_path, fullsize.load_model("qwen3-8b"))
        with pytest.raises(SystemExit) as exc:
            verify_cost.main([str(tmp_path / "qwen3-8b"), "--tokens", "0"])
        assert exc.value.code == 2
        assert "--bs, --tokens and --reps take integers >= 1" in capsys.readouterr().err

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
    def test_no_gpu_is_one_line(self, tmp_path, capsys):
        """On a machine without CUDA the tool exits 2 with one line."""
        fullsize.write_model(tmp_path, fullsize.load_model("qwen3-8b"))
        assert verify_cost.main([str(tmp_path / "qwen3-8b")]) == 2
        assert capsys.readouterr().err.strip() == "verify_cost: needs a CUDA GPU (got none)"

    def test_tree_tokens_need_a_full_size_target(self, tmp_path, capsys):
        """--tree-tokens on a directory not named for a full-size target exits 2 naming them."""
        fullsize.write_model(tmp_path, fullsize.load_model("qwen3-8b"))
        (tmp_path / "qwen3-8b").rename(tmp_path / "mine")
        with pytest.raises(SystemExit) as exc:
            verify_cost.main([str(tmp_path / "mine"), "--tree-tokens"])
        assert exc.value.code == 2
        assert "--tree-tokens needs a full-size target's directory, named qwen3-8b or k26-tp8 (got mine)" in \
            capsys.readouterr().err


    def test_tree_tokens_take_a_prompt_a_request(self, tmp_path, capsys):
        """--tree-tokens with more requests than humaneval-distinct has prompts exits 2."""
        fullsize.write_model(tmp_path, fullsize.load_model("qwen3-8b"))
        with pytest.raises(SystemExit) as exc:
            verify_cost.main([str(tmp_path / "qwen3-8b"), "--tree-tokens", "--bs", "1", "165"])
        assert exc.value.code == 2
        assert "--bs at most 164 (got 165)" in capsys.readouterr().err
        from repro.evidence.prompts import load_prompts

        assert len(load_prompts(verify_cost.TREE_PROMPT_SET).prompts) == verify_cost.TREE_PROMPTS


class TestTreeInputs:
    def test_a_requests_tokens_are_the_hooks_tree_root_first(self, tmp_path):
        """bs requests of N = B + 1 ids: the tree the written hook.json drafts (the same hook the
        server loads) on humaneval-distinct, root first, each request's root its own; its tokens
        repeat, random ones would not."""
        from repro.ddtree import build_trees
        from repro.drafter_hook.hook import DrafterTestHook
        from repro.evidence.prompts import load_prompts, request_input

        model = fullsize.load_model("k26-tp8")
        fullsize.write_model(tmp_path, model)
        trees = verify_cost.tree_inputs(tmp_path / "k26-tp8", 4, [1, 65])
        assert trees[1] == [[ids[0]] for ids in trees[65]]  # N 1: the root alone
        inputs = trees[65]
        assert [len(ids) for ids in inputs] == [65] * 4
        vocab = model.target["vocab_size"]
        hook = DrafterTestHook.from_file(tmp_path / "k26-tp8" / "hook.json", horizon=7, vocab_size=vocab, device="cpu")
        prompts = [request_input(p, tokenizer="none", vocab_size=vocab, max_tokens=1024)["input_ids"]
                   for p in load_prompts("humaneval-distinct").prompts[:4]]
        roots = hook.successor[torch.tensor([ids[-1] for ids in prompts])]
        assert len(set(roots.tolist())) == 4
        tree = build_trees(hook.logits(roots, torch.tensor([len(ids) for ids in prompts])), 64, roots)
        assert inputs == tree.tokens.tolist()
        assert [ids[0] for ids in inputs] == roots.tolist()
        assert all(len(set(ids)) < 40 for ids in inputs)  # 22 distinct of 65 on average
