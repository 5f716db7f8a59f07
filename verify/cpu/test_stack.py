"""Tests for `repro.stack.pins`: loading and validating stack.toml, target lookup, the fingerprint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from repro.stack.pins import (
    REPO_ROOT,
    fingerprint,
    git_revision,
    load_stack,
    parse_capability,
    parse_stack,
    torch_cuda_version,
)
from verify.fake_stack import FIXTURES, dist, fake_nvidia_smi, stack_text


class TestParseStack:
    def test_real_file_loads_every_target(self):
        """The committed stack.toml validates and has the three SM targets with their capabilities."""
        stack = load_stack()
        assert {n: t.capabilities for n, t in stack.targets.items()} == {
            "sm90": ((9, 0),), "sm100": ((10, 0), (10, 3)), "sm120": ((12, 0),)}
        assert stack.packages["sglang"] == "0.5.17" and "python" not in stack.packages
        assert stack.min_driver == 580

    def test_every_target_loads_libraries_that_the_wheel_layout_has(self):
        """Each target names the sgl_kernel common_ops its capability selects plus spatial_ops."""
        stack = load_stack()
        assert stack.target("sm90").sgl_kernel_libs[0] == "sgl_kernel/sm90/common_ops.abi3.so"
        for name in ("sm100", "sm120"):
            assert stack.target(name).sgl_kernel_libs[0] == "sgl_kernel/sm100/common_ops.abi3.so"

    def test_missing_key_is_named(self):
        """A target without sgl-kernel-libs fails naming the table and the key."""
        text = stack_text().replace('sgl-kernel-libs = ["sgl_kernel/sm90/common_ops.abi3.so", '
                                    '"sgl_kernel/spatial_ops.abi3.so"]\n', "", 1)
        with pytest.raises(ValueError, match=r"targets\.sm90\.sgl-kernel-libs is missing"):
            parse_stack(text)

    def test_bad_capability_is_named(self):
        """A capability that is not MAJOR.MINOR fails with the offending value."""
        text = stack_text().replace('capabilities = ["9.0"]', 'capabilities = ["sm90"]')
        with pytest.raises(ValueError, match=r"capability must look like '9.0' \(got 'sm90'\)"):
            parse_stack(text)

    def test_bad_cubin_arch_is_named(self):
        """A cubin arch that is not sm_XY[a|f] fails with the offending value."""
        text = stack_text().replace('cubin-archs = ["sm_90a"]', 'cubin-archs = ["90a"]')
        with pytest.raises(ValueError, match=r"cubin-archs entries must look like 'sm_90a' \(got '90a'\)"):
            parse_stack(text)

    def test_non_string_pin_is_rejected(self):
        """A pin written as a number instead of a version string is rejected."""
        text = stack_text().replace('triton = "3.6.0"', "triton = 3.6")
        with pytest.raises(ValueError, match=r"stack\.triton must be a version string \(got 3\.6\)"):
            parse_stack(text)

    def test_min_driver_must_be_a_major_version(self):
        """min-driver must be digits only."""
        text = stack_text().replace('min-driver = "580"', 'min-driver = "580.65"')
        with pytest.raises(ValueError, match=r"stack\.min-driver must be a driver major version"):
            parse_stack(text)

    def test_stubs_listed_have_a_stub_package(self):
        """Every stub module stack.toml lists has its stand-in under repro/data/stubs."""
        for name in load_stack().wheelhouse.stubs:
            assert (REPO_ROOT / "repro" / "data" / "stubs" / name / "__init__.py").is_file(), name


class TestTargets:
    def test_unknown_target_lists_the_known_ones(self):
        """Looking up an unknown target names the choices and the bad value."""
        with pytest.raises(ValueError, match=r"target must be one of sm90, sm100, sm120 \(got 'sm80'\)"):
            load_stack().target("sm80")

    @pytest.mark.parametrize(("cap", "name"), [((9, 0), "sm90"), ((10, 0), "sm100"), ((10, 3), "sm100"),
                                               ((12, 0), "sm120"), ((8, 0), None), ((10, 1), None)])
    def test_detect_maps_capability_to_target(self, cap, name):
        """B300 (10.3) is sm100; capabilities no target lists give None."""
        found = load_stack().detect(cap)
        assert (found.name if found else None) == name

    def test_parse_capability(self):
        """'10.3' parses to (10, 3); junk raises naming the value."""
        assert parse_capability(" 10.3 ") == (10, 3)
        with pytest.raises(ValueError, match=r"got '10'"):
            parse_capability("10")


class TestFingerprint:
    def test_cpu_machine_gives_empty_gpu_fields(self, monkeypatch, tmp_path):
        """Without nvidia-smi the fingerprint has no GPUs, no driver, no target, and is JSON-ready."""
        monkeypatch.setenv("PATH", str(tmp_path))
        fp = fingerprint()
        assert fp["gpus"] == [] and fp["driver"] is None and fp["target"] is None and fp["sm"] == []
        assert fp["stack_sha256"] == load_stack().sha256
        assert set(fp["packages"]) == set(load_stack().packages)
        json.dumps(fp)

    def test_h200_fingerprint_names_gpu_driver_sm_and_target(self, monkeypatch, tmp_path):
        """With a (recorded) H200 the fingerprint says sm_90, target sm90 and the driver."""
        fake_nvidia_smi(monkeypatch, tmp_path / "bin", FIXTURES / "doctor" / "h200x1.csv")
        fp = fingerprint()
        assert fp["gpus"][0]["name"] == "NVIDIA H200" and fp["gpus"][0]["capability"] == "9.0"
        assert (fp["sm"], fp["target"], fp["driver"]) == (["sm_90"], "sm90", "580.159.04")

    def test_installed_versions_and_torch_cuda_are_read_without_importing(self, monkeypatch, tmp_path):
        """Versions come from dist-info and torch's CUDA from torch/version.py, torch never imported."""
        version_py = "__version__ = '2.11.0'\ncuda: Optional[str] = '13.0'\n"
        dist(tmp_path, "torch", "2.11.0+cu130", {"torch/version.py": version_py})
        dist(tmp_path, "sglang", "0.5.17")
        monkeypatch.syspath_prepend(str(tmp_path))
        fp = fingerprint()
        assert fp["packages"]["torch"] == "2.11.0+cu130" and fp["packages"]["sglang"] == "0.5.17"
        assert fp["torch_cuda"] == torch_cuda_version() == "13.0"

    def test_fingerprint_does_not_import_torch(self):
        """A fresh interpreter computing the fingerprint never imports torch."""
        code = "import sys, repro.stack.pins as s; s.fingerprint(); print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
        assert out.stdout.strip() == "False"

    def test_git_revision_outside_a_checkout_is_none(self, tmp_path, monkeypatch):
        """A directory that is no git checkout gives None instead of an error."""
        monkeypatch.delenv("REPRO_GIT_REVISION", raising=False)
        assert git_revision(tmp_path) is None

    def test_git_revision_named_by_the_environment_wins(self, tmp_path, monkeypatch):
        """$REPRO_GIT_REVISION names the revision of a shipped copy, dirtiness unknown."""
        monkeypatch.setenv("REPRO_GIT_REVISION", "abc1234")
        assert git_revision(tmp_path) == {"revision": "abc1234", "dirty": None}
        assert git_revision()["revision"] == "abc1234"

    def test_git_revision_of_this_checkout(self):
        """In the repository the revision is 40 hex digits and dirtiness a bool."""
        found = git_revision()
        if found is None:
            pytest.skip("not a git checkout (e.g. the copy the GPU machine receives)")
        assert len(found["revision"]) == 40 and isinstance(found["dirty"], bool)
