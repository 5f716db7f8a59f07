"""Tests for `repro.serving.profiles`: the shipped profiles and thresholds, and every validation error."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.serving.profiles import Profile, get_profile, load_profiles, model_path, models_dir
from repro.serving.thresholds import load_thresholds
from repro.stack.pins import load_stack
from verify.fake_sglang import write_profiles

KIMI_DEPLOYMENTS = ("k26-b300-tp8", "k26-b300-ep8", "k26-pro6000-ep8", "k26-pro6000-tp8",
                    "k26-h200-tp8")


def _load_one(tmp_path: Path, **overrides: object) -> Profile:
    path = write_profiles(tmp_path / "p.toml", {"one": overrides})
    return load_profiles(path)["one"]


class TestShippedProfiles:
    def test_the_kimi_deployments_are_shipped(self) -> None:
        """Every Kimi K2.6 deployment is a profile of the packaged file."""
        assert set(KIMI_DEPLOYMENTS) <= set(load_profiles())

    def test_pro6000_profiles_are_sm120_over_pcie(self) -> None:
        """The RTX PRO 6000 deployments target sm120 and are judged with the PCIe thresholds."""
        for name in ("k26-pro6000-ep8", "k26-pro6000-tp8"):
            p = get_profile(name)
            assert (p.target, p.interconnect, p.thresholds) == ("sm120", "pcie", "k26-pcie")

    def test_ep8_means_tp8_attention_with_ep8_experts(self) -> None:
        """An EP8 profile keeps tp 8 and sets ep 8, as DFLASH forbids DP attention."""
        p = get_profile("k26-b300-ep8")
        assert (p.tp, p.ep) == (8, 8)

    def test_test_profiles_cover_tp1_tp2_and_ep2_on_one_moe_model(self) -> None:
        """The H200 test profiles include TP1, TP2 and a TP2/TP2+EP2 pair on the same MoE model."""
        profiles = load_profiles()
        assert profiles["test-h200-tp1"].tp == 1 and profiles["test-h200-tp2"].tp == 2
        tp, ep = profiles["test-h200-moe-tp2"], profiles["test-h200-moe-ep2"]
        assert (tp.model, tp.tp, tp.ep) == (ep.model, 2, 1) and ep.ep == 2

    def test_attention_backends_default_from_the_stack_target(self) -> None:
        """A profile without backends takes its SM target's from stack.toml."""
        target = load_stack().targets["sm100"]
        p = get_profile("k26-b300-tp8")
        assert (p.attention_backend, p.draft_attention_backend) == (
            target.attention_backend, target.draft_attention_backend)

    def test_every_profile_names_an_existing_threshold_set(self) -> None:
        """Each shipped profile's thresholds key names a set of thresholds.toml."""
        sets = load_thresholds()
        assert all(p.thresholds in sets for p in load_profiles().values())


