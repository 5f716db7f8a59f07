"""Tests for `repro.serving.sglang_server`: the server command line, pre-flight checks and the process life
cycle, driven against the fake SGLang server of verify/fake_sglang.py."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from repro.errors import ReproError, UsageError
from repro.serving.profiles import Profile, load_profiles
from repro.serving.sglang_server import SGLangServer, check_models, free_port, log_tail, port_is_free, server_argv, server_env
from verify.fake_sglang import REPO, make_models, write_profiles


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A fake models directory."""
    return make_models(tmp_path / "models")


@pytest.fixture(autouse=True)
def _importable(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def _profile(tmp_path: Path, **overrides: object) -> Profile:
    return load_profiles(write_profiles(tmp_path / "p.toml", {"fake": overrides}))["fake"]


def _flag_values(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    values = []
    for token in argv[i + 1:]:
        if token.startswith("--"):
            break
        values.append(token)
    return values


class TestServerArgv:
    def test_ddtree_profile_gives_speculative_flags_and_loopback(self, tmp_path: Path) -> None:
        """A DDTREE profile serves on 127.0.0.1 with the drafter, the budget and both backends."""
        argv = server_argv(load_profiles()["test-h200-tp1"], 31000, Path("/m"), python="py")
        assert argv[:3] == ["py", "-m", "sglang.launch_server"]
        assert _flag_values(argv, "--host") == ["127.0.0.1"]
        assert _flag_values(argv, "--model-path") == ["/m/planted"]
        assert _flag_values(argv, "--speculative-algorithm") == ["DDTREE"]
        assert _flag_values(argv, "--speculative-draft-model-path") == ["/m/dflash"]
        assert _flag_values(argv, "--speculative-ddtree-budget") == ["32"]
        assert _flag_values(argv, "--attention-backend") == ["triton"]
        assert _flag_values(argv, "--cuda-graph-bs-decode") == ["1", "2", "4", "8", "16"]
        assert "--skip-tokenizer-init" in argv and "--ep-size" not in argv

    def test_ar_has_no_speculative_flags(self, tmp_path: Path) -> None:
        """AR runs the target alone."""
        argv = server_argv(_profile(tmp_path).with_algorithm("AR"), 1, Path("/m"))
        assert not [a for a in argv if a.startswith("--speculative")]

    def test_dflash_has_no_budget(self, tmp_path: Path) -> None:
        """DFLASH names its drafter but no DDTree budget."""
        argv = server_argv(_profile(tmp_path).with_algorithm("DFLASH"), 1, Path("/m"))
        assert "--speculative-ddtree-budget" not in argv
        assert _flag_values(argv, "--speculative-algorithm") == ["DFLASH"]

    def test_a_schedule_is_served_instead_of_a_budget(self, tmp_path: Path) -> None:
        """A DDTREE schedule goes to SGLang as --speculative-ddtree-budget-schedule, alone."""
        argv = server_argv(_profile(tmp_path).with_algorithm("DDTREE", schedule="1:63,16:15"), 1, Path("/m"))
        assert _flag_values(argv, "--speculative-ddtree-budget-schedule") == ["1:63,16:15"]
        assert "--speculative-ddtree-budget" not in argv

    def test_graph_max_tokens_drops_the_batch_sizes_a_budgets_verify_outgrows(self, tmp_path: Path) -> None:
        """cuda-graph-max-tokens keeps DDTREE's graphs to bs x (B + 1) <= it (k26-tp8's B 512 at
        bs 16 did not fit); larger batches run eager, and AR / DFLASH keep every size."""
        p = _profile(tmp_path, **{"cuda-graph-bs": [1, 2, 4, 8, 16], "cuda-graph-max-tokens": 4112})
        graphs = {b: _flag_values(server_argv(p.with_algorithm("DDTREE", b), 1, Path("/m")), "--cuda-graph-bs-decode")
                  for b in (256, 257, 512, 4111)}
        assert graphs == {256: ["1", "2", "4", "8", "16"], 257: ["1", "2", "4", "8"],
                          512: ["1", "2", "4", "8"], 4111: ["1"]}
        assert _flag_values(server_argv(p.with_algorithm("DDTREE", 4112), 1, Path("/m")),
                            "--cuda-graph-backend-decode") == ["disabled"]
        for algorithm in ("AR", "DFLASH"):
            argv = server_argv(p.with_algorithm(algorithm), 1, Path("/m"))
            assert _flag_values(argv, "--cuda-graph-bs-decode") == ["1", "2", "4", "8", "16"]

    def test_ep_graphs_tokenizer_load_format_and_passthrough(self, tmp_path: Path) -> None:
        """ep, disabled graphs, dummy weights and the sglang table map to their flags."""
        p = _profile(tmp_path, tp=4, ep=4, tokenizer="model", **{
            "load-format": "dummy", "sglang": {"trust-remote-code": True, "enable-x": False,
                                               "mem-fraction-static": 0.5, "list-arg": [1, 2]}})
        argv = server_argv(p, 1, Path("/m"))
        assert _flag_values(argv, "--ep-size") == ["4"]
        assert _flag_values(argv, "--cuda-graph-backend-decode") == ["disabled"]
        assert _flag_values(argv, "--load-format") == ["dummy"]
        assert _flag_values(argv, "--speculative-draft-load-format") == ["dummy"]
        assert "--trust-remote-code" in argv and "--enable-x" not in argv
        assert _flag_values(argv, "--mem-fraction-static") == ["0.5"]
        assert _flag_values(argv, "--list-arg") == ["1", "2"]
        assert "--skip-tokenizer-init" not in argv


class TestPreflight:
    def test_missing_model_directory_is_named(self, tmp_path: Path, models: Path) -> None:
        """A profile whose model directory is absent fails before anything starts."""
        with pytest.raises(UsageError, match=r"model directory .*nowhere does not exist"):
            check_models(_profile(tmp_path, model="nowhere"), models)

    def test_missing_drafter_is_named_only_when_speculating(self, tmp_path: Path,
                                                            models: Path) -> None:
        """The drafter directory matters for DFLASH/DDTREE, not for AR."""
        p = _profile(tmp_path, drafter="gone")
        with pytest.raises(UsageError, match=r"drafter directory .*gone does not exist"):
            check_models(p, models)
        check_models(p.with_algorithm("AR"), models)

    def test_missing_env_file_under_models_is_named(self, tmp_path: Path, models: Path) -> None:
        """An env value under {models} that does not exist is reported with its key."""
        p = _profile(tmp_path, env={"HOOK": "{models}/hook.json"})
        with pytest.raises(UsageError, match=r"env HOOK names .*hook\.json, which does not exist"):
            check_models(p, models)

    def test_server_env_expands_models_and_keeps_nccl_settings(self, tmp_path: Path,
                                                               monkeypatch) -> None:
        """The server inherits the NCCL settings and gets the profile's env, expanded."""
        monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
        env = server_env(_profile(tmp_path, env={"HOOK": "{models}/h.json"}), Path("/m"))
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["HOOK"] == "/m/h.json"
        assert "127.0.0.1" in env["NO_PROXY"]

    def test_port_in_use_is_not_free(self) -> None:
        """A listening socket makes its port unavailable; a fresh free port is available."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            assert not port_is_free(sock.getsockname()[1])
        assert port_is_free(free_port())

    def test_log_tail_keeps_the_last_nonempty_lines(self, tmp_path: Path) -> None:
        """The tail quotes the last lines of the log, and says so when there is no log."""
        log = tmp_path / "s.log"
        log.write_text("".join(f"line {i}\n\n" for i in range(40)))
        tail = log_tail(log, lines=3).splitlines()
        assert tail == ["  | line 37", "  | line 38", "  | line 39"]
        assert "no log" in log_tail(tmp_path / "none.log")


class TestLifecycle:
    def _server(self, tmp_path: Path, models: Path, **overrides: object) -> SGLangServer:
        return SGLangServer(_profile(tmp_path, **overrides), port=free_port(), models_root=models,
                            log_path=tmp_path / "logs" / "server.log", stop_grace=5.0)

    def test_start_health_and_graceful_stop(self, tmp_path: Path, models: Path) -> None:
        """The server becomes healthy, reports its algorithm, and exits 0 on SIGTERM."""
        server = self._server(tmp_path, models)
        with server:
            server.wait_healthy(timeout=20)
            assert server.client.server_info()["speculative_algorithm"] == "DDTREE"
        assert server.proc is not None and server.proc.returncode == 0
        assert server.log_path.read_text().startswith("$ ")

    def test_stop_escalates_to_sigkill(self, tmp_path: Path, models: Path) -> None:
        """A server that ignores SIGTERM is killed after the grace period."""
        server = self._server(tmp_path, models, sglang={"fake-ignore-sigterm": True})
        server.stop_grace = 0.5
        with server:
            server.wait_healthy(timeout=20)
        assert server.proc is not None and server.proc.returncode == -signal.SIGKILL

    def test_server_dying_at_start_quotes_the_log(self, tmp_path: Path, models: Path) -> None:
        """A server that exits while starting raises its exit code and the log's last lines."""
        with self._server(tmp_path, models, sglang={"fake-exit-at-start": 3}) as server, \
                pytest.raises(ReproError, match=r"(?s)exited with code 3.*fake failure"):
            server.wait_healthy(timeout=20)

    def test_graph_capture_out_of_memory_names_the_profile_keys(self, tmp_path: Path) -> None:
        """A log ending in SGLang's graph-capture OOM gets the profile's fix; another failure none."""
        server = self._server(tmp_path, tmp_path)
        server.log_path.parent.mkdir(parents=True)
        server.log_path.write_text("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate\n")
        msg = str(server.failure("exited with code -9"))
        assert msg.startswith("SGLang server for fake (DDTREE B=8) exited with code -9: its decode CUDA graphs did "
                              "not fit in GPU memory (lower the profile's largest cuda-graph-bs, or set "
                              "cuda-graph-max-tokens to cap a DDTREE verify graph's bs x (B + 1) tokens); last lines")
        server.log_path.write_text("RuntimeError: fake failure while loading the model\n")
        assert str(server.failure("exited with code 3")).startswith(
            "SGLang server for fake (DDTREE B=8) exited with code 3; last lines")

    def test_start_timeout_quotes_the_log(self, tmp_path: Path, models: Path) -> None:
        """A server not healthy within the timeout raises, naming the timeout."""
        with self._server(tmp_path, models, sglang={"fake-startup-s": 30}) as server, \
                pytest.raises(ReproError, match=r"was not healthy after 1 s"):
            server.wait_healthy(timeout=1)

    def test_taken_port_refuses_to_start(self, tmp_path: Path, models: Path) -> None:
        """start() refuses a port something already listens on."""
        server = self._server(tmp_path, models)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", server.port))
            sock.listen()
            with pytest.raises(UsageError, match=r"port 127\.0\.0\.1:\d+ is already in use"):
                server.start()
        assert server.proc is None
