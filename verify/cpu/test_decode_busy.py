"""CPU checks of verify/bench/decode_busy.py: the busy figures of a Chrome trace (the served
measurement itself runs on the GPU machine only)."""

from __future__ import annotations

import gzip
import json

import pytest

from verify.bench import decode_busy


def _trace(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def _kernel(ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": "k", "ts": ts, "dur": dur}


class TestTraceBusy:
    def test_busy_is_the_union_of_gpu_events_over_their_window(self, tmp_path):
        """Kernels and copies count (overlaps once); CPU events do not; the window spans the GPU events."""
        events = [_kernel(100, 50), _kernel(120, 50), _kernel(300, 100, "gpu_memcpy"),
                  {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1000}, {"ph": "i", "cat": "kernel", "ts": 5}]
        got = decode_busy.trace_busy(_trace(tmp_path / "t.json.gz", events))
        assert got == {"busy_ms": 0.17, "window_ms": 0.3, "busy_fraction": pytest.approx(0.17 / 0.3), "kernels": 3}

    def test_trace_without_gpu_events_is_an_error(self, tmp_path, capsys):
        """A trace of CPU activity only: --trace exits 2 with one line naming the file."""
        path = _trace(tmp_path / "cpu.json.gz", [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 10}])
        assert decode_busy.main(["--trace", str(path)]) == 2
        assert f"--trace needs a Chrome trace with GPU events ({path}" in capsys.readouterr().err

    def test_trace_cli_prints_the_figures(self, tmp_path, capsys):
        """--trace prints the figures as one JSON line, no GPU needed."""
        path = _trace(tmp_path / "t.json.gz", [_kernel(0, 80), _kernel(90, 10)])
        assert decode_busy.main(["--trace", str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["busy_fraction"] == pytest.approx(0.9)

    def test_unknown_profile_is_a_usage_error(self, capsys):
        """A profile name that profiles.toml lacks exits 2 before starting anything."""
        assert decode_busy.main(["no-such-profile"]) == 2
        assert "PROFILE must be one of" in capsys.readouterr().err


class TestRuns:
    @pytest.mark.parametrize(("label", "run"), [("AR", ("AR", None)), ("dflash", ("DFLASH", None)),
                                                 ("DDTREE", ("DDTREE", None)), ("DDTREE-B63", ("DDTREE", 63))])
    def test_labels_name_an_algorithm_and_budget(self, label, run):
        """A bare DDTREE takes the profile's budget (None); -B<n> sets it."""
        assert decode_busy.parse_run(label) == run

    @pytest.mark.parametrize("label", ["DFLASH-B16", "DDTREE-B", "DDTREE-Bx"])
    def test_a_bad_label_is_one_usage_line(self, label, tmp_path, capsys):
        """A budget on another algorithm, or none after -B: exit 2 before any server starts."""
        argv = ["full-h200-qwen3-8b", "--algorithm", "DFLASH", label, "--out", str(tmp_path)]
        assert decode_busy.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("decode_busy: --algorithm takes AR, DFLASH, DDTREE or DDTREE-B<budget>")
        assert err.count("\n") == 1

    def test_result_names_match_the_labels(self):
        """One file per (label, c), named as the busy experiments' and the committed docs/perf files are."""
        assert decode_busy.result_name("full-h200-qwen3-8b", "DDTREE B=63", 16) == "busy-qwen3-8b-DDTREE-B63-c16.json"
        assert decode_busy.result_name("test-h200-tp1", "AR", 1) == "busy-test-h200-tp1-AR-c1.json"

class TestFinishedTrace:
    def test_a_trace_still_being_written_is_waited_for(self, tmp_path, monkeypatch):
        """SGLang's trace file appears before it is whole: a truncated gzip is passed over until
        the profiler finishes it (the server must stay up till then)."""
        whole = gzip.compress(json.dumps({"traceEvents": [_kernel(0, 40), _kernel(50, 50)]}).encode())
        path = tmp_path / "1-TP-0.trace.json.gz"
        path.write_bytes(whole[: len(whole) // 2])
        sleeps = []

        def finish(_s):
            sleeps.append(_s)
            path.write_bytes(whole)

        monkeypatch.setattr(decode_busy.time, "sleep", finish)
        trace, figures = decode_busy._finished_trace(tmp_path, decode_busy.time.monotonic() + 60)
        assert (trace, figures["busy_fraction"], len(sleeps)) == (path, pytest.approx(0.9), 1)

    def test_an_earlier_runs_trace_is_not_taken(self, tmp_path, monkeypatch):
        """A whole trace left by an earlier run is passed over for the one this run writes."""
        old = _trace(tmp_path / "1-TP-0.trace.json.gz", [_kernel(0, 10), _kernel(90, 10)])
        new = tmp_path / "2-TP-0.trace.json.gz"
        monkeypatch.setattr(decode_busy.time, "sleep", lambda _s: _trace(new, [_kernel(0, 50), _kernel(50, 50)]))
        trace, figures = decode_busy._finished_trace(tmp_path, decode_busy.time.monotonic() + 60, {old})
        assert (trace, figures["busy_fraction"]) == (new, 1.0)

    def test_no_whole_trace_before_the_deadline_is_an_error(self, tmp_path):
        """Nothing readable by the deadline: one error naming the directory."""
        (tmp_path / "x.json.gz").write_bytes(b"\x1f\x8b\x08")
        with pytest.raises(RuntimeError, match=f"no whole trace in {tmp_path}"):
            decode_busy._finished_trace(tmp_path, decode_busy.time.monotonic() - 1)


class TestTraceFunctions:
    def test_inclusive_time_per_function_per_step_most_expensive_first(self, tmp_path):
        """python_function events add up per name (over the steps, in ms); other events do not count."""
        events = [{"ph": "X", "cat": "python_function", "name": "a.py(1): round", "ts": 0, "dur": 3000},
                  {"ph": "X", "cat": "python_function", "name": "b.py(9): prepare", "ts": 10, "dur": 1000},
                  {"ph": "X", "cat": "python_function", "name": "a.py(1): round", "ts": 5000, "dur": 3000},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 20, "dur": 9000}]
        got = decode_busy.trace_functions(_trace(tmp_path / "t.json.gz", events), steps=2)
        assert list(got.items()) == [("a.py(1): round", 3.0), ("b.py(9): prepare", 0.5)]


class TestKernelsByName:
    def test_each_kernel_per_step_largest_first(self):
        """Launches and GPU µs per step by kernel name, copies by their category, CPU events left out."""
        events = [{**_kernel(0, 30), "name": "gemm"}, {**_kernel(40, 30), "name": "gemm"},
                  {**_kernel(80, 100), "name": "attn"}, _kernel(200, 8, "gpu_memcpy"),
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500}]
        got = decode_busy.kernels_by_name(events, steps=2)
        assert list(got.items()) == [("attn", [0.5, 50.0]), ("gemm", [1.0, 30.0]), ("gpu_memcpy", [0.5, 4.0])]


BUSY_RESULT = {"algorithm": "A", "steps": 2, "busy_ms": 2.0, "kernels": 20, "kernels_by_name": {
    "_fwd_kernel": [41.0, 400.0], "nvjet_sm90_tst_192x64_64x6_2x1_v_bz_TNT": [36.0, 300.0],
    "void cublasLt::splitKreduce_kernel<32, 16>": [5.0, 20.0], "gather_kernel": [1.0, 70.0],
    "gpu_memcpy": [3.0, 9.0], "void flashinfer::norm::RMSNormKernel<8u>": [3.0, 100.0]}}
"""A decode_busy result of 2 steps: 899 of its 1000 µs a step among the listed kernels."""


class TestKernelClasses:
    def test_the_projects_kernels_are_read_off_its_sources(self):
        """Every @triton.jit ``*_kernel`` of repro (the drafter hook's rows_kernel too), none of its helpers."""
        names = decode_busy.repro_kernel_names()
        assert {"stream_kernel", "select_kernel", "threshold_kernel", "gather_kernel", "enum_kernel",
                "accept_kernel", "rows_kernel", "tree_inputs_kernel"} <= names
        assert "top_candidates" not in names and "_scan_top_keys" not in names

    def test_each_listed_kernel_counts_once_in_its_class(self):
        """Attention, GEMMs (split-K reductions too), repro, copies, the rest (FlashInfer's norm is not
        attention); unlisted is the busy time past the listed kernels; all is busy time and launches."""
        got = decode_busy.kernel_classes(BUSY_RESULT, decode_busy.repro_kernel_names())
        assert got["attention"] == [41.0, 400.0] and got["GEMMs"] == [41.0, 320.0]
        assert got["repro"] == [1.0, 70.0] and got["copies"] == [3.0, 9.0] and got["rest"] == [3.0, 100.0]
        assert got["unlisted"][1] == 1000.0 - 899.0 and got["all"] == [10.0, 1000.0]

    def test_compare_prints_both_and_the_difference(self, tmp_path, capsys):
        """--compare: a markdown row per class, B - A last; a missing file is one line and exit 2."""
        a, b = tmp_path / "a.json", tmp_path / "b.json"
        a.write_text(json.dumps(BUSY_RESULT))
        slower = {**BUSY_RESULT, "algorithm": "B", "kernels_by_name": {**BUSY_RESULT["kernels_by_name"],
                                                                          "_fwd_kernel": [41.0, 450.0]}}
        b.write_text(json.dumps(slower))
        assert decode_busy.main(["--compare", str(a), str(b)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("| kernels | A | B | difference |")
        assert "| attention | 400 (41) | 450 (41) | +50 |" in out
        assert decode_busy.main(["--compare", str(a), str(tmp_path / "none.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("decode_busy: --compare needs") and err.count("\n") == 1


class TestStartDecoding:
    def test_clients_send_again_until_stopped(self):
        """Each client sends its next request as soon as one ends (a speculative decode finishes a
        request in a second or two, before the profiled steps would end), and stops when told."""
        sent = []

        def send(client):
            sent.append(client)
            decode_busy.time.sleep(0.005)

        stop = decode_busy.threading.Event()
        clients = decode_busy.start_decoding(send, 2, stop)
        while len(sent) < 10:
            decode_busy.time.sleep(0.005)
        stop.set()
        for c in clients:
            c.join(5)
        assert not any(c.is_alive() for c in clients)
        assert len(sent) >= 10 and set(sent) == {0, 1} and all(not c.failed for c in clients)

    def test_each_client_ends_its_prompt_on_a_token_of_its_own(self):
        """Clients share the prompt but not its last token (a planted target follows the last token
        alone), every id inside the 4-layer targets' vocabulary of 4096."""
        payloads = [decode_busy.busy_payload(k, 64) for k in range(16)]
        ends = [p["input_ids"][-1] for p in payloads]
        assert len(set(ends)) == 16 and all(p["input_ids"][:-1] == payloads[0]["input_ids"][:-1] for p in payloads)
        assert max(max(p["input_ids"]) for p in payloads) < 4096 and len(payloads[0]["input_ids"]) == 256

    def test_a_client_whose_request_fails_stops_with_the_error(self):
        """A failed request (the server stopped, or failed) ends that client; the error is kept."""
        def send(client):
            msg = "connection refused"
            raise decode_busy.ReproError(msg)

        clients = decode_busy.start_decoding(send, 1, decode_busy.threading.Event())
        clients[0].join(5)
        assert (clients[0].is_alive(), clients[0].failed) == (False, "connection refused")
