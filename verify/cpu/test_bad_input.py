"""Regression tests: bad input and faults give one clear line, lose nothing, and cannot
make a server listen beyond 127.0.0.1. One test (or one parametrized row) per example found.

Most run `repro.cli.main` in-process on the workspace of verify/cli_inputs.py (valid everywhere
but the input under test, no models, so no server starts); the `--resume` ones measure once with
the fake SGLang server and then change one thing at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.ddtree import build_trees, walk
from repro.errors import ReproError, UsageError
from repro.evidence.results import ResultsWriter, read_records
from repro.golden import cases
from repro.serving.profiles import NETWORK_SERVER_ARGS, OWNED_SERVER_ARGS, load_profiles, reserved_flag
from repro.serving.sglang_client import Client
from repro.serving.sglang_server import server_argv
from verify.benchdata import cell, request
from verify.cli_inputs import BENCH, SLOTS, argv_of, changed, run, snapshot, toml_text, workspace
from verify.fake_sglang import BASE_PROFILE, REPO, make_models, write_profiles

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANYWHERE = "0.0.0.0"  # noqa: S104 - the address no profile may make a server listen on


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace of verify/cli_inputs.py: valid inputs for every verb, no models."""
    return workspace(tmp_path)


def one_line(err: str) -> str:
    """The single stderr line of a failed command (asserting there is exactly one, no traceback)."""
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err.strip()


class TestEveryFileArgument:
    @pytest.mark.parametrize("slot", SLOTS, ids=[s.name for s in SLOTS])
    @pytest.mark.parametrize("kind", ["binary", "directory"])
    def test_binary_or_directory_is_one_line_and_touches_nothing(self, ws: Path, slot, kind) -> None:
        """A binary file or a directory where a verb reads a file: exit 2, one line naming it."""
        path = ws / slot.file
        if path.is_file():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "binary":
            path.write_bytes(bytes(range(256)) * 4)
        else:
            path.mkdir()
        before = snapshot(ws)
        code, _, err = run(argv_of(slot.argv, ws))
        assert changed(before, ws) == []
        if kind == "directory" and slot.name in ("report RESULTS", "cubins PATH", "cubins PATH wheel",
                                                  "testmodels OUT"):
            assert code in (0, 1) and "Traceback" not in err  # a directory is a documented input
            return
        assert code == 2
        line = one_line(err)
        assert ("binary or not UTF-8" in line or "directory" in line or "JUnit XML" in line
                or "not a wheelhouse" in line or "not a 64-bit" in line or "not a readable wheel" in line), line