class TestProfileErrors:
    @pytest.mark.parametrize(("overrides", "message"), [
        ({"tpp": 2}, r"profile 'one': key 'tpp' is not a known key"),
        ({"tp": 0}, r"key 'tp' must be an integer >= 1 \(got 0\)"),
        ({"tp": "8"}, r"key 'tp' must be int \(got '8'\)"),
        ({"tp": 8, "ep": 3}, r"key 'ep' must divide tp=8 \(got 3\)"),
        ({"tp": 8, "ep": 4, "moe-a2a-backend": "deepep"}, r"key 'ep' must equal tp=8"),
        ({"budget": None}, r"key 'budget' or 'budget-schedule' \(one of them\) is required when algorithm is DDTREE"),
        ({"budget-schedule": {"1": 8}}, r"key 'budget' or 'budget-schedule' \(one of them\) is required"),
        ({"budget": None, "budget-schedule": {"4": 8}}, r"key 'budget-schedule' is not a budget schedule: .*from 1"),
        ({"budget": None, "budget-schedule": "1:8,1:4"}, r"key 'budget-schedule' is not a budget schedule"),
        ({"budget": None, "budget-schedule": 8}, r"key 'budget-schedule' must be dict or str"),
        ({"budget": -1}, r"key 'budget' must be an integer >= 0 \(got -1\)"),
        ({"drafter": None, "algorithm": "DFLASH"}, r"key 'drafter' is required when algorithm"),
        ({"algorithm": "EAGLE"}, r"key 'algorithm' must be one of AR, DFLASH, DDTREE"),
        ({"target": "sm75"}, r"key 'target' must be one of sm90, sm100, sm120 \(got 'sm75'\)"),
        ({"thresholds": "nope"}, r"key 'thresholds' must name a \[sets\.\*\] table"),
        ({"cuda-graph-bs": [4, 2]}, r"key 'cuda-graph-bs' must be ascending distinct"),
        ({"cuda-graph-max-tokens": 0}, r"key 'cuda-graph-max-tokens' must be an integer >= 1"),
        ({"tokenizer": "hf"}, r"key 'tokenizer' must be one of model, none"),
        ({"port": 70000}, r"key 'port' must be in 1\.\.65535"),
        ({"sglang": {"tp-size": 2}},
         (r"key 'sglang\.tp-size' sets or abbreviates --tp-size, which repro sets itself "
          r"\(set it with the profile key 'tp'\)")),
        ({"sglang": {"x": {"y": 1}}}, r"key 'sglang\.x' must be a string, number, boolean or list"),
        ({"env": {"A": 1}}, r"key 'env\.A' must be a string \(got 1\)"),
        ({"model": None}, r"key 'model' is required"),
    ])
    def test_bad_key_is_one_line_naming_it(self, tmp_path: Path, overrides: dict,
                                           message: str) -> None:
        """A malformed profile raises one UsageError line naming file, profile and key."""
        with pytest.raises(UsageError, match=message) as info:
            _load_one(tmp_path, **overrides)
        assert "\n" not in str(info.value) and str(tmp_path / "p.toml") in str(info.value)

    def test_invalid_toml_names_the_file(self, tmp_path: Path) -> None:
        """A file that is not TOML is reported with its path."""
        path = tmp_path / "bad.toml"
        path.write_text("[profiles.x\n")
        with pytest.raises(UsageError, match=r"bad\.toml is not valid TOML"):
            load_profiles(path)

    def test_unknown_profile_name_lists_the_known_ones(self) -> None:
        """get_profile on an unknown name lists every known profile."""
        with pytest.raises(UsageError, match=r"PROFILE must be one of k26-b300-tp8, .* \(got 'x'\)"):
            get_profile("x")


class TestProfile:
    def test_with_algorithm_ar_drops_the_budget(self, tmp_path: Path) -> None:
        """Switching a DDTREE profile to AR clears its budget."""
        p = _load_one(tmp_path).with_algorithm("ar")
        assert (p.algorithm, p.budget, p.label) == ("AR", None, "AR")

    def test_with_algorithm_ddtree_keeps_or_replaces_the_budget(self, tmp_path: Path) -> None:
        """DDTREE keeps the profile's budget unless one is given."""
        p = _load_one(tmp_path, budget=8)
        assert p.with_algorithm("DDTREE").budget == 8
        assert p.with_algorithm("DDTREE", 64).label == "DDTREE B=64"

    def test_a_schedule_replaces_the_budget(self, tmp_path: Path) -> None:
        """A budget-schedule table is read, served, labelled and sized per batch size; with_algorithm
        switches between a budget and a schedule, and a stored profile rebuilds the same."""
        p = _load_one(tmp_path, budget=None, **{"budget-schedule": {"1": 63, "4": 31, "16": 15},
                                                 "cuda-graph-bs": [1, 2, 4, 8, 16], "cuda-graph-max-tokens": 200})
        assert (p.budget, p.budget_schedule, p.label) == (None, "1:63,4:31,16:15", "DDTREE S=1:63,4:31,16:15")
        assert p.graph_bs == (1, 2, 4)  # 8 x 32 and 16 x 16 tokens pass 200 no longer
        assert p.with_algorithm("DDTREE").budget_schedule == p.budget_schedule
        assert p.with_algorithm("DDTREE", 8).label == "DDTREE B=8"
        assert p.with_algorithm("DDTREE", schedule='{"1": 7}').label == "DDTREE S=1:7"
        assert p.with_algorithm("DFLASH").schedule is None
        assert Profile.from_dict(p.to_dict()) == p
        with pytest.raises(UsageError, match=r"DDTREE budget schedule: .*integer"):
            p.with_algorithm("DDTREE", schedule="1:x")

    def test_with_algorithm_needs_a_drafter_for_speculation(self, tmp_path: Path) -> None:
        """An AR-only profile cannot be switched to DFLASH."""
        p = _load_one(tmp_path, algorithm="AR", budget=None, drafter=None)
        with pytest.raises(UsageError, match=r"DFLASH needs a 'drafter' key"):
            p.with_algorithm("DFLASH")

    def test_to_dict_round_trips(self) -> None:
        """from_dict(to_dict()) rebuilds an equal profile (results files store profiles so)."""
        p = get_profile("test-h200-moe-ep2")
        assert Profile.from_dict(p.to_dict()) == p


