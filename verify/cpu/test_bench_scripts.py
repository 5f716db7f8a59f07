"""CPU checks of the GPU bench scripts' inputs and arguments (verify/bench/bench_topk.py,
verify/bench/bench_tree.py); their timings run on the GPU machine only."""

from __future__ import annotations

import json

import pytest
import torch

from repro.handoff import plots
from repro.kernels.topk_lse import TopKConfig
from verify.bench import bench_topk, bench_tree


@pytest.mark.parametrize("stages", ["select,bogus", ","])
def test_unknown_sweep_stage_is_a_usage_error(capsys, stages):
    """--stages outside stream/select/keys/tail exits 2 with one line naming the choices, before any GPU check."""
    with pytest.raises(SystemExit) as exc:
        bench_topk.main(["--sweep", "--stages", stages])
    assert exc.value.code == 2
    assert "--stages takes a comma-separated subset of stream,select,keys,tail" in capsys.readouterr().err


def test_every_sweep_stage_is_named_and_its_variants_are_valid_configs():
    """SWEEP_STAGES names each stage of the sweep, every variant builds a TopKConfig, and the tail
    stage tries scan_tail off and on."""
    stages = dict(zip(bench_topk.SWEEP_STAGES, bench_topk.sweep_stages(), strict=True))
    for variants in stages.values():
        for fields in variants:
            TopKConfig(**fields)
    assert stages["tail"] == [{"scan_tail": False}, {"scan_tail": True}]


def test_peaked_drafter_is_confident_and_randn_is_not():
    """``peaked`` rows put about 80 % on one token (so the tree runs deep); ``randn`` rows put
    under 1 % anywhere; both are seeded and bf16."""
    probs = {d: bench_tree.draft_logits(2, 3, 163840, d, "cpu").float().softmax(-1) for d in bench_tree.DISTRIBUTIONS}
    top = {d: p.max(-1).values for d, p in probs.items()}
    assert ((top["peaked"] > 0.6) & (top["peaked"] < 0.95)).all()
    assert (top["randn"] < 0.01).all()
    assert torch.equal(bench_tree.draft_logits(1, 2, 1000, "peaked", "cpu"), bench_tree.draft_logits(1, 2, 1000, "peaked", "cpu"))
    assert bench_tree.draft_logits(1, 2, 1000, "randn", "cpu").dtype == torch.bfloat16


def _topk_row(bs: int, **extra: float) -> dict:
    fused = {1: 18.0, 8: 33.0, 32: 83.0, 64: 160.0}[bs]
    return {"kind": "random", "bs": bs, "k": 256, "vocab": 163840, "dtype": "bfloat16", "fused_graph_us": fused,
            "torch_topk_graph_us": 10 * fused, "log_softmax_topk_graph_us": float("nan"),
            "read_once_graph_us": fused / 2, "floor_us": bs * 1.14, **extra}


def test_replot_draws_the_saved_rows(tmp_path, capsys):
    """--replot draws a real PNG beside a saved result (a NaN column and an adversarial row are
    left out), with no GPU."""
    saved = tmp_path / "bench_topk.json"
    rows = [_topk_row(bs, target_us=t) for bs, t in ((1, 20.0), (8, 28.0), (32, 75.0), (64, 150.0))]
    saved.write_text(json.dumps({"rows": [*rows, {"kind": "tied", "bs": 8, "k": 256, "vocab": 163840}]}))
    assert bench_topk.main(["--replot", str(saved)]) == 0
    assert saved.with_suffix(".png").read_bytes().startswith(b"\x89PNG") and "wrote" in capsys.readouterr().out
    assert plots.topk_vs_batch([{"kind": "tied", "bs": 8}], tmp_path / "none.png") is not None
    assert not (tmp_path / "none.png").exists()


def test_replot_of_a_file_that_is_no_result_is_a_usage_error(tmp_path, capsys):
    """A missing file or one without rows exits 2 with one line."""
    (tmp_path / "x.json").write_text("[]")
    for path in (tmp_path / "missing.json", tmp_path / "x.json"):
        assert bench_topk.main(["--replot", str(path)]) == 2
        assert "--replot needs a bench_topk JSON with 'rows'" in capsys.readouterr().err
