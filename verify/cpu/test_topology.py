"""Tests for `repro topology` on recorded `nvidia-smi topo -m` outputs (verify/fixtures/topology)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from repro import cli
from repro.errors import UsageError
from repro.serving.topology import recommend
from repro.stack import gpuinfo

FIXTURES = Path(__file__).parents[1] / "fixtures" / "topology"


@pytest.mark.parametrize(("fixture", "gpus", "interconnect", "choice", "args"), [
    ("b300x8-nv18.txt", 8, "nvlink", "tp", ["--tp-size", "8"]),
    ("pro6000x8-pcie.txt", 8, "pcie", "ep", ["--tp-size", "8", "--ep-size", "8"]),
    ("partial-nvlink-x4.txt", 4, "mixed", "ep", ["--tp-size", "4", "--ep-size", "4"]),
    ("h200x1.txt", 1, "single", "tp", ["--tp-size", "1"]),
    ("h200x2.txt", 2, "nvlink", "tp", ["--tp-size", "2"]),
])
def test_fixture_is_classified_and_recommended(fixture: str, gpus: int, interconnect: str,
                                               choice: str, args: list[str]) -> None:
    """Each recorded box gets its interconnect, the TP/EP choice and the SGLang arguments."""
    answer = recommend((FIXTURES / fixture).read_text())
    assert (answer["gpus"], answer["interconnect"], answer["recommended"],
            answer["sglang_args"]) == (gpus, interconnect, choice, args)


def test_pcie_reason_cites_the_seed_measurement() -> None:
    """The PCIe recommendation gives the seed's EP8 vs TP8 numbers as its reason."""
    reason = recommend((FIXTURES / "pro6000x8-pcie.txt").read_text())["reason"]
    assert "no GPU pair has NVLink" in reason and "EP8 ~65 tok/s vs TP8 ~26 tok/s" in reason


def test_mixed_reason_counts_the_pairs_without_nvlink() -> None:
    """A partially NVLinked box names how many pairs lack NVLink."""
    reason = recommend((FIXTURES / "partial-nvlink-x4.txt").read_text())["reason"]
    assert reason.startswith("4 of 6 GPU pairs lack NVLink")


def test_json_output_has_exactly_the_documented_keys(capsys) -> None:
    """--json prints gpus, interconnect, recommended, reason and sglang_args."""
    assert cli.main(["topology", "--json", "--from", str(FIXTURES / "b300x8-nv18.txt")]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer) == {"gpus", "interconnect", "recommended", "reason", "sglang_args"}


def test_text_output_names_the_arguments(capsys) -> None:
    """The plain output ends with the SGLang arguments to use."""
    assert cli.main(["topology", "--from", str(FIXTURES / "pro6000x8-pcie.txt")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "SGLang arguments: --tp-size 8 --ep-size 8"


def test_text_without_a_gpu_matrix_is_refused() -> None:
    """Text that is not `nvidia-smi topo -m` output is a usage error."""
    with pytest.raises(UsageError, match=r"no GPU matrix"):
        recommend("No devices were found\n")


def test_missing_file_and_missing_nvidia_smi_are_one_line_errors(capsys, monkeypatch,
                                                                  tmp_path: Path) -> None:
    """An unreadable --from file exits 2; no nvidia-smi exits 1 suggesting --from."""
    assert cli.main(["topology", "--from", str(tmp_path / "none.txt")]) == 2
    assert re.search(r"--from: .*none\.txt does not exist", capsys.readouterr().err)
    monkeypatch.setattr(gpuinfo, "run_tool", lambda argv: (None, "nvidia-smi not found on PATH"))
    assert cli.main(["topology"]) == 1
    assert "pass --from FILE" in capsys.readouterr().err
