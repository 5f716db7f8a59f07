"""Tests for verify/bench/kernel_size.py: ahead-of-time sizes of the top-K kernels, no GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest

from verify.bench import kernel_size

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def test_loop_threshold_search_shrinks_the_select_kernel(capsys):
    """At the deployment shape the select kernel compiles for sm_90 without spills, and the
    threshold search as a loop (bisect_unroll=1) is a smaller program than fully unrolled."""
    assert kernel_size.main(["--set", "bisect_unroll=1"]) == 0
    loop = json.loads(capsys.readouterr().out)
    assert kernel_size.main([]) == 0
    unrolled = json.loads(capsys.readouterr().out)
    for sizes in (loop, unrolled):
        assert sizes["arch"] == "sm_90"
        for name in ("stream_kernel", "select_kernel"):
            assert sizes[name]["local"] == 0 and 0 < sizes[name]["reg"] <= 255
    assert loop["config"]["bisect_unroll"] == 1 and unrolled["config"]["bisect_unroll"] == 16
    assert loop["select_kernel"]["instructions"] < 0.7 * unrolled["select_kernel"]["instructions"]
    assert loop["stream_kernel"] == unrolled["stream_kernel"]


@pytest.mark.parametrize(("setting", "message"), [
    ("bisect_unroll", "--set takes NAME=INT"),
    ("speed=3", "--set NAME must be a TopKConfig field"),
    ("bisect_unroll=3", "TopKConfig.bisect_unroll must be 1, 2, 4, 8 or 16"),
])
def test_bad_settings_are_usage_errors(capsys, setting, message):
    """A malformed, unknown or invalid --set exits 2 with one line naming it."""
    with pytest.raises(SystemExit) as exc:
        kernel_size.main(["--set", setting])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