class TestThresholds:
    def test_every_shipped_bound_has_a_source(self) -> None:
        """Each shipped set gives a source for every metric it bounds."""
        for tset in load_thresholds().values():
            assert not tset.tau_floor or tset.tau_source
            assert not tset.speedup_floor or tset.speedup_source
            has_ratio = tset.tp_over_ep_min is not None or tset.tp_over_ep_max is not None
            assert not has_ratio or tset.tp_over_ep_source

    def test_k26_tp_over_ep_bounds_are_marked_predicted(self) -> None:
        """The k26 TP/EP bounds come from the cost model and say so (verify/cpu/test_topology_thresholds.py
        checks their values); the reported 26 / 65 observation is not a bound."""
        for name in ("k26-pcie", "k26-nvlink"):
            tset = load_thresholds()[name]
            assert tset.tp_over_ep_source.startswith("predicted, not measured")
            assert tset.tp_over_ep_min is not None and tset.tp_over_ep_max is not None
            assert not tset.tp_over_ep_min <= 26 / 65 <= tset.tp_over_ep_max

    def test_at_budget_is_read_and_optional(self, tmp_path: Path) -> None:
        """`at.budget` names DDTREE's judged budget; without it the set leaves it to the profile."""
        path = tmp_path / "t.toml"
        path.write_text("[sets.a]\nat = { budget = 31 }\n[sets.b]\n")
        sets = load_thresholds(path)
        assert (sets["a"].at_budget, sets["b"].at_budget) == (31, None)

    def test_stats_table_is_left_to_its_owner(self, tmp_path: Path) -> None:
        """A [stats] table next to the sets is accepted and not validated here."""
        path = tmp_path / "t.toml"
        path.write_text('[stats]\nalpha = 0.001\n[sets.a]\n[sets.a.tau-floor]\nDDTREE = 2\n'
                        'source = "s"\n')
        assert load_thresholds(path)["a"].tau_floor == {"DDTREE": 2.0}

    @pytest.mark.parametrize(("text", "message"), [
        ("[sets.a.tau-floor]\nDDTREE = 2\n", r"set 'a'\.tau-floor: key 'source' is required"),
        ('[sets.a.tau-floor]\nEAGLE = 2\nsource = "s"\n', r"key 'EAGLE' is not a known key"),
        ('[sets.a.tp-over-ep]\nmin = "1"\nsource = "s"\n', r"key 'min' must be int or float"),
        ("[sets.a]\nat = { concurrency = 0 }\n", r"key 'concurrency' must be an integer >= 1"),
        ("[sets.a]\nat = { budget = 0 }\n", r"key 'budget' must be an integer >= 1"),
        ('"\\n" = 1\n', r"key '\\n' is not a known key"),  # a quoted key with a newline: shown escaped
    ])
    def test_bad_threshold_set_is_one_line(self, tmp_path: Path, text: str, message: str) -> None:
        """A malformed threshold set raises one UsageError line naming the key."""
        path = tmp_path / "t.toml"
        path.write_text(text)
        with pytest.raises(UsageError, match=message) as err:
            load_thresholds(path)
        assert "\n" not in str(err.value)


class TestModelPaths:
    def test_models_dir_prefers_the_argument_then_the_environment(self, monkeypatch) -> None:
        """--models-dir wins over $REPRO_MODELS_DIR, which wins over ./models."""
        monkeypatch.setenv("REPRO_MODELS_DIR", "/env/models")
        assert models_dir("/arg") == Path("/arg")
        assert models_dir() == Path("/env/models")
        monkeypatch.delenv("REPRO_MODELS_DIR")
        assert models_dir() == Path("models")

    def test_model_path_keeps_absolute_paths(self) -> None:
        """An absolute model value is used as given; a relative one goes under the root."""
        assert model_path("/abs/m", Path("/root")) == Path("/abs/m")
        assert model_path("m", Path("/models")) == Path("/models/m")
