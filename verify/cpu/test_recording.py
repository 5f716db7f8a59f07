"""Tests for `repro.recording`: the Recorder's file format, its environment switch and the staging ring.

The ring's ordering (a batch is read only once its event completed, oldest first, the rest at
close) is tested here with a stand-in event on CPU tensors; verify/gpu/test_recording_gpu.py runs
the real pinned copies and CUDA events under sync-debug mode.
"""

from __future__ import annotations

import json
import os
from typing import ClassVar

import pytest
import torch

from repro.ddtree import build_trees, topk_logprobs, walk
from repro.recording import PROMPTS_ENV, RECORD_ENV, SCHEMA, Recorder, StagingRing, digest, prompts_of
from repro.tuning.acceptance import read_recordings


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _recorder(path, **kw) -> Recorder:
    return Recorder(path, budget=kw.pop("budget", 6), horizon=kw.pop("horizon", 3), stack={"gpu": "none"},
                    config={"model": "m"}, **kw)


class TestRecorder:
    def test_header_then_a_line_per_request(self, tmp_path):
        """The header carries schema, budget, horizon, algorithm and digest; each request of a
        round is one line with its path (root excluded), chain fields and prompt set."""
        path = tmp_path / "r.jsonl"
        with _recorder(path, prompts="fallback", source="test") as rec:
            rec.record(["humaneval/3", "x"], torch.tensor([[0, 2, 5, -1], [0, -1, -1, -1]]), torch.tensor([3, 1]),
                       None)
        header, first, second = _lines(path)
        assert header["kind"] == "recording" and header["schema"] == SCHEMA
        assert (header["budget"], header["horizon"], header["algorithm"]) == (6, 3, "DDTREE")
        assert header["digest"] == digest({"gpu": "none"}, {"model": "m"})
        assert first == {"kind": "round", "rec": header["rec"], "step": 0, "req": "humaneval/3", "prompts": "humaneval",
                         "bs": 2, "path": [2, 5]}
        assert (second["path"], second["prompts"]) == ([], "fallback")

    def test_record_round_writes_the_chain_fields(self, tmp_path):
        """record_round adds rank0 per path node and the chain depth in the tree (spec §6, B = 6)."""
        q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])
        tree = build_trees(q.log()[None], 6, torch.tensor([0]))
        result = walk(tree, torch.tensor([[1, 3, 9, 9, 9, 1, 4]]))
        path = tmp_path / "r.jsonl"
        with _recorder(path) as rec:
            rec.record_round(["a"], tree, topk_logprobs(q.log()[None], 1).ids[..., 0], result)
        line = _lines(path)[1]
        assert (line["path"], line["rank0"], line["chain"]) == ([1, 5, 6], [1, 0, 1], 3)
        (recording,) = read_recordings(path)
        assert recording.rounds[0].path == (1, 5, 6)

    def test_steps_count_rounds_and_files_append(self, tmp_path):
        """Two recordings append to one file; steps count each recorder's rounds from 0."""
        path = tmp_path / "r.jsonl"
        for _ in range(2):
            with _recorder(path) as rec:
                for _ in range(3):
                    rec.record(["a"], torch.tensor([[0, 1, -1, -1]]), torch.tensor([2]))
        recordings = read_recordings(path)
        assert [[r.step for r in x.rounds] for x in recordings] == [[0, 1, 2], [0, 1, 2]]
        assert recordings[0].rec != recordings[1].rec

    @pytest.mark.parametrize(("index", "length", "message"), [
        (torch.zeros(2, 4, dtype=torch.int64), torch.ones(1, dtype=torch.int64),
         r"accept_index must have shape \(1, 4\) for 1 request ids \(got \(2, 4\)\)"),
        (torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, dtype=torch.int64),
         r"accept_index must have shape \(1, 4\) for 1 request ids \(got \(1, 3\)\)"),
        (torch.zeros(1, 4, dtype=torch.int64), torch.ones(2, dtype=torch.int64),
         r"accept_len must have shape \(1,\) for 1 request ids \(got \(2,\)\)"),
    ])
    def test_shapes_are_checked(self, tmp_path, index, length, message):
        """Tensors that do not match the request ids or the horizon are one ValueError."""
        with _recorder(tmp_path / "r.jsonl") as rec, pytest.raises(ValueError, match=message):
            rec.record(["a"], index, length)

    def test_rounds_past_a_finished_request_are_left_out(self, tmp_path):
        """An engine that launches round k + 1 before reading round k's result runs a finished
        request once more: with ``finished_tokens`` that round is not written, the others are."""

        class Req:
            def __init__(self) -> None:
                self.kept: int | None = None  # tokens the engine kept once finished

        a, b = Req(), Req()
        path = tmp_path / "r.jsonl"
        with _recorder(path, finished_tokens=lambda req: req.kept) as rec:
            def step(taus: list[int], reqs: list[Req]) -> None:
                index = torch.full((len(taus), 4), -1)
                for row, tau in enumerate(taus):
                    index[row, :tau] = torch.arange(tau)
                rec.record(["a", "b"][: len(taus)], index, torch.tensor(taus), handles=reqs)

            step([3, 2], [a, b])  # a: 1 (prefill) + 3, b: 1 + 2
            a.kept = 6  # a's next round emits 3, of which the engine keeps 2: a finished
            step([3, 1], [a, b])
            step([2, 4], [a, b])  # a's over-run round: left out; b still runs
            b.kept = 8
            step([1, 1], [a, b])  # b had emitted 1 + 2 + 1 + 4 = 8 before it: left out, as is a's
        rounds = [(line["req"], line["step"]) for line in _lines(path)[1:]]
        assert rounds == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2)]

    def test_close_is_idempotent(self, tmp_path):
        """Closing twice is harmless (atexit closes again)."""
        rec = _recorder(tmp_path / "r.jsonl")
        rec.close()
        rec.close()


