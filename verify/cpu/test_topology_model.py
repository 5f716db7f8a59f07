"""Tests for the TP / EP cost model (repro.topology): the collectives SGLang runs per configuration,
the per-GPU bytes under TP and EP, the fits and held-out checks on synthetic one-GPU measurements,
`--measure` on torch's fake process group, and the k26-ep8 share's expert masking."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from repro import cli
from repro.errors import ReproError, UsageError
from repro.testmodels import shares, spread
from repro.topology import checks, collectives, compute, measure, model
from repro.topology.collectives import load_table, target_collectives, with_measured

TABLE = load_table()
K26 = model.kimi_k26()


def _box(gpu: str, fabric: str, p: int = 8) -> model.Box:
    return model.Box(TABLE.gpus[gpu], TABLE.fabrics[fabric], p)


class TestCollectives:
    def test_tp_and_ep_run_the_same_collectives(self) -> None:
        """a2a none: TP8 and TP8 + EP8 run identical collectives (123 all-reduces + the logits gather)."""
        kw = {"hidden": 7168, "vocab": 163840, "layers": 61, "tokens": 17, "p": 8}
        tp, ep = target_collectives("tp", **kw), target_collectives("ep", **kw)
        assert tp == ep
        assert sum(c.count for c in tp if c.op == "all-reduce") == 123
        assert all(c.nbytes == 17 * 7168 * 2 for c in tp if c.op == "all-reduce")
        assert [c.nbytes for c in tp if c.op == "all-gather"] == [17 * 163840 * 2]

    def test_deepep_swaps_all_reduces_for_scatter_gather_and_all_to_all(self) -> None:
        """DeepEP: no all-reduce; a reduce-scatter and an all-gather a layer, dispatch and combine."""
        plan = target_collectives("deepep", hidden=7168, vocab=163840, layers=61, tokens=64, p=8)
        ops = {c.op: c.count for c in plan if c.count == 61}
        assert "all-reduce" not in {c.op for c in plan}
        assert ops == {"all-gather": 61, "reduce-scatter": 61, "dispatch": 61, "combine": 61}
        assert next(c for c in plan if c.op == "dispatch").tokens_per_rank == 8

    def test_one_gpu_runs_none(self) -> None:
        """TP1 has no collective."""
        assert target_collectives("tp", hidden=7168, vocab=163840, layers=61, tokens=8, p=1) == []

    @pytest.mark.parametrize(("fabric", "oneshot_tokens"), [("nvlink-sm90", 9), ("nvlink-sm100", 36)])
    def test_custom_all_reduce_cut_over(self, fabric: str, oneshot_tokens: int) -> None:
        """One-shot up to 128 KB on sm90 (T <= 9) and 512 KB on sm100 (T <= 36), two-shot above."""
        fab = TABLE.fabrics[fabric]
        assert fab.all_reduce(14336 * oneshot_tokens)[1] == "custom one-shot"
        assert fab.all_reduce(14336 * (oneshot_tokens + 1))[1] == "custom two-shot"
        assert fab.all_reduce(32 << 20)[1] == "pynccl"

    def test_pcie_has_no_custom_all_reduce(self) -> None:
        """More than two PCIe GPUs: pynccl in graphs, NCCL eager."""
        fab = TABLE.fabrics["pcie-gen5"]
        assert fab.all_reduce(14336)[1] == "pynccl" and fab.all_reduce(14336, graph=False)[1] == "NCCL"
        assert 24 < fab.all_reduce(14336)[0] < 25

    def test_times_grow_with_bytes(self) -> None:
        """Every fabric's all-reduce and all-gather are non-decreasing in the message size."""
        sizes = [2 ** k for k in range(6, 31)]
        for fab in TABLE.fabrics.values():
            for f in (lambda m, fab=fab: fab.all_reduce(m)[0], lambda m, fab=fab: fab.all_gather(m)):
                times = [f(m) for m in sizes]
                assert all(b >= a - 1e-9 for a, b in itertools.pairwise(times))

    def test_all_gather_is_cheaper_than_all_reduce(self) -> None:
        """The rule for the unpublished all-gather: the all-reduce's latency and half its bytes."""
        fab = TABLE.fabrics["pcie-gen5"]
        m = 100 << 20
        assert fab.all_gather(m) == pytest.approx(24.6 + (fab.all_reduce(m)[0] - 24.6) / 2)

    def test_measured_figures_replace_the_table(self) -> None:
        """A --measure result replaces the fabric's NCCL all-reduce and keeps the rest."""
        fab = TABLE.fabrics["pcie-gen5"]
        measured = {"figures": [{"op": "all-reduce", "impl": "nccl", "graph": True, "gpus": 8,
                                 "points": [[14336, 12.0], [143360, 15.0]]}]}
        new = with_measured(fab, measured, "m.json")
        assert new.all_reduce(14336) == (12.0, "pynccl") and new.measured == "m.json"
        assert new.figure("all-reduce", "custom-fork", graph=False) is not None

    def test_malformed_table_is_one_usage_error(self, tmp_path: Path) -> None:
        """A figure without a source or with decreasing points is refused, naming the file."""
        bad = tmp_path / "c.toml"
        text = (Path(collectives.__file__).parents[1] / "data" / "collectives.toml").read_text()
        bad.write_text(text.replace("points = [[512, 5.9], [4096, 5.7]", "points = [[4096, 5.9], [512, 5.7]"))
        with pytest.raises(UsageError, match=r"c\.toml: fabrics\.nvlink-sm90\.figures\[0\]: points must be increasing"):
            load_table(bad)


