"""Tests for verify/bench/bench_serving_check.py (no GPU, no SGLang): the prompts as bench_serving's
dataset, its command line, its summary read from a fixture of SGLang 0.5.17's output fields, and the
comparison's verdicts."""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from repro import cli
from repro.errors import UsageError
from repro.evidence.prompts import DISTINCT, load_prompts, request_input
from repro.evidence.results import Cell, summarize
from repro.testmodels.configs import read_model
from repro.testmodels.tokenizer import vocabulary, write_tokenizer
from verify.bench import bench_serving_check as check
from verify.benchrun import bench_args, fake_server, workspace

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bench_serving" / "result-0.5.17.jsonl"
CELL = Cell("full-h200-qwen3-8b", "DDTREE", None, 4, 0.0, DISTINCT, 16, schedule="1:63,4:31,16:15", request_rate=6.0)


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The planted Qwen3-8B's tokenizer, as `repro testmodels` writes it."""
    target = read_model("qwen3-8b")["target"]
    out = tmp_path_factory.mktemp("qwen3-8b")
    (out / "config.json").write_text(json.dumps({k: target[k] for k in ("vocab_size", "bos_token_id", "eos_token_id")}))
    write_tokenizer(out)
    return out


def _requests(tpot_s: float, tokens: int = 16) -> list[dict]:
    """Two completed requests of the cell, 1 s apart, each with a 50 ms TTFT, and one failed."""
    def one(i: int, start: float) -> dict:
        latency = 0.05 + tpot_s * (tokens - 1)
        return {"kind": "request", "session": "s", "cell": asdict(CELL),
                "index": i, "start": start, "end": start + latency, "completion_tokens": tokens, "ttft_s": 0.05,
                "latency_s": latency, "chunks": [[tpot_s, 1]] * (tokens - 1), "tau": 3.0}
    failed = {**one(2, 0.5), "error": "POST /generate returned HTTP 503"}
    for key in ("completion_tokens", "ttft_s", "latency_s", "chunks", "tau"):
        failed.pop(key)
    return [one(0, 0.0), one(1, 1.0), failed]


class TestPrompts:
    def test_distinct_prompts_round_trip_through_the_planted_tokenizer(self, qwen_tokenizer: Path) -> None:
        """humaneval-distinct's byte ids for the planted Qwen3-8B decode to text that encodes back to them."""
        vocab = read_model("qwen3-8b")["target"]["vocab_size"]
        inputs = [request_input(p, tokenizer="none", vocab_size=vocab, max_tokens=1024)
                  for p in load_prompts(DISTINCT).prompts[:24]]
        texts = check.texts(inputs, qwen_tokenizer)
        assert len(set(texts)) == 24 and all(t.startswith(" ") for t in texts)

    def test_ids_that_do_not_round_trip_are_refused(self, qwen_tokenizer: Path) -> None:
        """A lone byte-fallback id of no UTF-8 character cannot be sent as text: refused, naming the prompt."""
        target = read_model("qwen3-8b")["target"]
        tokens, _ = vocabulary(target["vocab_size"], target["bos_token_id"], target["eos_token_id"])
        with pytest.raises(ValueError, match=r"prompt 1: its token ids do not survive"):
            check.texts([{"input_ids": [300, 301]}, {"input_ids": [300, tokens.index("<0xFF>")]}], qwen_tokenizer)

    def test_the_seeded_shuffle_restores_repros_order(self) -> None:
        """bench_serving seeds Python's random with --seed and shuffles the dataset: the rows come out
        in the order repro sent the prompts."""
        prompts = [f"prompt {i}" for i in range(64)]
        rows = check.sharegpt_rows(prompts, 7)
        assert [r["conversations"][0]["value"] for r in rows] != prompts
        random.seed(7)
        random.shuffle(rows)
        assert [r["conversations"][0]["value"] for r in rows] == prompts
        assert all(len(r["conversations"]) == 2 for r in rows)  # its filter keeps conversations of two turns


