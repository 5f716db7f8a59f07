"""CPU tests of the experiment rows (verify/device/rows.py, experiments.toml) and the commands each
kind builds (verify/device/steps.py); nothing here starts a GPU process."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.schedule import BudgetSchedule
from repro.serving.profiles import load_profiles
from repro.testmodels.configs import read_model
from verify.device import experiment
from verify.device.rows import KINDS, load_rows
from verify.device.runner import environment, paths_from_env
from verify.device.steps import build_steps

PATHS = dataclasses.replace(paths_from_env({}), python="python3")
ROWS = load_rows()


def _rows(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "experiments.toml"
    path.write_text(text)
    return load_rows(path)


def _steps(name: str) -> list:
    return build_steps(ROWS[name], PATHS, ROWS)


@pytest.mark.parametrize("name", list(ROWS))
def test_every_shipped_row_builds_its_commands_and_files(name):
    """Each row of experiments.toml builds at least one command, and every file it writes first
    (profile variants, prompts) is produced and, for profiles, read back as repro bench reads it."""
    steps = _steps(name)
    assert steps
    assert len({s.name for s in steps}) == len(steps)
    for step in steps:
        for write in step.writes:
            text = write.text()
            assert text
            if write.path.name == "profiles.toml":
                assert set(tomllib.loads(text)["profiles"]) >= set(load_profiles())
    assert {row.kind for row in ROWS.values()} == set(KINDS)


def test_the_runs_under_way_have_their_rows():
    """The schedule runs and the API tier are rows with the grids they were started with; the qwen3-8b
    grid serves, beside its schedule and DFLASH, every budget the schedule routes to as a fixed server
    (so `repro tune` fits and checks them on one call's cells and recording)."""
    side = ROWS["schedule-qwen3-8b-side"]
    routed = {b for s in side.get("schedules") for b in BudgetSchedule.parse(s).distinct}
    assert routed <= set(side.get("budgets")) and side.get("algorithms") == ["DFLASH", "DDTREE"]
    assert side.get("side-by-side") and side.get("concurrency") == [1, 4, 16]
    k26, below = ROWS["schedule-k26-tp8"], ROWS["budgets-k26-tp8"]
    assert (k26.get("profiles"), k26.get("budgets"), k26.get("schedules"), k26.get("concurrency")) == (
        ["full-h200-k26-tp8"], None, ["1:7,4:16"], [1, 16])
    assert not k26.get("side-by-side") and k26.get("num-prompts") == 32 and k26.get("temperatures") == [0]
    assert (below.get("algorithms"), below.get("budgets"), below.get("schedules")) == (["DDTREE"], [11], [])
    assert {k: below.get(k) for k in ("profiles", "concurrency", "num-prompts", "prompts", "temperatures")} == {
        k: k26.get(k) for k in ("profiles", "concurrency", "num-prompts", "prompts", "temperatures")}
    assert ROWS["api-tier"].get("tests") == ["verify/sglang/test_api.py", "verify/cpu/test_profiles_kimi.py"]


def test_every_tune_row_fits_and_checks_budgets_its_grid_measured():
    """A tune row's fit and held-out budgets are budgets its source bench serves (else it has nothing to
    fit or check), and a source that records its rounds gives it tau(B)."""
    for row in (r for r in ROWS.values() if r.kind == "tune"):
        source = ROWS[row.get("results-from")]
        assert set(row.get("fit")) | set(row.get("holdout", [])) <= set(source.get("budgets")), row.name
        assert source.get("record"), row.name


@pytest.mark.parametrize(("text", "problem"), [
    ('[experiments.a]\nkind = "bench"\n', "key 'about' is required"),
    ('[experiments.a]\nkind = "nope"\nabout = "x"\n', "key 'kind' must be one of setup"),
    ('[experiments.a]\nkind = "cost"\nabout = "x"\ntarget = "qwen3-8b"\nbudgets = [1]\n',
     "key 'budgets' does not apply to kind 'cost'"),
    ('[experiments.a]\nkind = "bench"\nabout = "x"\nprofiles = ["p"]\nbudgets = [-1]\n',
     "key 'budgets' must be a non-empty list of integers >= 0 (got [-1])"),
    ('[experiments.a]\nkind = "bench"\nabout = "x"\nprofiles = ["p"]\nschedules = ["1:x"]\n',
     "key 'schedules' must be a list of budget schedules"),
    ('[experiments.a]\nkind = "bench"\nabout = "x"\nprofiles = ["p"]\nbogus = 1\n', "key 'bogus' is not a known key"),
    ('[experiments.a]\nkind = "bench"\nabout = "x"\n', "key 'profiles' is required for kind 'bench'"),
    ('[experiments.a]\nkind = "bench"\nabout = "x"\nprofiles = ["p"]\nside-by-side = true\n',
     "key 'kv-cap' is required with side-by-side"),
    ('[experiments.a]\nextends = "b"\nabout = "x"\n[experiments.b]\nextends = "a"\nabout = "y"\n',
     "key 'extends' makes a cycle"),
    ('[experiments.a]\nextends = "c"\nabout = "x"\n', "key 'extends' names no experiment"),
    (('[experiments.a]\nkind = "tune"\nabout = "x"\nprofiles = ["p"]\nresults-from = "b"\n'
      '[experiments.b]\nkind = "cost"\nabout = "y"\ntarget = "qwen3-8b"\n'), "key 'results-from' must name a bench"),
    ('[experiments."a b"]\nkind = "doctor"\nabout = "x"\n', "name must be letters"),
    ("[other]\n", "must hold [experiments.NAME] tables only"),
])
def test_a_bad_row_is_one_error_naming_the_row_and_key(tmp_path, text, problem):
    """Each mistake is one UsageError naming the file, the experiment and the key."""
    with pytest.raises(UsageError) as exc:
        _rows(tmp_path, text)
    assert problem in str(exc.value)
    assert "\n" not in str(exc.value)
    if "experiments.NAME" not in problem:
        assert "experiment 'a" in str(exc.value)


def test_extends_copies_the_other_rows_keys_and_overrides_them(tmp_path):
    """A row that extends another takes its keys, its own winning (``about`` is its own)."""
    rows = _rows(tmp_path, '[experiments.a]\nkind = "cost"\nabout = "x"\ntarget = "qwen3-8b"\nbatch-sizes = [1]\n'
                           '[experiments.b]\nextends = "a"\nabout = "y"\ntarget = "k26-tp8"\n')
    assert (rows["b"].kind, rows["b"].about, rows["b"].get("target"), rows["b"].get("batch-sizes")) == (
        "cost", "y", "k26-tp8", [1])


def test_a_bad_profile_variant_is_one_error_naming_the_experiment(tmp_path):
    """A variant that sets a flag repro owns, or names no profile, fails when its file is built."""
    rows = _rows(tmp_path, '[experiments.a]\nkind = "bench"\nabout = "x"\nprofiles = ["test-h200-tp1"]\n'
                           'profile-variants = { test-h200-tp1 = { sglang = { port = 1 } } }\n'
                           '[experiments.b]\nextends = "a"\nabout = "y"\n'
                           'profile-variants = { nope = { sglang = { page-size = 2 } } }\n')
    for name, problem in (("a", "sglang.port"), ("b", "changes no profile")):
        (write,) = build_steps(rows[name], PATHS, rows)[0].writes
        with pytest.raises(UsageError, match=problem) as exc:
            write.text()
        assert f"experiment '{name}'" in str(exc.value)


def test_side_by_side_bench_interleaves_and_caps_every_servers_kv_cache(tmp_path):
    """A side-by-side bench runs --interleave with --profile-file naming the packaged profiles whose
    KV caches are capped (and nothing else changed), resumes, and records DDTREE's paths."""
    (step,) = _steps("side-qwen3-8b-l")
    argv = step.argv
    assert "--interleave" in argv and "--resume" in argv
    out = "build/experiments/side-qwen3-8b-l"
    assert argv[argv.index("--profile-file") + 1] == f"{out}/profiles.toml"
    assert argv[argv.index("-o") + 1] == f"{out}/results.jsonl"
    assert argv[argv.index("--budgets") + 1] == "16,32" and argv[argv.index("--temperatures") + 1] == "0"
    assert step.command()[-2:] == ("--time-limit", "520")
    assert step.env == {"REPRO_DDTREE_RECORD": f"{out}/recording.jsonl", "REPRO_DDTREE_RECORD_PROMPTS": "humaneval-distinct"}
    (write,) = step.writes
    path = tmp_path / "profiles.toml"
    path.write_text(write.text())
    capped, packaged = load_profiles(path), load_profiles()
    assert capped["full-h200-qwen3-8b"].sglang == {**packaged["full-h200-qwen3-8b"].sglang, "max-total-tokens": 24576}
    assert {k: v for k, v in capped.items() if k != "full-h200-qwen3-8b"} == {
        k: v for k, v in packaged.items() if k != "full-h200-qwen3-8b"}


def test_a_derived_profile_keeps_its_base_and_adds_the_variant(tmp_path):
    """round-ab's eager copy of test-h200-tp1 keeps the hook's env and adds the eager commit; both capped."""
    (step,) = _steps("round-ab")
    variant = next(w for w in step.writes if w.path.name == "profiles.toml")
    path = tmp_path / "profiles.toml"
    path.write_text(variant.text())
    profiles = load_profiles(path)
    base, eager = profiles["test-h200-tp1"], profiles["test-h200-tp1-eager"]
    assert eager.env == {**load_profiles()["test-h200-tp1"].env, "SGLANG_DDTREE_COMMIT_GRAPHS": "0"}
    assert base.sglang["max-total-tokens"] == eager.sglang["max-total-tokens"] == 65536
    prompts = next(w for w in step.writes if w.path.name == "prompts.jsonl")
    assert len(prompts.text().splitlines()) == 8


def test_sequential_bench_starts_one_server_at_a_time_with_the_packaged_profiles():
    """Without side-by-side: no --interleave, no profile file, the bench's own margin to its timeout."""
    (step,) = _steps("schedule-k26-tp8")
    assert "--interleave" not in step.argv and "--profile-file" not in step.argv
    assert step.argv[step.argv.index("--schedules") + 1] == "1:7,4:16"
    assert "--request-rate" not in step.argv
    assert step.time_limit == 450


def test_busy_runs_side_by_side_in_one_process_or_each_algorithm_alone():
    """Side by side: one decode_busy with every label and the KV cap; else one process per algorithm."""
    (together,) = _steps("busy-qwen3-8b-host")
    argv = together.argv
    assert argv[argv.index("--algorithm") + 1:argv.index("--concurrency")] == ("DFLASH", "DDTREE-B63", "DDTREE-B16")
    assert argv[argv.index("--max-total-tokens") + 1] == "65536"
    alone = _steps("round-host")
    assert [s.argv[s.argv.index("--algorithm") + 1] for s in alone] == ["DDTREE", "DFLASH", "AR"]
    assert all("--with-stack" in s.argv and "--max-total-tokens" not in s.argv for s in alone)


def test_cost_takes_the_model_tables_memory_fraction():
    """verify_cost runs at the mem-fraction-static of repro/data/models/NAME.toml."""
    for name in ("cost-qwen3-8b", "cost-k26-tp8"):
        (step,) = _steps(name)
        target = ROWS[name].get("target")
        want = read_model(target, ("budget",))["budget"]["mem-fraction-static"]
        assert step.argv[step.argv.index("--mem-fraction-static") + 1] == str(want)
        assert step.argv[3] == str(PATHS.models / target)


def test_greedy_runs_one_pytest_per_selected_test_id():
    """Each selected algorithm is one pytest -k NAME-ALGORITHM with its own junit file."""
    steps = _steps("greedy-k26-tp8")
    assert [s.argv[s.argv.index("-k") + 1] for s in steps] == ["k26-tp8-AR", "k26-tp8-DDTREE"]
    assert steps[0].argv[-1] == "--junitxml=build/experiments/greedy-k26-tp8/junit-greedy-k26-tp8-AR.xml"


def test_parallel_pytest_runs_each_module_at_once_with_its_own_output():
    """round-tiers: one process per module in one group, each its own REPRO_E2E_OUT and junit file."""
    steps = _steps("round-tiers")
    assert len(steps) == 5 and {s.group for s in steps} == {"tests"}
    assert steps[0].env == {"REPRO_E2E_OUT": "build/experiments/round-tiers/test_sglang_kernels"}
    (one,) = _steps("api-tier")
    assert one.group is None and one.argv[3:5] == ("verify/sglang/test_api.py", "verify/cpu/test_profiles_kimi.py")


def test_tune_and_report_read_the_rows_they_name_and_always_run():
    """tune reads its bench row's results and recording; report each input's file; both rerun each time."""
    (tune,) = _steps("tune-k26-tp8")
    src = "build/experiments/bench-k26-tp8"
    assert tune.argv[tune.argv.index("--results") + 1] == f"{src}/results.jsonl"
    assert tune.argv[tune.argv.index("--recording") + 1] == f"{src}/recording.jsonl"
    (report,) = _steps("report-full-k26-tp8")
    assert report.argv[4:] == (f"{src}/results.jsonl", "build/experiments/tune-k26-tp8/tune/tune.jsonl",
                               "--verify-cost", "build/experiments/cost-k26-tp8/verify_cost_k26-tp8.json",
                               "-o", "build/experiments/report-full-k26-tp8/report")
    assert tune.rerun and report.rerun


def test_doctor_checks_a_pristine_site_of_its_own():
    """The doctor row installs into SITE-pristine, never the experiments' site, and the first
    doctor (before the patch) is recorded, not judged."""
    steps = {s.name: s for s in _steps("doctor")}
    pristine = f"{PATHS.site}-pristine"
    assert steps["install"].argv[-2:] == ("--site", pristine)
    assert steps["doctor"].env == {"PYTHONPATH": pristine}
    assert not steps["doctor-pristine"].must_pass and steps["doctor-json"].err == "doctor.err"


def test_module_arguments_name_the_rows_folder():
    """{dir} and {models} in a module row's args become the row's folder and the models folder."""
    (step,) = _steps("round-served")
    assert step.argv[-4:] == ("--models", str(PATHS.models), "--out", "build/experiments/round-served")


def test_show_prints_the_setup_then_the_rows_commands(capsys):
    """show: the setup's three commands, the files written, then the bench, all with their logs."""
    assert experiment.main(["show", "round-ab"]) == 0
    out = capsys.readouterr().out.splitlines()
    commands = [line for line in out if not line.startswith("#")]
    assert [c.split()[3] for c in commands[:3]] == ["install-offline", "patch", "testmodels"]
    assert "--interleave" in commands[3] and commands[3].endswith("> build/experiments/round-ab/bench.log")
    assert sum(line.startswith("# writes build/experiments/round-ab/") for line in out) == 2


def test_list_names_every_row_and_an_unknown_name_is_exit_2(capsys):
    """list prints one line per row; show or run of an unknown row is one line and exit 2."""
    assert experiment.main(["list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(ROWS)
    assert experiment.main(["run", "no-such-row"]) == 2
    assert "no experiment 'no-such-row'" in capsys.readouterr().err


def test_a_confirming_tune_row_serves_its_picks_as_its_grid_served_its_budgets():
    """``confirm = true``: repro tune measures the budgets it recommends that the grid lacks, at the grid's
    concurrencies, prompts, lengths and warm-up, on the grid's profile file (its KV cap and variants), and in
    waves of c requests when the grid ran side by side (a wave ends with its slowest request)."""
    row = ROWS["tune-check-qwen3-8b"]
    grid = ROWS[row.get("results-from")]
    argv = _steps("tune-check-qwen3-8b")[0].argv

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert row.get("confirm") and "--confirm" in argv
    assert (flag("--concurrency"), flag("--prompts"), flag("--num-prompts"), flag("--warmup")) == (
        "1,4,16", grid.get("prompts"), str(grid.get("num-prompts")), str(grid.get("warmup")))
    assert Path(flag("--profile-file")) == PATHS.dir(grid) / "profiles.toml"
    assert grid.get("side-by-side") and "--interleave" in argv  # waves of c, as the grid's cells ran
    assert "--confirm" not in _steps("tune-k26-tp8")[0].argv
    # it starts servers, so it runs on the installed SGLang (the 12-06 device run found its servers without it)
    site = str(PATHS.site.resolve())
    assert row.stack and environment(row, PATHS, {})["PYTHONPATH"].split(os.pathsep)[0] == site
    assert not ROWS["tune-k26-tp8"].stack and site not in environment(ROWS["tune-k26-tp8"], PATHS, {})["PYTHONPATH"]