class TestBytes:
    def test_ep_reads_more_expert_bytes_at_one_token(self) -> None:
        """T = 1, uniform router: EP's most-loaded GPU reads ~2.5 whole experts, TP 8 eighths."""
        tp = compute.target_work(K26.target, "tp", 8, 1, spread_kind="uniform")
        ep = compute.target_work(K26.target, "ep", 8, 1, spread_kind="uniform")
        assert 2.2 < ep.expert_bytes / tp.expert_bytes < 2.8

    def test_equal_bytes_once_every_expert_is_read(self) -> None:
        """T >= 513: every expert is read on every GPU, so TP and EP read the same bytes."""
        tp = compute.target_work(K26.target, "tp", 8, 513, spread_kind="uniform")
        ep = compute.target_work(K26.target, "ep", 8, 513, spread_kind="uniform")
        assert ep.expert_bytes == pytest.approx(tp.expert_bytes)

    def test_per_gpu_bytes_at_one_token(self) -> None:
        """Per-GPU weight bytes at T 1 near 6.0 (TP8) and 8.1 GB (EP8); DeepEP +4.6 GB."""
        gb = {c: (w.dense_bytes + w.moe_layers * w.expert_bytes) / 1e9 for c in compute.CONFIGS
              for w in [compute.target_work(K26.target, c, 8, 1, context=0, spread_kind="uniform")]}
        assert gb["tp"] == pytest.approx(6.0, rel=0.1) and gb["ep"] == pytest.approx(8.1, rel=0.1)
        assert gb["deepep"] - gb["ep"] == pytest.approx(4.6, rel=0.1)

    def test_skewed_router_reads_fewer_experts(self) -> None:
        """Dirichlet(0.3) popularity: ~190 distinct experts for 129 tokens against ~356 uniform."""
        assert spread.spread("skewed", 129).experts == pytest.approx(194, rel=0.1)
        assert spread.spread("uniform", 129).experts == pytest.approx(358, rel=0.05)
        assert spread.spread("uniform", 1).max_experts == pytest.approx(2.56, rel=0.1)


