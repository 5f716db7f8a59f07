"""Tests for `repro.stack.gpuinfo` on recorded nvidia-smi outputs and on a fake nvidia-smi on PATH."""

from __future__ import annotations

import pytest

from repro.stack import gpuinfo
from verify.fake_stack import FIXTURES, fake_nvidia_smi

DOCTOR = FIXTURES / "doctor"
TOPOLOGY = FIXTURES / "topology"


class TestParseGpuQuery:
    def test_h200(self):
        """The H200 row (recorded on the lent H200) gives capability (9, 0), memory in MiB and the driver."""
        gpus, driver = gpuinfo.parse_gpu_query((DOCTOR / "h200x1.csv").read_text())
        assert gpus == [gpuinfo.Gpu(0, "NVIDIA H200", (9, 0), 143771, "00000000:00:06.0")]
        assert driver == "580.159.04"

    def test_eight_b300_are_sm_103(self):
        """Eight B300 rows parse in order with capability (10, 3)."""
        gpus, _ = gpuinfo.parse_gpu_query((DOCTOR / "b300x8.csv").read_text())
        assert [g.index for g in gpus] == list(range(8)) and {g.capability for g in gpus} == {(10, 3)}

    def test_unreported_capability_is_none(self):
        """An old driver prints [N/A] for compute_cap: capability None, not an error."""
        gpus, _ = gpuinfo.parse_gpu_query("0, Tesla T4, [N/A], 470.1, 15360, 00000000:00:04.0\n")
        assert gpus[0].capability is None

    def test_wrong_field_count_is_an_error(self):
        """A row of another query format is rejected, naming the row."""
        with pytest.raises(ValueError, match=r"must have 6 fields"):
            gpuinfo.parse_gpu_query("NVIDIA H200, 9.0\n")


class TestQueryGpus:
    def test_no_nvidia_smi(self, monkeypatch, tmp_path):
        """Without nvidia-smi on PATH there are no GPUs and the reason says so."""
        monkeypatch.setenv("PATH", str(tmp_path))
        found = gpuinfo.query_gpus()
        assert found.gpus == [] and found.error == "nvidia-smi not found on PATH"

    def test_driver_not_loaded(self, monkeypatch, tmp_path):
        """nvidia-smi failing (driver not loaded) gives no GPUs and its message."""
        fake_nvidia_smi(monkeypatch, tmp_path, DOCTOR / "no-driver.txt", exit_code=9)
        found = gpuinfo.query_gpus()
        assert found.gpus == [] and found.error.startswith("nvidia-smi exited 9: NVIDIA-SMI has failed")

    def test_recorded_h200(self, monkeypatch, tmp_path):
        """A working nvidia-smi gives the parsed GPUs."""
        fake_nvidia_smi(monkeypatch, tmp_path, DOCTOR / "h200x1.csv")
        found = gpuinfo.query_gpus()
        assert [g.name for g in found.gpus] == ["NVIDIA H200"] and found.error is None


class TestTopology:
    @pytest.mark.parametrize(("fixture", "count", "kind"), [
        ("h200x1.txt", 1, "single"), ("h200x2.txt", 2, "nvlink"), ("b300x8-nv18.txt", 8, "nvlink"),
        ("pro6000x8-pcie.txt", 8, "pcie"), ("partial-nvlink-x4.txt", 4, "mixed"),
    ])
    def test_interconnect_of_recorded_matrices(self, fixture, count, kind):
        """Each recorded matrix classifies as single, nvlink, pcie or mixed."""
        links = gpuinfo.parse_topology((TOPOLOGY / fixture).read_text())
        assert len(links) == count * (count - 1) // 2
        assert gpuinfo.interconnect(links, count) == kind

    def test_links_are_read_per_pair_and_nic_rows_ignored(self):
        """Pairs map to their link string; NIC columns and rows do not leak in."""
        links = gpuinfo.parse_topology((TOPOLOGY / "partial-nvlink-x4.txt").read_text())
        assert links[(0, 1)] == "NV4" and links[(0, 2)] == "NODE" and links[(2, 3)] == "NV4"

    def test_underlined_header_is_understood(self):
        """Terminal escape codes around the header names do not hide the matrix."""
        text = (TOPOLOGY / "h200x2.txt").read_text().replace("\tGPU0\tGPU1", "\t\x1b[4mGPU0\tGPU1\x1b[0m", 1)
        assert gpuinfo.parse_topology(text) == {(0, 1): "NV18"}
