"""Tests for `repro cubins` on synthetic sglang-kernel wheels and installs (no CUDA tools needed)."""

from __future__ import annotations

import json

from repro import cli
from verify.fake_stack import cuda_library, dist, ptx, sass, serve_set, wheel


def kernel_wheel(tmp_path, sm100_entries) -> str:
    """A sglang-kernel-like wheel whose sm100/common_ops holds ``sm100_entries``."""
    lib = tmp_path / "libs"
    files = {
        "sgl_kernel/sm90/common_ops.abi3.so": cuda_library(lib / "a.so", [sass(90, "a")]).read_bytes(),
        "sgl_kernel/sm100/common_ops.abi3.so": cuda_library(lib / "b.so", sm100_entries).read_bytes(),
        "sgl_kernel/spatial_ops.abi3.so": cuda_library(
            lib / "c.so", [sass(90, "a"), sass(100, "f"), sass(120, "a")]).read_bytes(),
    }
    return str(wheel(tmp_path / "wheels", "sglang-kernel", "0.4.5", files))


def test_every_target_covered(tmp_path, capsys):
    """A wheel with code for every target's capabilities passes and lists each library's archs."""
    s = serve_set(tmp_path)
    assert cli.main(["cubins", str(s.wheels["fakekernel"])]) == 0
    out = capsys.readouterr().out
    assert "sgl_kernel/sm100/common_ops.abi3.so" in out and "sm_100a sm_103a sm_120a" in out
    assert "RED LINE" not in out and out.count("\n  ok ") == 8


def test_missing_arch_is_a_red_line(tmp_path, capsys):
    """sm100/common_ops without SASS for 12.0 is a red line for sm120, exit 1."""
    assert cli.main(["cubins", kernel_wheel(tmp_path, [sass(100, "a"), sass(103, "a")])]) == 1
    out = capsys.readouterr().out
    assert "RED LINE: sm120 GPUs of capability 12.0 cannot run sgl_kernel/sm100/common_ops.abi3.so" in out
    assert "sm100 GPUs" not in out


def test_family_cubin_covers_b200_and_b300(tmp_path, capsys):
    """One sm_100f cubin covers capabilities 10.0 and 10.3."""
    assert cli.main(["cubins", "--target", "sm100", kernel_wheel(tmp_path, [sass(100, "f")])]) == 0
    assert capsys.readouterr().out.count("sm_100f") >= 4


def test_ptx_only_is_a_warning_not_a_red_line(tmp_path, capsys):
    """A capability reached only through PTX is reported as jit and does not fail."""
    assert cli.main(["cubins", "--target", "sm120", "--json",
                     kernel_wheel(tmp_path, [sass(100, "a"), ptx(90)])]) == 0
    rows = json.loads(capsys.readouterr().out)["targets"]
    assert [r["verdict"] for r in rows] == ["jit", "ok"] and rows[0]["ptx"] == ["compute_90"]


def test_markdown_table(tmp_path, capsys):
    """--markdown prints the per-library arch columns and the per-target verdicts."""
    cli.main(["cubins", "--markdown", kernel_wheel(tmp_path, [sass(100, "a")])])
    out = capsys.readouterr().out
    assert "| library | sm_90a | sm_100a | sm_103a | sm_120a | all SASS |" in out
    assert "| sm100 | 10.3 | `sgl_kernel/sm100/common_ops.abi3.so` | - | **RED LINE: no code** |" in out


def test_installed_sglang_kernel_is_the_default(tmp_path, monkeypatch, capsys):
    """Without PATH the installed sglang-kernel is scanned; a trimmed sm90 install fails sm100."""
    lib = cuda_library(tmp_path / "x.so", [sass(90, "a")]).read_bytes()
    dist(tmp_path / "site", "sglang-kernel", "0.4.5", {"sgl_kernel/sm90/common_ops.abi3.so": lib,
                                                      "sgl_kernel/spatial_ops.abi3.so": lib})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert cli.main(["cubins", "--target", "sm90"]) == 0
    assert "installed sglang-kernel 0.4.5" in capsys.readouterr().out
    assert cli.main(["cubins", "--target", "sm100"]) == 1
    assert "library missing" in capsys.readouterr().out


def test_bad_path(tmp_path, capsys):
    """A missing path or a file that is no ELF is a usage error."""
    assert cli.main(["cubins", str(tmp_path / "nope.whl")]) == 2
    (tmp_path / "x.so").write_text("not elf")
    assert cli.main(["cubins", str(tmp_path / "x.so")]) == 2
    assert "not a 64-bit little-endian ELF" in capsys.readouterr().err