class TestPredictions:
    def test_pcie_large_budgets_are_collective_bound(self) -> None:
        """On PCIe, TP's DDTREE B 512 at c 16 spends more on collectives than on its forward; B 16 at c 1
        spends a seventh of its round on them."""
        box = _box("rtx-pro-6000", "pcie-gen5")
        big = model.predict_round(K26, box, "tp", "DDTREE", 512, 16)
        small = model.predict_round(K26, box, "tp", "DDTREE", 16, 1)
        assert big["collectives_ms"] > big["target_ms"] > 0
        assert small["collectives_ms"] < 0.2 * small["round_ms"]

    def test_nvlink_collectives_are_cheaper_than_pcie(self) -> None:
        """The same cell's collectives: B300 NVLink below PCIe's."""
        nv = model.predict_round(K26, _box("b300", "nvlink-sm100"), "tp", "DDTREE", 64, 4)
        pcie = model.predict_round(K26, _box("rtx-pro-6000", "pcie-gen5"), "tp", "DDTREE", 64, 4)
        assert nv["collectives_ms"] < pcie["collectives_ms"] / 3

    def test_deepep_only_with_nvlink(self) -> None:
        """DeepEP is a configuration of NVLink boxes only."""
        assert model.configs_for(_box("b300", "nvlink-sm100")) == ["tp", "ep", "deepep"]
        assert model.configs_for(_box("rtx-pro-6000", "pcie-gen5")) == ["tp", "ep"]

    def test_tau_interpolates_between_budgets(self) -> None:
        """τ of the K2.5-DFlash profile: the fitted budgets, interpolated between; AR 1."""
        assert K26.tau("AR", None) == 1.0
        assert K26.tau("DDTREE", 16) == K26.taus["16"]
        assert K26.taus["32"] > K26.tau("DDTREE", 24) > K26.taus["16"]

    def test_tok_s_is_c_tau_over_round(self) -> None:
        """tok/s = c x τ / round."""
        r = model.predict_round(K26, _box("h200", "nvlink-sm90"), "ep", "DFLASH", None, 4)
        assert r["tok_s"] == pytest.approx(4 * r["tau"] / r["round_ms"] * 1e3)


def _synthetic_share_rows(eff: compute.MoeEfficiency, share: str, bw: float, fl: float) -> list[dict]:
    rows = []
    for t in (1, 8, 16, 17, 33, 65, 129, 257, 513, 1028, 2052, 4112):
        s = spread.spread("uniform", t)
        experts, pairs = (s.experts, s.pairs) if share == "k26-tp8" else (s.max_experts, s.max_pairs)
        row = {"share": share, "spread": "uniform", "t": t, "bs": 1, "n": t, "experts": experts, "pairs": pairs}
        pt = checks.share_point({**row, "us": 1.0})
        row["us"] = eff.fixed_us + pt["bytes"] / (eff.bw_eff * bw * 1e6) + pt["flops"] / (eff.flops_eff * fl * 1e6)
        rows.append(row)
    return rows