class TestCommand:
    def test_the_command_line_of_an_open_loop_cell(self, tmp_path: Path) -> None:
        """The cell's rate, cap, output length and temperature, the request count, seed, tokenizer and
        files, bench_serving's flush and details switches; the OpenAI backend gets its temperature in the body."""
        argv = check.command(CELL, 64, backend="sglang", url="http://127.0.0.1:30000", dataset=tmp_path / "d.json",
                             seed=1, tokenizer=tmp_path / "m", output=tmp_path / "o.jsonl", python="python3")
        assert argv == ["python3", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url",
                        "http://127.0.0.1:30000", "--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "d.json"),
                        "--num-prompts", "64", "--sharegpt-output-len", "16", "--request-rate", "6",
                        "--max-concurrency", "4", "--seed", "1", "--tokenizer", str(tmp_path / "m"),
                        "--temperature", "0", "--flush-cache", "--output-file", str(tmp_path / "o.jsonl"),
                        "--output-details", "--disable-tqdm"]
        oai = check.command(replace(CELL, temperature=1.0), 64, backend="sglang-oai", url="u", dataset=tmp_path,
                            seed=1, tokenizer=tmp_path, output=tmp_path)
        assert oai[-2:] == ["--extra-request-body", '{"temperature": 1.0}']


class TestSummary:
    def test_the_fixture_reads_with_its_failures(self) -> None:
        """bench_serving's last JSONL line: its figures by their 0.5.17 names, one failure in its errors."""
        summary = check.read_summary(FIXTURE)
        assert summary["completed"] == 2 and check.failed(summary, 3) == 1
        assert check.failed({k: v for k, v in summary.items() if k != "errors"}, 3) == 1

    def test_a_file_without_a_summary_is_refused(self, tmp_path: Path) -> None:
        """A missing file, or a line without the figures, names the file."""
        (tmp_path / "o.jsonl").write_text('{"completed": 1}\n')
        for path in (tmp_path / "none.jsonl", tmp_path / "o.jsonl"):
            with pytest.raises(ValueError, match=rf"{path.name}: no bench_serving summary with"):
                check.read_summary(path)


class TestVerdicts:
    @staticmethod
    def _rows(tpot_s: float, **theirs: float) -> dict[str, dict]:
        (s,) = summarize(_requests(tpot_s))
        summary = {**check.read_summary(FIXTURE), **theirs}
        return {r["figure"]: r for r in check.rows("sglang", s, summary, 3)}

    def test_matching_throughput_and_tpot_pass(self) -> None:
        """Output throughput and median TPOT within 10% of bench_serving's: both verdicts yes; the other
        figures are compared without a verdict, failures side by side."""
        (s,) = summarize(_requests(0.02))
        rows = self._rows(0.02, output_throughput=s.output_tok_s * 1.05, median_tpot_ms=20.0 / 0.95)
        assert rows["output tok/s"]["within"] is True and rows["TPOT median ms"]["within"] is True
        assert rows["TPOT median ms"]["ratio"] == pytest.approx(0.95)
        assert rows["TTFT median ms"]["ratio"] == pytest.approx(1.0) and rows["TTFT median ms"]["within"] is None
        assert (rows["failed"]["repro"], rows["failed"]["bench_serving"]) == (1, 1)
        assert rows["accept length"]["ratio"] == pytest.approx(3.0 / 3.1)

    def test_a_slower_tpot_fails(self) -> None:
        """Median TPOT 20% over bench_serving's: its verdict is no, whatever the throughput says."""
        (s,) = summarize(_requests(0.024))
        rows = self._rows(0.024, output_throughput=s.output_tok_s, median_tpot_ms=20.0)
        assert rows["output tok/s"]["within"] is True and rows["TPOT median ms"]["within"] is False
        assert "NO" in check.table(list(rows.values()))

    def test_a_missing_figure_has_no_ratio(self) -> None:
        """Accept length bench_serving could not read (None) gets no ratio rather than a made-up one."""
        rows = self._rows(0.02, accept_length=None)
        assert rows["accept length"]["ratio"] is None and rows["accept length"]["repro"] == 3.0


STUB = '''"""A stand-in for sglang.bench_serving: it loads the sharegpt dataset as 0.5.17 does (random.seed, then
shuffle), encodes each prompt with --tokenizer and appends the fixture's summary with those input_lens."""
import argparse, json, os, random, sys
from pathlib import Path
from tokenizers import Tokenizer
p = argparse.ArgumentParser()
for flag in ("--dataset-path", "--seed", "--tokenizer", "--output-file", "--request-rate", "--max-concurrency",
             "--num-prompts"):
    p.add_argument(flag)
args = p.parse_known_args()[0]
if float(os.environ.get("STUB_FAIL_AT_RATE", "nan")) == float(args.request_rate):
    sys.exit(3)
random.seed(int(args.seed))
rows = json.loads(Path(args.dataset_path).read_text())
random.shuffle(rows)
tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
summary = json.loads(Path(sys.argv[0]).with_name("result.jsonl").read_text())
summary.update(input_lens=[len(tok.encode(r["conversations"][0]["value"], add_special_tokens=False).ids) for r in rows],
               request_rate=float(args.request_rate), max_concurrency=int(args.max_concurrency),
               errors=[""] * int(args.num_prompts))
with open(args.output_file, "a") as f:
    f.write(json.dumps(summary) + "\\n")
'''


