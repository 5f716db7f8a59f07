"""`repro topology --measure` on a box of two or more GPUs, checked against the collectives model:
the first lent multi-GPU machine tests the table's all-reduce figures (repro/data/collectives.toml)
for its fabric. Skips, saying why, below two GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repro import cli
from repro.topology import detect
from repro.topology.collectives import load_table

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]
FACTOR = 3.0  # a measured small all-reduce within 3x of the table's figure for the detected fabric


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`repro topology --measure` once for the module (skips below two GPUs)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"--measure needs 2 or more GPUs, this machine has {torch.cuda.device_count()}")
    out = tmp_path_factory.mktemp("measure") / "m.json"
    assert cli.main(["topology", "--measure", "--reps", "10", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def test_measure_writes_both_modes(measured: dict) -> None:
    """Eager and CUDA-graph all-reduce at 14 KB x T, and the logits all-gather, from every local GPU."""
    ops = {(f["op"], f["graph"]) for f in measured["figures"]}
    assert ops == {("all-reduce", False), ("all-reduce", True), ("all-gather", True)}
    assert all(f["gpus"] == torch.cuda.device_count() for f in measured["figures"])
    ar = next(f for f in measured["figures"] if f["op"] == "all-reduce" and f["graph"])
    assert [m for m, _ in ar["points"]][:2] == [14336, 28672] and all(t > 0 for _, t in ar["points"])


def test_small_all_reduce_matches_the_table(measured: dict) -> None:
    """The decode-size NCCL all-reduce (T 1..16) is within FACTOR of the table's figure for this fabric."""
    fab = load_table().fabrics[measured["fabric"]]
    nccl = fab.figure("all-reduce", "nccl", graph=True)
    ar = next(f for f in measured["figures"] if f["op"] == "all-reduce" and f["graph"])
    for nbytes, us in ar["points"]:
        if nbytes <= 16 * 14336:
            want = nccl.time_us(nbytes)
            assert want / FACTOR <= us <= want * FACTOR, (nbytes, us, want)


def test_measured_box_is_this_one(measured: dict) -> None:
    """The result names this box's GPU count and the fabric `repro topology` classifies it as."""
    box = detect.local_box()
    assert measured["box"]["gpus"] == box.gpus and Path(measured.get("fabric", "")).name