class TestChecks:
    EFF: ClassVar = {"k26-tp8": compute.MoeEfficiency(30.0, 0.4, 0.3), "k26-ep8": compute.MoeEfficiency(20.0, 0.7, 0.5)}

    def _rows(self) -> list[dict]:
        return [r for share, eff in self.EFF.items() for r in _synthetic_share_rows(eff, share, 4.8, 989)]

    def test_fit_recovers_the_constants(self) -> None:
        """Rows made by known constants: the fit gives them back."""
        for share, eff in self.EFF.items():
            got = checks.fit_share_moe([r for r in self._rows() if r["share"] == share], 4.8, 989)
            assert got.fixed_us == pytest.approx(eff.fixed_us, rel=1e-6)
            assert got.bw_eff == pytest.approx(eff.bw_eff, rel=1e-6)
            assert got.flops_eff == pytest.approx(eff.flops_eff, rel=1e-6)

    def test_held_out_points_pass(self) -> None:
        """Held-out T are reproduced within 10% (exactly, on model-made rows)."""
        result = checks.check_shares(self._rows(), lambda r: r["t"] in (17, 129, 1028), 4.8, 989)
        assert [c.name for c in result] == ["k26-ep8 MoE layer", "k26-tp8 MoE layer"]
        assert all(c.passed and len(c.held_out) == 3 for c in result)

    def test_a_point_off_the_model_fails(self) -> None:
        """One held-out point 20% above what the others imply fails the 10% check, and says so."""
        rows = self._rows()
        for r in rows:
            if r["share"] == "k26-tp8" and r["t"] == 129:
                r["us"] *= 1.2
        result = {c.name: c for c in checks.check_shares(rows, lambda r: r["t"] in (17, 129), 4.8, 989)}
        assert not result["k26-tp8 MoE layer"].passed and result["k26-ep8 MoE layer"].passed
        assert result["k26-tp8 MoE layer"].summary().startswith("k26-tp8 MoE layer: 1 of 2 held-out points within 10%")

    def test_too_few_rows_to_fit(self) -> None:
        """Fewer than three rows left to fit three constants is a usage error."""
        rows = self._rows()[:4]
        with pytest.raises(UsageError, match="rows to fit three constants"):
            checks.check_shares(rows, lambda r: r["t"] > 8, 4.8, 989)

    def test_calibration_from_shares_sets_both_widths(self) -> None:
        """A share_cost result's rows become the narrow (256) and wide (2048) MoE constants."""
        cal = checks.calibration_from_shares(self._rows(), "h200", 4.8, 989)
        assert cal.moe_for(256).bw_eff == pytest.approx(0.4) and cal.moe_for(2048).bw_eff == pytest.approx(0.7)

    def test_served_check_on_synthetic_rounds(self) -> None:
        """Host time (a base per algorithm, one ms per root of the verified tokens) fitted at c 1 on two budgets predicts
        c 4 / 16 and the other budgets; a slow round fails 15%."""
        def gpu(r: dict) -> float:
            return 3.0 + 0.05 * r["concurrency"] * (r.get("budget") or 1)

        def tokens(r: dict) -> int:
            return r["concurrency"] * ((r["budget"] or 0) + 1)

        rows = [{"algorithm": a, "budget": b, "concurrency": c}
                for a, b in (("AR", None), ("DDTREE", 16), ("DDTREE", 64), ("DDTREE", 128)) for c in (1, 4, 16)]
        for r in rows:
            r["round_ms"] = gpu(r) + {"AR": 0.5, "DDTREE": 2.0}[r["algorithm"]] + 0.01 * tokens(r) ** 0.5
        fit = lambda r: r["concurrency"] == 1 and r["budget"] in (None, 16, 128)  # noqa: E731
        host, check = checks.check_served("synthetic", rows, fit, gpu, block=8, per_root=True)
        assert host.ms["DDTREE"] == pytest.approx((2.0, 0.01), rel=1e-3) and check.passed and check.worst < 1e-6
        assert len(check.held_out) == len(rows) - 3
        rows[-1]["round_ms"] *= 1.3
        assert not checks.check_served("synthetic", rows, fit, gpu, block=8, per_root=True)[1].passed
        const, _ = checks.check_served("synthetic", rows, fit, gpu, block=8)
        assert const.ms["AR"][1] == 0.0

    def test_whole_forward_fit_on_model_made_rows(self) -> None:
        """Whole-forward rows made by a calibration are reproduced by the forward fit."""
        target = compute.Target.from_config("k26-tp8", shares.read_model("k26-tp8")["target"])
        truth = compute.Calibration("h200", 50.0, 0.67, 0.5, {"narrow": compute.MoeEfficiency(0.0, 0.45, 0.3)})
        rows = [{"tokens": t, "distinct": t, "ms": checks.forward_ms(target, truth, t, 4.8, 989, "uniform")}
                for t in (1, 4, 8, 16, 32, 64, 128, 256, 512, 2048)]
        fitted = checks.fit_forward(target, rows, 4.8, 989, spread="uniform")
        assert fitted.layer_us == pytest.approx(50.0, rel=1e-3)
        assert fitted.moe["narrow"].bw_eff == pytest.approx(0.45, rel=1e-3)