def bench_argv(root: Path, *extra: str) -> list[str]:
    """A small AR bench of the fake profile on two prompts, writing ``root/out.jsonl``."""
    return ["bench", "--profile-file", str(root / "profiles.toml"), "--models-dir",
                str(root / "models"), "--prompts", str(root / "prompts.jsonl"), "--log-dir",
                str(root / "logs"), "--algorithms", "AR", "--concurrency", "1", "--num-prompts", "2",
                "--max-new-tokens", "8", "--warmup", "0", "-o", str(root / "out.jsonl"), "fake", *extra]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A workspace with models, profiles, prompts and one finished AR run (fake server)."""
    root = tmp_path_factory.mktemp("measured")
    make_models(root / "models")
    write_profiles(root / "profiles.toml", {"fake": {"sglang": {"fake-step-ms": 2}}})
    (root / "prompts.jsonl").write_text('{"prompt": "def f():"}\n{"prompt": "x = 1"}\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(REPO))
        code, _, err = run(bench_argv(root))
    assert code == 0, err
    return root


class TestResume:
    """`repro bench -o FILE --resume` never loses a byte and never reuses a changed cell."""

    @pytest.fixture
    def copy(self, measured: Path, tmp_path: Path) -> Path:
        """A private copy of the measured workspace."""
        shutil.copytree(measured, tmp_path / "w")
        return tmp_path / "w"

    def test_unchanged_configuration_resumes_with_nothing_to_do(self, copy: Path) -> None:
        """The same command again finds every request done and starts no server."""
        before = (copy / "out.jsonl").read_bytes()
        code, _, err = run(bench_argv(copy, "--resume"))
        assert code == 0 and "starting" not in err
        assert (copy / "out.jsonl").read_bytes().startswith(before)

    @pytest.mark.parametrize(("change", "part"), [
        (lambda w: write_profiles(w / "profiles.toml", {"fake": {"sglang": {"fake-step-ms": 3}}}),
         "server command"),
        (lambda w: write_profiles(w / "profiles.toml", {"fake": {"sglang": {"fake-step-ms": 2},
                                                                 "env": {"X_MODE": "1"}}}), "server command"),
        (lambda w: (w / "models" / "target" / "config.json").write_text('{"vocab_size": 2048}'), "model set"),
        (lambda w: (w / "prompts.jsonl").write_text('{"prompt": "def g():"}\n{"prompt": "x = 1"}\n'),
         "prompt set"),
        (lambda w: write_profiles(w / "profiles.toml", {"fake": {"sglang": {"fake-step-ms": 2},
                                                                 "tp": 2}}), "server command"),
    ], ids=["sglang-flag", "env", "model-config", "prompt-text", "tp"])
    def test_a_changed_configuration_is_refused_with_the_reason(self, copy: Path, change, part) -> None:
        """An edited profile, model or prompt file: exit 2 naming what changed; the file is kept."""
        change(copy)
        before = (copy / "out.jsonl").read_bytes()
        code, _, err = run(bench_argv(copy, "--resume"))
        assert code == 2
        assert re.search(rf"--resume: .*out\.jsonl holds fake AR c=1 T=0 results measured with a "
                         rf"different {part} than this run would use; write to a new -o file", one_line(err))
        assert (copy / "out.jsonl").read_bytes() == before

    def test_records_without_a_digest_are_refused(self, copy: Path) -> None:
        """Results of an older bench (no configuration digest) cannot be resumed into."""
        lines = [json.loads(line) for line in (copy / "out.jsonl").read_text().splitlines()]
        for r in lines:
            r.pop("config", None)
        (copy / "out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        code, _, err = run(bench_argv(copy, "--resume"))
        assert code == 2 and "without a configuration digest" in one_line(err)

    def test_complete_last_record_without_its_newline_is_kept(self, copy: Path) -> None:
        """A last record that lacks only its newline is neither re-run nor cut."""
        path = copy / "out.jsonl"
        whole = path.read_bytes()
        path.write_bytes(whole.rstrip(b"\n"))
        code, _, err = run(bench_argv(copy, "--resume"))
        assert code == 0 and "starting" not in err
        data = path.read_bytes()
        assert data.startswith(whole) and data.endswith(b"\n")
        assert sum(r["kind"] == "request" for r in read_records(path)) == 2

    @pytest.mark.parametrize("content", [b"hello\nworld", b'{"prompt": "x"}\n{"prompt": "y"}',
                                         bytes(range(256)), b'{"kind": "request", "cell": {}}\n'],
                             ids=["text", "prompts-file", "binary", "mistyped-record"])
    def test_a_file_that_is_not_results_is_refused_untouched(self, copy: Path, content: bytes) -> None:
        """A text, prompts, binary or malformed file passed as -o: exit 2, every byte kept."""
        (copy / "out.jsonl").write_bytes(content)
        code, _, err = run(bench_argv(copy, "--resume"))
        assert code == 2 and "-o: " in one_line(err)
        assert (copy / "out.jsonl").read_bytes() == content

    def test_writer_cuts_only_a_torn_record(self, tmp_path: Path) -> None:
        """The repair keeps a complete unterminated record and cuts only a torn one."""
        path = tmp_path / "r.jsonl"
        first = json.dumps(request(cell(), 0))
        path.write_text(first)
        ResultsWriter(path, resume=True).close()
        assert path.read_text() == first + "\n"
        path.write_text(first + "\n" + '{"kind": "requ')
        ResultsWriter(path, resume=True).close()
        assert path.read_text() == first + "\n"


class TestLoopback:
    OWNED = sorted({*OWNED_SERVER_ARGS, *NETWORK_SERVER_ARGS})

    @pytest.mark.parametrize("flag", OWNED)
    def test_no_spelling_or_abbreviation_of_a_reserved_flag_passes(self, flag: str) -> None:
        """Every prefix of every owned or network flag, with '_' or '-' and with or without
        leading dashes, is recognised (SGLang's argparse takes unambiguous abbreviations)."""
        for end in range(1, len(flag) + 1):
            for spelled in (flag[:end], flag[:end].replace("-", "_")):
                for key in (spelled, f"--{spelled}", f"-{spelled}"):
                    assert reserved_flag(key) is not None, key

    @pytest.mark.parametrize(("sglang", "message"), [
        ({"hos": ANYWHERE}, r"sglang\.hos' sets or abbreviates --host, which repro sets itself \(always to 127\.0\.0\.1\)"),
        ({"--host": ANYWHERE}, r"sglang\.--host' sets or abbreviates --host"),
        ({"po": 8080}, r"sglang\.po' sets or abbreviates --port"),
        ({"model_pa": "/x"}, r"sglang\.model_pa' sets or abbreviates --model-path"),
        ({"speculative_ddtree": 4}, r"sets or abbreviates --speculative-ddtree-budget"),
        ({"tensor-parallel": 8}, r"sets or abbreviates --tensor-parallel-size"),
        ({"config": "x.yaml"}, r"sglang\.config' sets or abbreviates --config, which could listen"),
        ({"dist_init_addr": f"{ANYWHERE}:5000"}, r"sets or abbreviates --dist-init-addr"),
        ({"some-list": ["a", "--host", ANYWHERE]}, r"value '--host' starts with '-'"),
        ({"host=0.0.0.0": True}, r"must be an SGLang flag name"),
        ({"x y": True}, r"must be an SGLang flag name"),
    ])
    def test_profile_cannot_set_an_owned_or_network_flag(self, tmp_path: Path, sglang: dict,
                                                         message: str) -> None:
        """A profile's sglang table that would undo --host 127.0.0.1 (or any owned flag) is refused."""
        path = tmp_path / "p.toml"
        path.write_text(toml_text({"profiles": {"fake": {**BASE_PROFILE, "sglang": sglang}}}))
        with pytest.raises(UsageError, match=message):
            load_profiles(path)

    def test_profile_env_cannot_set_an_address(self, tmp_path: Path) -> None:
        """Environment variables that choose an address or port (SGLANG_HOST_IP, ...) are refused."""
        path = write_profiles(tmp_path / "p.toml", {"fake": {"env": {"SGLANG_HOST_IP": ANYWHERE}}})
        with pytest.raises(UsageError, match=r"env\.SGLANG_HOST_IP' sets an address or port"):
            load_profiles(path)

    def test_every_flag_the_package_writes_is_owned(self) -> None:
        """server_argv writes only flags in OWNED_SERVER_ARGS (so the list cannot fall behind), and
        --host 127.0.0.1 for every shipped profile."""
        for profile in load_profiles().values():
            argv = server_argv(profile, 30000, Path("/m"), python="py")
            flags = {a[2:] for a in argv if a.startswith("--")} - set(profile.sglang)
            assert flags <= set(OWNED_SERVER_ARGS), flags - set(OWNED_SERVER_ARGS)
            assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv.count("--host") == 1


class TestPathsAndNames:
    def test_profile_name_with_dot_dot_is_refused(self, tmp_path: Path) -> None:
        """A profile name becomes a log file name, so '../x' is refused before anything runs."""
        text = write_profiles(tmp_path / "p.toml", {"fake": {}}).read_text()
        (tmp_path / "p.toml").write_text(text.replace("[profiles.fake]", '[profiles."../../evil"]'))
        with pytest.raises(UsageError, match=r"profile name must be letters, digits.*\(got '\.\./\.\./evil'\)"):
            load_profiles(tmp_path / "p.toml")


class TestConfidentWrongAnswers:
    def test_truncated_topology_gives_no_verdict(self, tmp_path: Path) -> None:
        """Half of an 8-GPU NV18 matrix: exit 2, "cannot parse", and nothing on stdout."""
        lines = (FIXTURES / "topology" / "b300x8-nv18.txt").read_text().splitlines()
        (tmp_path / "topo.txt").write_text("\n".join(lines[:5]) + "\n")
        code, out, err = run(["topology", "--from", str(tmp_path / "topo.txt")])
        assert code == 2 and out == ""
        assert "cannot parse the `nvidia-smi topo -m` table" in one_line(err) and "GPU4" in err

    def test_non_finite_start_timeout_is_refused(self, tmp_path: Path) -> None:
        """start-timeout = nan (or inf) in a profile is refused, naming the key."""
        for value in ("nan", "inf"):
            path = write_profiles(tmp_path / "p.toml", {"fake": {"start-timeout": 1}})
            path.write_text(path.read_text().replace("start-timeout = 1", f"start-timeout = {value}"))
            with pytest.raises(UsageError, match=rf"key 'start-timeout' must be a finite number \(got {value}\)"):
                load_profiles(path)

    @pytest.mark.parametrize("value", ["nan", "inf", "-1", "0,nan"])
    def test_non_finite_or_negative_temperatures_are_refused(self, ws: Path, value: str) -> None:
        """--temperatures nan/inf/-1 exits 2 naming the flag."""
        code, _, err = run([*argv_of(BENCH, ws), f"--temperatures={value}"])
        assert code == 2
        assert "argument --temperatures: must be a comma list of finite numbers >= 0" in one_line(err)

    @pytest.mark.parametrize("row", ['{"input_ids": []}', '{"prompt": ""}', '{"input_ids": [NaN]}'])
    def test_empty_prompts_are_refused(self, ws: Path, row: str) -> None:
        """A prompt with no ids or no text (or a non-JSON number) is refused with its line."""
        (ws / "p.jsonl").write_text(row + "\n")
        code, _, err = run([*argv_of(BENCH, ws), "--prompts", str(ws / "p.jsonl")])
        assert code == 2 and re.search(r"--prompts: .*p\.jsonl:1: ", one_line(err))


class _NotJson(BaseHTTPRequestHandler):
    """A proxy-like server: 200 with an HTML page for every GET, a broken event stream on POST."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>proxy login</html>")

    def do_POST(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"data: {not json\n\ndata: [DONE]\n\n")

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def not_json_url() -> Iterator[str]:
    """The URL of a :class:`_NotJson` server on 127.0.0.1, shut down afterwards."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotJson)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class TestTracebacks:
    @pytest.mark.parametrize("url", ["http://127.0.0.1", "https://127.0.0.1:8000", "garbage",
                                     "http://127.0.0.1:abc", "http://127.0.0.1:8000/generate"])
    def test_bad_url_is_one_line(self, ws: Path, url: str) -> None:
        """--url without a port, with https, garbage or a path: exit 2 with the expected form."""
        code, _, err = run([*argv_of(BENCH, ws), "--url", url])
        assert code == 2 and "argument --url: url must look like http://127.0.0.1:PORT" in one_line(err)

    def test_server_answering_non_json_is_one_line(self, ws: Path, not_json_url: str) -> None:
        """A server whose /server_info is not JSON: exit 1 quoting what it answered, no file written."""
        out = ws / "url.jsonl"
        code, _, err = run([*argv_of(BENCH, ws), "--url", not_json_url, "-o", str(out)])
        assert code == 1 and "answered something that is not a JSON object: b'<html>" in one_line(err)
        assert not out.exists()
        with pytest.raises(ReproError, match=r"/generate answered something that is not a JSON object"):
            Client(not_json_url).generate({"input_ids": [1]})

    @pytest.mark.parametrize(("record", "message"), [
        ({"kind": "request", "session": "s"}, r"key 'index' is missing"),
        ({**request(cell(), 0), "end": "late"}, r"key 'end' must be a finite number \(got 'late'\)"),
        ({**request(cell(), 0), "cell": {"profile": "p"}}, r"key 'cell' must be an object with the keys algorithm"),
        ({**request(cell(), 0), "chunks": [[1]]}, r"key 'chunks' must be a list of \[seconds, tokens\]"),
        ({**request(cell("DDTREE", None), 0)}, r"key 'cell.budget' must be set for DDTREE"),
        ({"kind": "run", "profiles": {"x": {"name": "x"}}}, r"run record profiles\.x: .*key 'target' is required"),
        ({"kind": "run", "fingerprint": []}, r"key 'fingerprint' must be an object or null"),
    ])
    def test_results_with_missing_or_mistyped_keys(self, ws: Path, record: dict, message: str) -> None:
        """`repro report` on a record with a missing or mistyped key: exit 2 naming file, line, key."""
        (ws / "r.jsonl").write_text(json.dumps(request(cell(), 1)) + "\n" + json.dumps(record) + "\n")
        code, _, err = run(["report", str(ws / "r.jsonl"), "-o", str(ws / "report")])
        assert code == 2 and re.search(r"RESULTS: .*r\.jsonl:?\d*: " + message, one_line(err)), err
        assert not (ws / "report").exists()

    def test_golden_case_with_a_corrupt_header(self, tmp_path: Path) -> None:
        """A case file whose hash matches a hand-edited manifest but is not safetensors: a FAIL
        line and exit 1; a manifest that is not JSON: exit 2."""
        (tmp_path / "tensors").mkdir()
        (tmp_path / "tensors" / "x.safetensors").write_bytes(b"\xff" * 64)
        spec = {"name": "x", "family": "random", "seed": 1, "bs": 1, "horizon": 1, "vocab": 2, "budget": 1}
        entry = {"name": "x", "kind": cases.KIND, "file": "tensors/x.safetensors",
                 "sha256": hashlib.sha256(b"\xff" * 64).hexdigest(), "spec": spec}
        (tmp_path / "manifest.json").write_text(json.dumps({"cases": [entry]}))
        code, out, err = run(["golden", "check", "--dir", str(tmp_path)])
        assert code == 1 and err == ""
        assert "FAIL x: " in out and "not a readable golden case (SafetensorError" in out
        (tmp_path / "manifest.json").write_text('{"cases": [')
        code, _, err = run(["golden", "check", "--dir", str(tmp_path)])
        assert code == 2 and "manifest.json is not valid JSON" in one_line(err)

    @pytest.mark.parametrize("missing", ["METADATA", "RECORD"])
    def test_patch_site_without_metadata_or_record(self, ws: Path, missing: str) -> None:
        """An sglang dist-info without METADATA or RECORD: exit 2 naming the file."""
        (ws / "site" / "sglang-0.5.17.dist-info" / missing).unlink()
        code, _, err = run(["patch", "check", "--site", str(ws / "site")])
        assert code == 2 and re.search(rf"--site: .*{missing} does not exist", one_line(err))

    @pytest.mark.parametrize("wrong", [lambda t: t.tolist(), lambda t: t.numpy()], ids=["list", "numpy"])
    def test_ddtree_calls_name_the_argument_and_type(self, wrong) -> None:
        """build_trees / walk given a list or a numpy array raise a TypeError/ValueError naming it."""
        logits = torch.randn(2, 3, 8)
        tree = build_trees(logits, 4)
        with pytest.raises(ValueError, match=r"draft_logits must be a torch\.Tensor \(got (list|ndarray)\)"):
            build_trees(wrong(logits), 4)
        with pytest.raises(TypeError, match=r"root_tokens must be a torch\.Tensor \[bs\] or None"):
            build_trees(logits, 4, wrong(torch.zeros(2, dtype=torch.int64)))
        with pytest.raises(TypeError, match=r"target_tokens must be a Tensor \(got (list|ndarray)\)"):
            walk(tree, wrong(tree.tokens))
        with pytest.raises(TypeError, match=r"tree must be a DraftTree \(got ndarray\)"):
            walk(np.zeros((2, 5)), tree.tokens)