class TestFromEnv:
    def test_off_by_default(self, monkeypatch):
        """Without the variable there is no recorder."""
        monkeypatch.delenv(RECORD_ENV, raising=False)
        assert Recorder.from_env(budget=4, horizon=3) is None

    def test_only_rank_zero_records(self, monkeypatch, tmp_path):
        """Other tensor-parallel ranks never record."""
        monkeypatch.setenv(RECORD_ENV, str(tmp_path / "r.jsonl"))
        assert Recorder.from_env(budget=4, horizon=3, rank=1) is None
        assert not (tmp_path / "r.jsonl").exists()

    def test_path_pid_and_prompts(self, monkeypatch, tmp_path):
        """{pid} in the path is the process id; the prompts variable names the default prompt set."""
        monkeypatch.setenv(RECORD_ENV, str(tmp_path / "r-{pid}.jsonl"))
        monkeypatch.setenv(PROMPTS_ENV, "gsm8k")
        rec = Recorder.from_env(budget=4, horizon=3, config={"tp": 1})
        rec.close()
        header = _lines(rec.path)[0]
        assert rec.path.name == f"r-{os.getpid()}.jsonl"
        assert (header["prompts"], header["source"], header["config"]) == ("gsm8k", "sglang", {"tp": 1})
        assert header["stack"]["python"]  # the stack fingerprint of this machine


def test_prompts_of():
    """The prompt set is the request id's part before '/', else the default."""
    assert prompts_of("mbpp/12/ab", "-") == "mbpp"
    assert prompts_of("0a1b2c", "-") == "-"
    assert prompts_of("/x", "d") == "d"


class FakeEvent:
    """A CUDA event stand-in whose completion the test decides."""

    done: ClassVar[set[int]] = set()
    count = 0

    def __init__(self) -> None:
        self.id = FakeEvent.count
        FakeEvent.count += 1
        self.synced = False

    def record(self) -> None:
        """Nothing to mark on a CPU."""

    def query(self) -> bool:
        """Whether the test marked this event done."""
        return self.id in FakeEvent.done

    def synchronize(self) -> None:
        """Wait: mark it done."""
        self.synced = True
        FakeEvent.done.add(self.id)


class TestStagingRing:
    @pytest.fixture(autouse=True)
    def _events(self):
        FakeEvent.done, FakeEvent.count = set(), 0

    def test_reads_only_completed_batches_in_order(self):
        """A batch comes back only when its event completed and every older one did."""
        ring = StagingRing(event_factory=FakeEvent, pin=False)
        for i in range(3):
            ring.push(torch.full((2, 3), i), f"b{i}")
        assert list(ring.ready()) == []
        FakeEvent.done.add(1)
        assert list(ring.ready()) == []  # batch 0 is older and not done
        FakeEvent.done.add(0)
        assert [m for _, m in ring.ready()] == ["b0", "b1"]
        rows, meta = next(ring.drain())
        assert (rows, meta) == ([[2, 2, 2], [2, 2, 2]], "b2")

    def test_buffers_are_reused(self):
        """A read buffer serves the next batch that fits; copies are of the batch, not the buffer."""
        ring = StagingRing(event_factory=FakeEvent, pin=False)
        ring.push(torch.full((4, 2), 7), "a")
        list(ring.drain())
        ring.push(torch.full((1, 2), 8), "b")
        ((rows, _),) = list(ring.drain())
        assert rows == [[8, 8]] and len(ring._free) == 1

    def test_waits_for_the_oldest_only_when_full(self):
        """At max_pending batches in flight, push waits for the oldest (and only then)."""
        ring = StagingRing(event_factory=FakeEvent, pin=False, max_pending=2)
        ring.push(torch.zeros(1, 1), "a")
        ring.push(torch.zeros(1, 1), "b")
        oldest = ring._pending[0][2]
        assert not oldest.synced
        ring.push(torch.zeros(1, 1), "c")
        assert oldest.synced and not ring._pending[1][2].synced
        assert [m for _, m in ring.ready()] == ["a"]
