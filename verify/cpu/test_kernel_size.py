"""Tests for verify/bench/kernel_size.py: ahead-of-time sizes of the top-K and tree kernels, no GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest

from verify.bench import kernel_size

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def test_threshold_search_counts_every_pivot_in_one_histogram(capsys):
    """At the deployment shape the select kernel compiles for sm_90 without spills whether the
    threshold search counts 1 or 32 pivots a round (search_pivots), and 32 pivots cost under 10 %
    more machine code: each round is a histogram of the keys over the pivots' bins, not a
    comparison of every key with every pivot. The stream kernel is untouched."""
    sizes = {}
    for pivots in (1, 32):
        assert kernel_size.main(["--set", f"search_pivots={pivots}", "--set", "split_rows=0"]) == 0
        sizes[pivots] = json.loads(capsys.readouterr().out)
    for run in sizes.values():
        assert run["arch"] == "sm_90"
        for name in ("stream_kernel", "select_kernel"):
            assert run[name]["local"] == 0 and run[name]["stack"] == 0 and 0 < run[name]["reg"] <= 255
    assert sizes[32]["config"]["search_pivots"] == 32 and sizes[1]["config"]["search_pivots"] == 1
    assert sizes[1]["select_kernel"]["instructions"] < sizes[32]["select_kernel"]["instructions"]
    assert sizes[32]["select_kernel"]["instructions"] < 1.1 * sizes[1]["select_kernel"]["instructions"]
    assert sizes[32]["stream_kernel"] == sizes[1]["stream_kernel"]


def test_register_cap_reaches_the_select_compile(capsys):
    """select_maxnreg=64 compiles the select kernel within 64 registers per thread (0 leaves the
    compiler free to use more); the stream kernel is untouched."""
    assert kernel_size.main(["--set", "select_maxnreg=64", "--set", "split_rows=0"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert kernel_size.main(["--set", "select_maxnreg=0", "--set", "split_rows=0"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert capped["select_kernel"]["reg"] <= 64 < free["select_kernel"]["reg"]
    assert capped["stream_kernel"] == free["stream_kernel"]


def test_scan_tail_shrinks_the_select_kernel(capsys):
    """At the deployment shape (M 5120 group keys) a 4096 + 1024 key tile instead of 8192 gives
    a select kernel (the default) without spills and of under 0.7 the instructions; the stream kernel
    is untouched."""
    assert kernel_size.main(["--set", "scan_tail=0", "--set", "split_rows=0"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert kernel_size.main(["--set", "split_rows=0"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert split["select_kernel"]["stack"] == 0
    assert split["select_kernel"]["instructions"] < 0.7 * one["select_kernel"]["instructions"]
    assert split["stream_kernel"] == one["stream_kernel"]


def test_sass_digest_names_the_machine_code(capsys):
    """The same config compiles to the same SASS digest and a different stream pipeline depth to
    another; the select kernel, which that setting does not reach, keeps its digest; the stream
    kernel has one loop, shorter than the kernel."""
    runs = []
    for stages in (4, 4, 1):
        assert kernel_size.main(["--set", f"stream_stages={stages}", "--set", "split_rows=0"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    digests = [[run[name]["sass_sha256"] for name in ("stream_kernel", "select_kernel")] for run in runs]
    assert digests[0] == digests[1]
    assert digests[2][0] != digests[0][0] and digests[2][1] == digests[0][1]
    stream = runs[0]["stream_kernel"]
    assert len(stream["loops"]) == 1 and 0 < stream["loops"][0] < stream["instructions"]


@pytest.mark.parametrize(("setting", "message"), [
    ("search_pivots", "--set takes NAME=INT"),
    ("speed=3", "--set NAME must be a TopKConfig field"),
    ("search_pivots=3", "TopKConfig.search_pivots must be a power of two (got 3)"),
])
def test_bad_settings_are_usage_errors(capsys, setting, message):
    """A malformed, unknown or invalid --set exits 2 with one line naming it."""
    with pytest.raises(SystemExit) as exc:
        kernel_size.main(["--set", setting])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_tree_kernel_work_per_thread_falls_with_more_warps(capsys):
    """The B = 64 tree kernel compiles for sm_90 without local memory, and 16 warps give each
    thread a shorter program than 8 (half the entries per thread in every sort)."""
    sizes = {}
    for warps in (8, 16):
        assert kernel_size.main(["--tree", "--budget", "64", "--warps", str(warps)]) == 0
        sizes[warps] = json.loads(capsys.readouterr().out)["tree_kernel"]
        assert sizes[warps]["local"] == 0 and 0 < sizes[warps]["reg"] <= 255
    assert sizes[16]["instructions"] < sizes[8]["instructions"]


def test_verify_kernel_fills_with_16_byte_stores(capsys):
    """At B = 256 the verify kernel compiles for sm_90 without spills, and its mask fills are
    vectorised to 16-byte global stores."""
    assert kernel_size.main(["--tree", "--budget", "256"]) == 0
    sizes = json.loads(capsys.readouterr().out)["verify_kernel"]
    assert sizes["stack"] == 0 and sizes["local"] == 0 and 0 < sizes["reg"] <= 255
    assert sizes["wide_stores"] >= 4  # prefix, tree columns, ancestor rows, True tail


def test_tree_budget_out_of_range_is_a_usage_error(capsys):
    """--tree --budget 0 exits 2 naming the range."""
    with pytest.raises(SystemExit) as exc:
        kernel_size.main(["--tree", "--budget", "0"])
    assert exc.value.code == 2
    assert "--budget must be in [1, 256] (got 0)" in capsys.readouterr().err
