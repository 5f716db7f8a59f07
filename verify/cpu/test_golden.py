"""The golden set (golden/manifest.json): hashes, and both paths re-derive every stored output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from repro.cli import main as cli
from repro.golden import cases

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASES = list(cases.iter_cases(GOLDEN))


def test_the_set_covers_the_spec_example_and_fifty_seeded_cases():
    """The manifest holds the worked example and at least 50 seeded cases of every family."""
    names = [spec.name for _, spec in CASES]
    assert {"worked-example-b1", "worked-example-b3", "worked-example-b6"} <= set(names)
    assert len(names) >= 53
    families = {spec.family for _, spec in CASES}
    assert {"ties", "flat", "peaked", "random", "tiny-vocab", "certain"} <= families
    budgets = {spec.budget for _, spec in CASES}
    assert 0 in budgets and 1024 in budgets and {spec.horizon for _, spec in CASES} >= {1, 15}


@pytest.mark.parametrize(("entry", "spec"), CASES, ids=[spec.name for _, spec in CASES])
def test_case_rederives_exactly(entry, spec):
    """The file matches its sha256, and the batched and heap paths reproduce every output (scores
    to SCORE_ATOL: this CPU's float32 logsumexp may round otherwise than the writer's)."""
    assert cases.sha256(GOLDEN / entry["file"]) == entry["sha256"]
    inputs, stored = cases.load_case(GOLDEN, entry)
    for path in ("batched", "reference"):
        derived = cases.derive(inputs, spec.budget, path)
        assert cases.mismatches(stored, derived, score_atol=cases.SCORE_ATOL) == []


def test_generation_is_deterministic(tmp_path):
    """Regenerating cases from their seeds reproduces the stored inputs bit for bit and the stored
    outputs (scores to SCORE_ATOL, as above; the bytes are equal where logsumexp rounds alike)."""
    for name in ("worked-example-b6", "ties-2-v8", "certain-1-v4"):
        entry = next(e for e, s in CASES if s.name == name)
        fresh = cases.write_case(tmp_path, cases.CaseSpec(**entry["spec"]))
        (inputs, stored), (new_inputs, new_outputs) = cases.load_case(GOLDEN, entry), cases.load_case(tmp_path, fresh)
        assert inputs.keys() == new_inputs.keys()
        assert all(torch.equal(inputs[k], new_inputs[k]) for k in inputs)
        assert cases.mismatches(stored, new_outputs, score_atol=cases.SCORE_ATOL) == []


class TestCheckCommand:
    def _copy(self, tmp_path: Path, names: list[str]) -> Path:
        manifest = cases.load_manifest(GOLDEN)
        manifest["cases"] = [e for e in manifest["cases"] if e["name"] in names]
        for e in manifest["cases"]:
            (tmp_path / e["file"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(GOLDEN / e["file"], tmp_path / e["file"])
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        return tmp_path

    def test_passes_on_the_real_set(self, tmp_path, capsys):
        """`repro golden check` exits 0 on intact files."""
        d = self._copy(tmp_path, ["worked-example-b6", "flat-1-v6"])
        assert cli(["golden", "check", "--dir", str(d)]) == 0
        assert "2/2 golden cases ok" in capsys.readouterr().out

    def test_fails_on_a_tampered_file(self, tmp_path, capsys):
        """One flipped byte in a case file makes the check fail and name the case."""
        d = self._copy(tmp_path, ["worked-example-b6"])
        f = d / "tensors" / "worked-example-b6.safetensors"
        data = bytearray(f.read_bytes())
        data[-1] ^= 1
        f.write_bytes(bytes(data))
        assert cli(["golden", "check", "--dir", str(d)]) == 1
        assert "FAIL worked-example-b6: sha256 differs" in capsys.readouterr().out

    def test_fails_when_stored_outputs_are_wrong(self, tmp_path, capsys):
        """A consistent hash over a wrong output is still caught by re-derivation."""
        from safetensors.torch import load_file, save_file

        d = self._copy(tmp_path, ["worked-example-b6"])
        f = d / "tensors" / "worked-example-b6.safetensors"
        data = load_file(str(f))
        data["out.bonus"] = data["out.bonus"] + 1
        save_file(data, str(f))
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["cases"][0]["sha256"] = cases.sha256(f)
        (d / "manifest.json").write_text(json.dumps(manifest))
        assert cli(["golden", "check", "--dir", str(d)]) == 1
        assert "batched differs on ['bonus']" in capsys.readouterr().out

    def test_kernel_golden_hash_is_checked(self, tmp_path, capsys):
        """The SGLang kernel golden is hash-checked by `repro golden check` and by its loader."""
        d = self._copy(tmp_path, ["worked-example-b1", "sglang-kernels-sm90"])
        assert set(cases.load_kernel_golden(d, "90")) == {
            "extend_attention_tree_out", "verify_tree_greedy_accept_index", "target_only_sampling_pairs"}
        assert cases.load_kernel_golden(d, "120") is None
        f = d / "kernels" / "sglang-sm90.safetensors"
        f.write_bytes(f.read_bytes()[:-1] + bytes([f.read_bytes()[-1] ^ 1]))
        assert cli(["golden", "check", "--dir", str(d)]) == 1
        assert "FAIL sglang-kernels-sm90: sha256 differs" in capsys.readouterr().out
        with pytest.raises(ValueError, match="sha256 differs"):
            cases.load_kernel_golden(d, "90")

    def test_missing_manifest_is_a_usage_error(self, tmp_path, capsys):
        """A directory without a manifest gives a one-line error and exit 2."""
        assert cli(["golden", "check", "--dir", str(tmp_path)]) == 2
        assert "no manifest.json" in capsys.readouterr().err