def _check_against_the_fake_server(tmp_path: Path, monkeypatch) -> tuple[int | str | None, Path]:
    """repro bench at 100 and 300 req/s against the fake server, then the check with the stand-in
    bench_serving: (its exit code, or the message it exits with; the work folder)."""
    work = workspace(tmp_path / "w", monkeypatch)
    stub = tmp_path / "stub" / "sglang"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "bench_serving.py").write_text(STUB)
    (stub / "result.jsonl").write_text(FIXTURE.read_text())
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "config.json").write_text(json.dumps({"vocab_size": 4096, "bos_token_id": 1, "eos_token_id": 2}))
    write_tokenizer(tokenizer)
    proc, url = fake_server(work, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8")
    try:
        assert cli.main(bench_args("fake", "--url", url, "--prompts", DISTINCT, "--request-rate", "100,300",
                                   "--num-prompts", "3", "--flush-cache", "--seed", "5")) == 0
        monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'stub'}:{os.environ['PYTHONPATH']}")
        try:
            code = check.main([str(work / "out.jsonl"), "--url", url, "--profile", "fake", "--profile-file",
                               "profiles.toml", "--models-dir", "models", "--tokenizer", str(tokenizer), "--seed",
                               "5", "--out", str(work / "check")])
        except SystemExit as stop:
            code = stop.code
    finally:
        proc.kill()
        proc.wait()
    return code, work


class TestMain:
    def test_bench_serving_runs_at_each_cells_load(self, tmp_path: Path, monkeypatch, capsys) -> None:
        """Against the fake server: repro bench's open-loop cells, then one bench_serving run per rate
        (a stand-in that shuffles as 0.5.17 does) given the cell's prompts as text, which it receives
        in repro's order; the JSON holds a row per figure and the runs' command lines."""
        code, work = _check_against_the_fake_server(tmp_path, monkeypatch)
        result = json.loads((work / "check" / "bench_serving_check.json").read_text())
        assert code == (0 if result["passed"] else 1)
        assert [(r["rate"], r["in_repro_order"]) for r in result["runs"]] == [(100.0, True), (300.0, True)]
        assert {r["figure"] for r in result["rows"]} == {*check.FIGURES, "failed"}
        assert "--request-rate" in result["runs"][1]["argv"] and "300" in result["runs"][1]["argv"]
        assert result["complete"] and "verdict: output tok/s and TPOT median ms within 10%" in capsys.readouterr().out

    def test_a_run_cut_short_keeps_the_rates_it_finished(self, tmp_path: Path, monkeypatch) -> None:
        """bench_serving fails at the second rate: the check says so and its JSON keeps the first rate's rows,
        marked incomplete, for bench_serving_pool."""
        monkeypatch.setenv("STUB_FAIL_AT_RATE", "300")
        code, work = _check_against_the_fake_server(tmp_path, monkeypatch)
        assert code == f"bench_serving_check: bench_serving exited 3; see {work / 'check' / 'bench_serving-sglang-300.log'}"
        result = json.loads((work / "check" / "bench_serving_check.json").read_text())
        assert not result["complete"] and {r["rate"] for r in result["rows"]} == {100.0}
        assert [r["rate"] for r in result["runs"]] == [100.0]

    def test_another_seed_is_refused(self, tmp_path: Path, monkeypatch) -> None:
        """A --seed other than the one repro bench drew its arrivals with cannot give the same load."""
        work = workspace(tmp_path / "w", monkeypatch)
        proc, url = fake_server(work)
        try:
            assert cli.main(bench_args("fake", "--url", url, "--prompts", DISTINCT, "--request-rate", "100",
                                       "--num-prompts", "3")) == 0
        finally:
            proc.kill()
            proc.wait()
        with pytest.raises(UsageError, match=r"arrivals another --seed drew"):
            check.main([str(work / "out.jsonl"), "--url", url, "--profile", "fake", "--profile-file", "profiles.toml",
                        "--models-dir", "models", "--tokenizer", str(tmp_path), "--seed", "2", "--out", str(tmp_path)])