class FakeGroup:
    """A process group whose collective takes 10 us + 1 us a KB, on a fake clock."""

    def __init__(self, world: int = 4, *, graphs: bool = True) -> None:
        self.rank, self.world, self.graphs = 0, world, graphs
        self.calls: list[tuple[str, int]] = []

    def buffer(self, nbytes: int) -> bytearray:
        """A message buffer."""
        return bytearray(nbytes)

    def all_reduce(self, buf: bytearray) -> None:
        """Record an all-reduce."""
        self.calls.append(("all-reduce", len(buf)))

    def all_gather(self, out: bytearray, buf: bytearray) -> None:
        """Record an all-gather."""
        assert len(out) == self.world * len(buf)
        self.calls.append(("all-gather", len(out)))

    def time_us(self, fn, reps: int, *, graph: bool) -> float:
        """The fake clock: 10 us + 1 us a KB a call, 2 us less in a graph."""
        start = len(self.calls)
        for _ in range(reps):
            fn()
        return sum(10.0 + n / 1024 for _, n in self.calls[start:]) / reps - (2.0 if graph else 0.0)

    def slowest(self, value: float) -> float:
        """One rank: its own value."""
        return value


class TestMeasure:
    def test_figures_on_a_fake_group(self) -> None:
        """All-reduce at 14 KB x T, eager and in a graph, and the logits all-gather, as figures."""
        group = FakeGroup()
        figs = measure.measure_figures(group, tokens=(1, 17), gather_tokens=(1,), reps=3, warmup=1, trials=1)
        assert [(f["op"], f["graph"]) for f in figs] == [("all-reduce", False), ("all-reduce", True), ("all-gather", True)]
        eager = figs[0]["points"]
        assert [m for m, _ in eager] == [14336, 17 * 14336] and eager[0][1] == pytest.approx(10 + 14)
        assert figs[1]["points"][0][1] == pytest.approx(eager[0][1] - 2)
        assert all(f["gpus"] == 4 for f in figs)

    def test_without_graphs_only_eager(self) -> None:
        """A group without CUDA graphs (CPU) measures eager only."""
        figs = measure.measure_figures(FakeGroup(graphs=False), tokens=(1,), gather_tokens=(1,), reps=1, warmup=0,
                                       trials=1)
        assert {f["graph"] for f in figs} == {False}

    def test_torch_fake_backend(self) -> None:
        """The torch.distributed path itself on torch's fake backend: figures come back, the result loads."""
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=8)
        try:
            group = measure.TorchGroup.current()
            assert (group.world, group.graphs) == (8, False)
            figs = measure.measure_figures(group, tokens=(1, 2), gather_tokens=(1,), reps=2, warmup=1, trials=1)
        finally:
            dist.destroy_process_group()
        out = measure.result(figs, box={"gpus": 8}, fabric="pcie-gen5", nccl=None,
                             environ={"NCCL_P2P_LEVEL": "SYS", "PATH": "/bin"})
        assert out["nccl_env"] == {"NCCL_P2P_LEVEL": "SYS"} and out["kind"] == "repro-topology-measure"
        fab = with_measured(TABLE.fabrics["pcie-gen5"], json.loads(json.dumps(out)), "x.json")
        assert fab.all_reduce(14336, graph=False)[0] == pytest.approx(figs[0]["points"][0][1])

    def test_measure_needs_two_gpus(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """--measure on a box of fewer than two GPUs: one line, exit 1."""
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        assert cli.main(["topology", "--measure"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--measure needs 2 or more local GPUs; GPUs: 0" in err

    def test_measure_runs_ranks_on_loopback(self, capsys, monkeypatch, tmp_path: Path) -> None:
        """--measure on a (fake) 8-GPU box: the figures of run_local become the JSON, NCCL_* recorded."""
        from verify.fake_stack import fake_nvidia_smi

        fixtures = Path(__file__).parents[1] / "fixtures"
        fake_nvidia_smi(monkeypatch, tmp_path / "bin", fixtures / "doctor" / "pro6000x8.csv",
                        fixtures / "topology" / "pro6000x8-pcie.txt")
        monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
        seen = {}

        def fake_run_local(gpus: int, options: dict) -> dict:
            seen["gpus"] = gpus
            return {"figures": measure.measure_figures(FakeGroup(gpus), tokens=(1,), gather_tokens=(1,), reps=1,
                                                       warmup=0, trials=1), "nccl": [2, 27, 7]}

        monkeypatch.setattr(measure, "run_local", fake_run_local)
        out = tmp_path / "m.json"
        assert cli.main(["topology", "--measure", "-o", str(out)]) == 0
        result = json.loads(out.read_text())
        assert seen["gpus"] == 8 and result["fabric"] == "pcie-gen5" and result["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
        assert "wrote" in capsys.readouterr().out
        assert cli.main(["topology", "--predict", "k26-pro6000-tp8", "--collectives", str(out), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["collectives_measured"] == str(out)

    def test_rendezvous_is_loopback_only(self) -> None:
        """The ranks meet on 127.0.0.1 (a free local port), never another interface."""
        assert 0 < measure.free_port() < 65536
        assert "tcp://127.0.0.1:" in Path(measure.__file__).read_text()

    def test_two_gpus_missing_is_a_repro_error(self, monkeypatch) -> None:
        """The error type is ReproError (exit 1), not a usage error."""
        import argparse

        import repro.topology as topo
        from repro.topology import detect

        monkeypatch.setattr(detect, "local_box", lambda: detect.Box(1, "single", names=("NVIDIA H200",)))
        args = argparse.Namespace(measure=True, reps=1, output=None)
        with pytest.raises(ReproError, match="GPUs: 1"):
            topo.main(args)


class TestShares:
    def test_ep8_share_is_tp8s_bytes_in_whole_experts(self) -> None:
        """48 x 2048 = 384 x 256: the same expert columns a GPU, whole instead of sliced."""
        tp, ep = shares.load_share("k26-tp8"), shares.load_share("k26-ep8")
        assert (tp.experts_local, tp.width, ep.experts_local, ep.width) == (384, 256, 48, 2048)
        assert tp.experts_local * tp.width == ep.experts_local * ep.width
        assert (ep.experts_global, ep.ranks, ep.ep, tp.ep) == (384, 8, True, False)

    def test_local_mapping_masks_other_ranks(self) -> None:
        """Rank r keeps ids [48 r, 48 r + 48) shifted to 0..47; every other id is -1 (SGLang's mapping)."""
        ids = np.array([[0, 47, 48, 100, 383]])
        assert shares.ep_local_ids(ids, 0, 48).tolist() == [[0, 47, -1, -1, -1]]
        assert shares.ep_local_ids(ids, 2, 48).tolist() == [[-1, -1, -1, 4, -1]]
        assert shares.ep_local_ids(ids, 7, 48).tolist() == [[-1, -1, -1, -1, 47]]

    def test_most_loaded_rank(self) -> None:
        """The rank with most pairs; ties go to the one with more distinct experts."""
        ids = np.array([[50, 50, 51, 0], [52, 1, 1, 1]])  # rank 1: 4 pairs, 3 experts; rank 0: 4 pairs, 2 experts
        assert shares.most_loaded_rank(ids, 384, 8) == 1

    def test_share_ids_record_what_the_gpu_reads(self) -> None:
        """EP: the loaded rank's experts, pairs and share of all pairs; TP: every expert picked."""
        ep = shares.load_share("k26-ep8")
        ids = shares.routed_ids(ep, 17, "skewed", 0)
        local, info = shares.share_ids(ep, ids)
        assert (local >= 0).sum() == info["pairs"] and info["experts"] <= 48
        assert info["rank_share"] == pytest.approx(info["pairs"] / ids.size) and info["rank_share"] >= 1 / 8
        _, tp_info = shares.share_ids(shares.load_share("k26-tp8"), ids)
        assert tp_info["pairs"] == ids.size and tp_info["experts"] == info["experts_all"]

    def test_planted_routing_is_the_planted_router(self) -> None:
        """The planted spread routes each token by its column's top-8 of the planted router."""
        from repro.testmodels.plant import router_weight

        ids = spread.routing("planted", 3, 384, 8, 0)
        tops = router_weight(1, 1, 384, 7168).topk(8, dim=0).indices.T.numpy()
        cols = np.random.default_rng(0).permutation(7168)[:3]
        assert (np.sort(ids, axis=1) == np.sort(tops[cols], axis=1)).all()
