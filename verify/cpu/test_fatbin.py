"""Tests for `repro.stack.fatbin` on synthetic ELF libraries laid out as nvcc writes them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from repro.stack import fatbin
from repro.stack.fatbin import CudaCode
from verify.fake_stack import FLAGS_64BIT_LINUX, Entry, cuda_library, ptx, sass

HAS_ZSTD = sys.version_info >= (3, 14) or shutil.which("zstd") is not None


def labels(codes) -> list[str]:
    """The labels of ``codes``, sorted."""
    return [c.label for c in sorted(codes)]


def _zstd(data: bytes) -> bytes:
    if sys.version_info >= (3, 14):
        from compression import zstd

        return zstd.compress(data)
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


class TestScanLibrary:
    def test_sass_archs_and_variants(self, tmp_path):
        """Plain, arch-specific and family SASS are all listed, each once."""
        lib = cuda_library(tmp_path / "ops.so", [sass(90), sass(90, "a"), sass(100, "f"), sass(90, "a")])
        assert labels(fatbin.scan_library(lib)) == ["sm_90", "sm_90a", "sm_100f"]

    def test_several_containers_with_padding(self, tmp_path):
        """Containers after the first (separated by padding) are read too."""
        lib = cuda_library(tmp_path / "ops.so", [sass(80)], [sass(120, "a")], [ptx(90)])
        assert labels(fatbin.scan_library(lib)) == ["sm_80", "compute_90", "sm_120a"]

    def test_header_flag_gives_the_variant_when_the_payload_is_unreadable(self, tmp_path, monkeypatch):
        """A compressed entry whose payload cannot be decoded falls back to the arch-specific flag."""
        monkeypatch.setattr(fatbin, "_decompress_zstd", lambda blob: None)
        lib = cuda_library(tmp_path / "ops.so", [sass(103, "a", compressed=True), sass(90, compressed=True)])
        assert labels(fatbin.scan_library(lib)) == ["sm_90", "sm_103a"]

    @pytest.mark.skipif(not HAS_ZSTD, reason="no zstd encoder/decoder on this machine")
    def test_zstd_payload_names_the_variant(self, tmp_path):
        """A zstd-compressed cubin is decoded; its ptxas -arch wins over the header flags."""
        entry = Entry(100, flags=FLAGS_64BIT_LINUX | fatbin.FLAG_ZSTD, payload=_zstd(b"\x7fELF -arch sm_100f -m 64"))
        assert labels(fatbin.scan_library(cuda_library(tmp_path / "ops.so", [entry]))) == ["sm_100f"]

    def test_library_without_device_code(self, tmp_path):
        """An ELF with no .nv_fatbin section carries nothing."""
        lib = cuda_library(tmp_path / "plain.so")
        data = bytearray(lib.read_bytes())
        data[data.index(b".nv_fatbin")] = ord("x")  # rename the section
        lib.write_bytes(bytes(data))
        assert fatbin.scan_library(lib) == frozenset()

    def test_not_an_elf(self, tmp_path):
        """A file that is not a 64-bit ELF is rejected by name."""
        (tmp_path / "x.so").write_bytes(b"MZ" + b"\0" * 100)
        with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
            fatbin.scan_library(tmp_path / "x.so")


class TestScanContainers:
    def test_tree_paths_are_relative_to_the_site(self, tmp_path):
        """Scanning a site or the sgl_kernel package itself gives the same sgl_kernel/... keys."""
        cuda_library(tmp_path / "sgl_kernel" / "sm90" / "common_ops.abi3.so", [sass(90, "a")])
        (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
        expected = {"sgl_kernel/sm90/common_ops.abi3.so": frozenset({CudaCode(90, "a", "sass")})}
        assert fatbin.scan(tmp_path) == expected
        assert fatbin.scan(tmp_path / "sgl_kernel") == expected

    def test_wheel_members(self, tmp_path):
        """Every shared library inside a wheel is scanned under its member name."""
        lib = cuda_library(tmp_path / "lib.so", [sass(120, "a")])
        with zipfile.ZipFile(tmp_path / "k-1-py3-none-any.whl", "w") as whl:
            whl.write(lib, "sgl_kernel/sm100/common_ops.abi3.so")
            whl.writestr("sgl_kernel/__init__.py", "")
        found = fatbin.scan(tmp_path / "k-1-py3-none-any.whl")
        assert labels(found["sgl_kernel/sm100/common_ops.abi3.so"]) == ["sm_120a"]


class TestRunsOn:
    @pytest.mark.parametrize(("code", "cap", "runs"), [
        (CudaCode(90, "a", "sass"), (9, 0), True),
        (CudaCode(100, "a", "sass"), (10, 3), False),  # a: exact capability only
        (CudaCode(100, "f", "sass"), (10, 3), True),   # f: the family
        (CudaCode(103, "f", "sass"), (10, 0), False),
        (CudaCode(100, "", "sass"), (10, 3), True),    # plain SASS: same major, minor >= own
        (CudaCode(90, "", "sass"), (10, 0), False),    # never across majors
        (CudaCode(90, "", "ptx"), (12, 0), True),      # plain PTX: JIT for any later GPU
        (CudaCode(90, "a", "ptx"), (10, 0), False),
    ])
    def test_compatibility_rules(self, code, cap, runs):
        """SASS, arch-specific, family and PTX compatibility follow CUDA's rules."""
        assert code.runs_on(cap) is runs


class TestCoverage:
    def test_missing_library_and_jit_only(self):
        """A capability with SASS is ok, with PTX only is jit, and an absent library is missing."""
        libs = {"a.so": frozenset({CudaCode(90, "a", "sass"), CudaCode(80, "", "ptx")})}
        result = fatbin.coverage(libs, ("a.so", "b.so"), ((9, 0), (12, 0)))
        assert [(c.capability, c.library, c.verdict) for c in result] == [
            ((9, 0), "a.so", "ok"), ((9, 0), "b.so", "missing"), ((12, 0), "a.so", "jit"), ((12, 0), "b.so", "missing")]
        assert result[0].sass == ("sm_90a",) and result[0].ptx == ("compute_80",) and not result[1].present
