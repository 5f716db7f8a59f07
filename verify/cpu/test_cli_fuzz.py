"""Property tests of the command line: every verb, fed random bytes, TOML, JSON or JSONL in each file it reads
and random values for the flags a user types, ends with its documented exit code (2 for bad input),
one stderr line and no traceback, and leaves every file that existed before byte-identical.

`repro.cli.main` runs in-process on the workspace of verify/cli_inputs.py (no models, so no server
starts and nothing reaches the network); examples are bounded for CI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.evidence.records import KINDS
from repro.serving.profiles import PROFILE_KEYS
from verify.benchdata import cell, request
from verify.cli_inputs import FLAGS, SLOTS, Slot, argv_of, changed, run, snapshot, toml_text, workspace
from verify.fake_sglang import BASE_PROFILE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXAMPLES = settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow,
                                                             HealthCheck.function_scoped_fixture])
KEYS = sorted({*PROFILE_KEYS, "profiles", "sets", "package", "name", "version", "wheels", "url",
               "hash", "cases", "kind", "file", "sha256", "spec", "format", "archives", "session",
               "cell", "index", "start", "end", *KINDS})

scalars = st.one_of(st.integers(-2**40, 2**40), st.floats(), st.booleans(), st.text(max_size=12),
                    st.sampled_from(["0.0.0.0", "--host", "../x", "sm90", "DDTREE", "AR"]))  # noqa: S104 - a value to refuse
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=8)
json_values = st.recursive(st.one_of(st.none(), scalars), lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=8)


@st.composite
def toml_documents(draw) -> str:
    """Random TOML, often a base profile with some keys replaced (to reach the deep checks)."""
    if draw(st.booleans()):
        table = {**BASE_PROFILE, **draw(st.dictionaries(st.sampled_from(sorted(PROFILE_KEYS)) | keys,
                                                        values, max_size=3))}
        name = draw(st.sampled_from(["fake", "../x", "a b", ""]) | st.text(max_size=6))
        return toml_text({"profiles": {name: table}})
    return toml_text(draw(st.dictionaries(keys, values, max_size=4)))


@st.composite
def jsonl_documents(draw) -> str:
    """Random JSONL, often results records with one key replaced, maybe a torn last line."""
    lines = []
    for i in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            record = request(cell(), i)
            record[draw(st.sampled_from(sorted(record)) | keys)] = draw(json_values)
        else:
            record = draw(json_values)
        lines.append(json.dumps(record))
    text = "\n".join(lines) + draw(st.sampled_from(["", "\n"]))
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


def content(holds: str) -> st.SearchStrategy:
    """A strategy of file contents (bytes) for what a slot holds."""
    text = {"toml": toml_documents(), "jsonl": jsonl_documents(),
            "json": st.builds(json.dumps, json_values), "text": st.text(max_size=300)}.get(holds)
    encoded = text.map(str.encode) if text is not None else st.nothing()
    return st.one_of(st.binary(max_size=400), encoded)


@pytest.fixture(scope="module")
def spaces(tmp_path_factory) -> dict[str, Path]:
    """One workspace per test, made on first use and kept across its examples (so files an
    earlier example wrote count as pre-existing for the next)."""
    root = tmp_path_factory.mktemp("fuzz")
    made: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in made:
            made[key] = root / str(len(made))
            made[key].mkdir()
            workspace(made[key])
        return made[key]

    return get


def check_run(ws: Path, argv: tuple[str, ...], codes: frozenset[int]) -> None:
    """Run ``argv`` in ``ws``; assert the property. The report directory is `repro report`'s
    output, rewritten by design, so an earlier example's report is cleared first."""
    shutil.rmtree(ws / "report", ignore_errors=True)
    before = snapshot(ws)
    code, _, err = run(argv_of(argv, ws))
    assert "Traceback" not in err, err
    assert code in codes, (code, err)
    if code == 2:
        assert err.count("\n") == 1, err
    assert changed(before, ws) == []


@pytest.mark.parametrize("slot", SLOTS, ids=[s.name for s in SLOTS])
@EXAMPLES
@given(data=st.data())
def test_random_file_contents(spaces, slot: Slot, data: st.DataObject) -> None:
    """Any content in any file a verb reads: the documented exit code, one line, nothing changed."""
    ws = spaces(slot.name)
    path = ws / slot.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.draw(content(slot.holds)))
    check_run(ws, slot.argv, slot.codes)


VALUES = st.one_of(st.text(max_size=12), st.sampled_from(
    ["nan", "inf", "-inf", "-1", "0", "1", "1e309", "", " ", "1,,2", "0x10", "65536", "cuda:7", "meta",
     "sm90", "cpu", "AR,DDTREE"]))


@pytest.mark.parametrize(("argv", "flags"), FLAGS, ids=[argv[0] for argv, _ in FLAGS])
@EXAMPLES
@given(data=st.data())
def test_random_flag_values(spaces, argv: tuple[str, ...], flags: tuple[str, ...],
                            data: st.DataObject) -> None:
    """Any value typed for a flag ends in exit 2 with one line (a valid one where the command
    fails next), never a traceback."""
    flag = data.draw(st.sampled_from(flags))
    check_run(spaces(f"flags {argv[0]}"), (*argv, f"{flag}={data.draw(VALUES)}"), frozenset({2}))


@EXAMPLES
@given(cut=st.integers(0, 2000))
def test_a_cut_topology_table_never_gives_a_wrong_verdict(spaces, cut: int) -> None:
    """An 8-GPU NV18 table cut anywhere: "cannot parse" (exit 2) until the GPU7 row is whole,
    then the right answer (8 GPUs, nvlink); never a verdict for fewer GPUs or a mixed box."""
    text = (FIXTURES / "topology" / "b300x8-nv18.txt").read_text()
    whole = text.index("X", text.index("\nGPU7\t")) + 1  # the last link cell of the last GPU row
    path = spaces("topology") / "topo.txt"
    path.write_text(text[:cut])
    code, out, err = run(["topology", "--from", str(path)])
    if cut < whole:
        assert code == 2 and out == "" and err.count("\n") == 1, (cut, out, err)
    else:
        assert code == 0 and out.startswith("GPUs: 8  interconnect: nvlink"), (cut, out, err)
