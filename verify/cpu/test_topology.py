"""Tests for `repro topology` on recorded boxes: a fake `nvidia-smi` serving each fixture (no GPU, one
H200, 8x RTX PRO 6000 PCIe, 8x B300 NVLink, a mixed 4-GPU box) and saved `nvidia-smi topo -m` files
(verify/fixtures/topology, with the --query-gpu CSVs of verify/fixtures/doctor)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from repro import cli
from repro.errors import UsageError
from repro.topology import detect
from repro.topology.collectives import load_table
from verify.fake_stack import fake_nvidia_smi

FIXTURES = Path(__file__).parents[1] / "fixtures"
TOPO, QUERY = FIXTURES / "topology", FIXTURES / "doctor"
BOXES = {  # name: (--query-gpu CSV, topo -m text)
    "h200x1": (QUERY / "h200x1.csv", TOPO / "h200x1.txt"),
    "pro6000x8": (QUERY / "pro6000x8.csv", TOPO / "pro6000x8-pcie.txt"),
    "b300x8": (QUERY / "b300x8.csv", TOPO / "b300x8-nv18.txt"),
    "mixed4": (TOPO / "h100x4-mixed.csv", TOPO / "partial-nvlink-x4.txt"),
}


def _serve(monkeypatch, tmp_path: Path, box: str) -> None:
    query, topo = BOXES[box]
    fake_nvidia_smi(monkeypatch, tmp_path / "bin", query, topo)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["topology", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


class TestNothingToSplit:
    def test_no_nvidia_smi_is_one_line(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """No nvidia-smi on PATH: one line, exit 0 (an answer, not a failure)."""
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        code, out, err = _run(capsys)
        assert code == 0 and not err
        assert out.count("\n") == 1 and out.startswith("GPUs: 0 - no GPU visible here (nvidia-smi not found on PATH)")

    def test_driver_not_loaded_is_one_line(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """nvidia-smi failing (no driver) says so in one line."""
        fake_nvidia_smi(monkeypatch, tmp_path / "bin", QUERY / "no-driver.txt", exit_code=9)
        code, out, _ = _run(capsys)
        assert code == 0 and out.count("\n") == 1 and "nvidia-smi exited 9" in out

    def test_one_gpu_is_one_line(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """One H200: one line naming it, nothing to split."""
        _serve(monkeypatch, tmp_path, "h200x1")
        code, out, _ = _run(capsys)
        assert code == 0 and out.count("\n") == 1
        assert out.startswith("GPUs: 1 (NVIDIA H200) - one GPU: nothing to split, serve with --tp-size 1")

    def test_one_gpu_json(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """--json on one GPU: the box and the one-line reason, no recommendation."""
        _serve(monkeypatch, tmp_path, "h200x1")
        code, out, _ = _run(capsys, "--json")
        answer = json.loads(out)
        assert code == 0 and answer["gpus"] == 1 and answer["recommended"] is None
        assert answer["reason"].startswith("GPUs: 1")


class TestBoxes:
    def test_pcie_box(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """8x RTX PRO 6000 on PCIe: no DeepEP, pynccl all-reduces, the same collectives in TP and EP."""
        _serve(monkeypatch, tmp_path, "pro6000x8")
        code, out, _ = _run(capsys, "--json")
        answer = json.loads(out)
        assert code == 0 and (answer["gpus"], answer["interconnect"], answer["fabric"], answer["gpu"]) == (
            8, "pcie", "pcie-gen5", "rtx-pro-6000")
        advice = "\n".join(answer["advice"])
        assert "DeepEP: not on pcie-gen5" in advice and "(pynccl)" in advice
        assert "the same in both a2a-none configurations" in advice
        assert {r["config"] for r in answer["prediction"]["rows"]} == {"tp", "ep"}
        assert answer["recommended"] in ("tp", "ep") and set(answer["recommended_by_concurrency"]) == {"1", "4", "16"}

    def test_nvlink_box(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """8x B300 NV18: sm100's fabric, the custom one-shot all-reduce, DeepEP among the configurations."""
        _serve(monkeypatch, tmp_path, "b300x8")
        code, out, _ = _run(capsys, "--json")
        answer = json.loads(out)
        assert code == 0 and (answer["fabric"], answer["gpu"]) == ("nvlink-sm100", "b300")
        assert {r["config"] for r in answer["prediction"]["rows"]} == {"tp", "ep", "deepep"}
        assert "custom one-shot" in "\n".join(answer["advice"])

    def test_mixed_box_is_predicted_as_pcie(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """4 GPUs bridged in pairs: the slowest hop rules, so PCIe, and the note says which pairs lack NVLink."""
        _serve(monkeypatch, tmp_path, "mixed4")
        code, out, _ = _run(capsys)
        assert code == 0
        assert "interconnect: mixed" in out and "fabric: pcie-gen5" in out and "GPU class: h100" in out
        assert "note: 4 GPU pairs lack NVLink" in out
        assert out.splitlines()[-1] == "SGLang arguments: " + (
            "--tp-size 4 --ep-size 4" if "recommended: ep" in out else "--tp-size 4")

    def test_text_output_ends_with_the_arguments(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """The plain output: a line per concurrency, the advice, the choice and its SGLang arguments."""
        _serve(monkeypatch, tmp_path, "pro6000x8")
        code, out, _ = _run(capsys)
        lines = out.splitlines()
        assert code == 0 and lines[1].startswith("note: P2P is assumed on") and re.match(r"c 1: (tp|ep) \S+", lines[2])
        assert lines[-1].startswith("SGLang arguments: --tp-size 8")


class TestSavedFiles:
    @pytest.mark.parametrize(("fixture", "gpus", "interconnect"), [
        ("b300x8-nv18.txt", 8, "nvlink"), ("pro6000x8-pcie.txt", 8, "pcie"), ("partial-nvlink-x4.txt", 4, "mixed"),
        ("h200x2.txt", 2, "nvlink"),
    ])
    def test_fixture_is_classified(self, fixture: str, gpus: int, interconnect: str) -> None:
        """Each recorded box gets its GPU count and interconnect."""
        box = detect.box_from_text((TOPO / fixture).read_text())
        assert (box.gpus, box.interconnect) == (gpus, interconnect)

    def test_from_without_names_says_the_gpu_is_assumed(self, capsys) -> None:
        """--from alone: the GPU model is unknown and the note says which class was assumed."""
        code, out, _ = _run(capsys, "--from", str(TOPO / "b300x8-nv18.txt"))
        assert code == 0 and "GPU model unknown (pass --gpus-from CSV or --gpu CLASS)" in out

    def test_from_with_gpus_from_names_them(self, capsys) -> None:
        """--from with --gpus-from: the GPU class comes from the names."""
        code, out, _ = _run(capsys, "--from", str(TOPO / "b300x8-nv18.txt"), "--gpus-from", str(QUERY / "b300x8.csv"))
        assert code == 0 and "GPU class: b300" in out and "GPU model unknown" not in out

    def test_from_one_gpu_is_one_line(self, capsys) -> None:
        """A saved one-GPU table is one line too."""
        code, out, _ = _run(capsys, "--from", str(TOPO / "h200x1.txt"))
        assert code == 0 and out.startswith("GPUs: 1 - one GPU") and out.count("\n") == 1

    def test_text_without_a_gpu_matrix_is_refused(self) -> None:
        """Text that is not `nvidia-smi topo -m` output is a usage error."""
        with pytest.raises(UsageError, match=r"no GPU matrix"):
            detect.box_from_text("No devices were found\n")

    def test_bad_names_are_one_line_errors(self, capsys, tmp_path: Path) -> None:
        """A missing --from file, an unknown --fabric or --gpu: exit 2 with one line naming it."""
        assert cli.main(["topology", "--from", str(tmp_path / "none.txt")]) == 2
        assert re.search(r"--from: .*none\.txt does not exist", capsys.readouterr().err)
        assert cli.main(["topology", "--from", str(TOPO / "b300x8-nv18.txt"), "--fabric", "infiniband"]) == 2
        assert "--fabric must be one of nvlink-sm90, nvlink-sm100, pcie-gen5, pcie-gen5-nop2p" in capsys.readouterr().err
        assert cli.main(["topology", "--predict", "k26-pro6000-tp8", "--gpu", "a100"]) == 2
        assert "--gpu must be one of" in capsys.readouterr().err


class TestPredict:
    def test_pcie_profile_table(self, capsys) -> None:
        """--predict of the PCIe box: TP8 and TP8 + EP8 x AR, DFLASH, DDTREE B 16..512 x c 1 / 4 / 16."""
        code, out, _ = _run(capsys, "--predict", "k26-pro6000-tp8", "--json")
        pred = json.loads(out)
        assert code == 0 and (pred["gpu"], pred["fabric"], pred["configs"]) == ("rtx-pro-6000", "pcie-gen5", ["tp", "ep"])
        assert len(pred["rows"]) == 2 * 8 * 3
        assert all(r["tok_s"] > 0 and r["round_ms"] > 0 for r in pred["rows"])

    def test_nvlink_profile_has_deepep(self, capsys) -> None:
        """--predict of the B300 box adds DeepEP."""
        code, out, _ = _run(capsys, "--predict", "k26-b300-ep8", "--json")
        pred = json.loads(out)
        assert code == 0 and pred["configs"] == ["tp", "ep", "deepep"] and pred["fabric"] == "nvlink-sm100"

    def test_text_table(self, capsys) -> None:
        """The plain --predict output: a Markdown table a row per cell, then the advice."""
        code, out, _ = _run(capsys, "--predict", "k26-h200-tp8")
        assert code == 0 and "| DDTREE B 512 |" in out and "- DeepEP" not in out
        assert out.splitlines()[0].startswith("box: 8x h200 (nvlink-sm90)")

    def test_no_p2p_fabric(self, capsys) -> None:
        """--fabric pcie-gen5-nop2p: a small all-reduce ~200 us, 8x P2P's, in TP and EP alike."""
        _, out, _ = _run(capsys, "--predict", "k26-pro6000-tp8", "--json")
        on = json.loads(out)
        _, out, _ = _run(capsys, "--predict", "k26-pro6000-tp8", "--fabric", "pcie-gen5-nop2p", "--json")
        off = json.loads(out)
        small = [(a, b) for a, b in zip(on["rows"], off["rows"], strict=True) if a["algorithm"] == "AR"
                 and a["concurrency"] == 1]
        assert {a["config"] for a, _ in small} == {"tp", "ep"}
        assert all(b["collectives_ms"] > 5 * a["collectives_ms"] for a, b in small)
        assert len({round(b["collectives_ms"], 6) for _, b in small}) == 1

    def test_unknown_model_is_refused(self, capsys) -> None:
        """A profile serving a model the cost model does not describe is a usage error."""
        assert cli.main(["topology", "--predict", "test-h200-tp1"]) == 2
        assert "the model predicts Kimi-K2.6" in capsys.readouterr().err


def test_table_every_figure_has_a_source() -> None:
    """Every collectives.toml figure has a public source or a stated derivation, every GPU a source."""
    table = load_table()
    for gpu in table.gpus.values():
        assert gpu.source and gpu.hbm_tb_s > 0 and gpu.bf16_tflops > 0
    for fab in table.fabrics.values():
        assert fab.figures and all(f.source or f.derived for f in fab.figures)
        assert fab.figure("all-reduce", "nccl", graph=True) is not None
        assert set(fab.gpu_classes) <= set(table.gpus)
