"""Tests for `repro doctor` on recorded machines: a fake nvidia-smi, fake installed versions, fake
sglang-kernel libraries, and recorded outcomes of the Triton / import probes and `repro patch check`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro import cli
from repro.stack import doctor
from repro.stack.pins import REPO_ROOT, parse_stack
from verify.fake_stack import FIXTURES, cuda_library, dist, fake_nvidia_smi, sass, stack_text

DOCTOR = FIXTURES / "doctor"
TOPOLOGY = FIXTURES / "topology"
FULL_KERNEL = {  # every target covered, as in the pinned sglang-kernel 0.4.5
    "sgl_kernel/sm90/common_ops.abi3.so": [sass(90), sass(90, "a")],
    "sgl_kernel/sm100/common_ops.abi3.so": [sass(100, "a"), sass(103, "a"), sass(120, "a")],
    "sgl_kernel/spatial_ops.abi3.so": [sass(90, "a"), sass(100, "a"), sass(103, "a"), sass(120, "a")],
}


class Machine:
    """Builds one recorded machine for a doctor run and runs it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
        self.mp, self.tmp = monkeypatch, tmp_path
        self.probe_results = {"triton": (True, "triton 3.6.0 compiled and ran a kernel on NVIDIA H200"),
                              "sglang": (True, "")}
        self.patch_output = "applied      0001-x.patch\nsglang 0.5.17 at SITE: 4/4 patches applied\n"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        monkeypatch.setattr(doctor, "load_stack", lambda: parse_stack(stack_text(python=python)))
        monkeypatch.setattr(doctor, "run_probe", lambda code, timeout, env=None:
                            self.probe_results["triton" if "triton" in code else "sglang"])
        monkeypatch.setattr(doctor, "run_patch_check", lambda site: subprocess.CompletedProcess(
            [], 0, self.patch_output, ""))
        for var in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST"):
            monkeypatch.delenv(var, raising=False)
        (tmp_path / "driver").mkdir()
        (tmp_path / "driver" / "libcuda.so.1").write_bytes(b"")
        monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path / "driver"))

    def gpus(self, query: str, topo: str = "h200x1.txt") -> Machine:
        """nvidia-smi prints doctor/<query> and topology/<topo>."""
        fake_nvidia_smi(self.mp, self.tmp / "bin", DOCTOR / query, TOPOLOGY / topo)
        return self

    def installed(self, fixture: str, kernel: dict[str, list] | None = None) -> Machine:
        """Fake dist-info for doctor/installed/<fixture>, torch's CUDA, and sgl_kernel libraries."""
        site = self.tmp / "site"
        versions = json.loads((DOCTOR / "installed" / fixture).read_text())
        for name, version in versions.items():
            if name.startswith("_") or name == "torch_cuda":
                continue
            files: dict[str, str | bytes] = {}
            if name == "torch":
                files["torch/version.py"] = f"__version__ = {version!r}\ncuda = {versions['torch_cuda']!r}\n"
            if name == "sglang-kernel":
                for lib, entries in (FULL_KERNEL if kernel is None else kernel).items():
                    files[lib] = cuda_library(self.tmp / "libs" / lib, entries).read_bytes()
            dist(site, name, version, files)
        self.mp.syspath_prepend(str(site))
        return self

    def run(self, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, tuple[str, str]]]:
        """Exit code and {check: (verdict, rest of line)}."""
        code = cli.main(["doctor", *args])
        lines = capsys.readouterr().out.splitlines()[1:-1]
        return code, {line[6:25].strip(): (line[:5].strip(), line[25:]) for line in lines}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fake machine for `repro doctor`, set up by its builder methods."""
    return Machine(monkeypatch, tmp_path)


class TestHardware:
    def test_cpu_machine_says_no_gpu(self, machine, monkeypatch, tmp_path, capsys):
        """Without nvidia-smi the first check is a clear FAIL 'no GPU' and GPU checks skip."""
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        code, checks = machine.run(capsys=capsys)
        assert code == 1
        assert checks["gpu"] == ("FAIL", ("no GPU: nvidia-smi not found on PATH  -> run on the GPU host; "
                                          "on this machine only the software checks mean anything"))
        assert checks["triton-kernel"][0] == checks["libcuda"][0] == checks["topology"][0] == "skip"

    def test_driver_not_loaded(self, machine, monkeypatch, tmp_path, capsys):
        """nvidia-smi failing shows its own message."""
        fake_nvidia_smi(monkeypatch, tmp_path / "bin", DOCTOR / "no-driver.txt", exit_code=9)
        _, checks = machine.run(capsys=capsys)
        assert checks["gpu"][1].startswith("no GPU: nvidia-smi exited 9: NVIDIA-SMI has failed")

    def test_matching_h200_is_all_green(self, machine, capsys):
        """An H200 with every pin installed, patched, with a working toolchain: every check ok, exit 0."""
        code, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert {name: verdict for name, (verdict, _) in checks.items() if verdict != "ok"} == {}
        assert code == 0
        assert checks["target"][1].startswith("sm90: Hopper: H100 / H200 (detected from capability 9.0)")
        assert checks["gpu"][1] == "1x NVIDIA H200 (capability 9.0, 140 GiB each)"
        assert checks["sgl-kernel-cubins"][1] == "SASS for 9.0 in 2 libraries the loader uses"

    def test_mixed_gpu_models_warn_and_the_driver_is_still_checked(self, machine, tmp_path, capsys):
        """An H200 next to an A100 is a warning; the driver line still follows."""
        rows = (DOCTOR / "h200x1.csv").read_text() + (DOCTOR / "a100x1.csv").read_text().replace("0, ", "1, ", 1)
        (tmp_path / "mixed.csv").write_text(rows)
        fake_nvidia_smi(machine.mp, tmp_path / "bin", tmp_path / "mixed.csv", TOPOLOGY / "h200x2.txt")
        _, checks = machine.installed("pinned.json").run(capsys=capsys)
        assert checks["gpu"][0] == "warn" and "mixed GPU models" in checks["gpu"][1]
        assert checks["driver"][0] == "ok"

    def test_old_driver(self, machine, capsys):
        """A driver older than min-driver FAILs with the version to install."""
        _, checks = machine.gpus("h200x1-driver570.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["driver"] == ("FAIL", "570.124.06 is older than 580  -> install NVIDIA driver >= 580 (CUDA 13.0)")

    def test_target_that_does_not_match_the_gpu(self, machine, capsys):
        """--target sm100 on an H200 FAILs and says what the GPU is."""
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run("--target", "sm100", capsys=capsys)
        assert checks["target"][0] == "FAIL" and "the GPU is 9.0, sm100 is for 10.0, 10.3" in checks["target"][1]

    def test_gpu_without_a_target(self, machine, capsys):
        """An A100 (8.0) has no pinned target: FAIL, and the cubin check is skipped."""
        _, checks = machine.gpus("a100x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["target"][0] == "FAIL" and "no pinned target for capability 8.0" in checks["target"][1]
        assert checks["sgl-kernel-cubins"] == ("skip", "no target")

    @pytest.mark.parametrize(("query", "topo", "verdict", "detail"), [
        ("b300x8.csv", "b300x8-nv18.txt", "ok", "8 GPUs, nvlink (NV18)"),
        ("pro6000x8.csv", "pro6000x8-pcie.txt", "ok", "8 GPUs, pcie"),
    ])
    def test_topology(self, machine, capsys, query, topo, verdict, detail):
        """Eight NVLinked B300s and eight PCIe RTX PRO 6000s are told apart."""
        _, checks = machine.gpus(query, topo).installed("pinned.json").run(capsys=capsys)
        assert checks["topology"][0] == verdict and checks["topology"][1].startswith(detail)

    def test_partial_nvlink_warns(self, machine, tmp_path, capsys):
        """Four GPUs with NVLink between pairs only is a warning with advice."""
        rows = (DOCTOR / "b300x8.csv").read_text().splitlines()[:4]
        (tmp_path / "x4.csv").write_text("\n".join(rows) + "\n")
        fake_nvidia_smi(machine.mp, tmp_path / "bin", tmp_path / "x4.csv", TOPOLOGY / "partial-nvlink-x4.txt")
        _, checks = machine.installed("pinned.json").run(capsys=capsys)
        assert checks["topology"][0] == "warn" and checks["topology"][1].startswith("4 GPUs, mixed")


class TestSoftware:
    def test_bare_h200_image_needs_the_wheelhouse(self, machine, capsys):
        """The H200 image as delivered: sglang missing, transformers too new, remedy install-offline."""
        code, checks = machine.gpus("h200x1.csv").installed("h200-image.json").run(capsys=capsys)
        assert code == 1
        assert checks["torch"] == ("ok", "2.11.0+cu130 (CUDA 13.0)")
        assert checks["sglang"][0] == "FAIL" and checks["sglang"][1].startswith(
            "not installed (pinned 0.5.17)  -> `repro install-offline DIR`")
        assert checks["transformers"][1].startswith("5.17.0 installed, pinned 5.12.1")
        assert checks["sglang-import"] == checks["sglang-patched"] == ("skip", "sglang not installed")

    def test_cpu_build_of_torch(self, machine, capsys):
        """torch of the pinned version but without CUDA FAILs naming both CUDA versions."""
        _, checks = machine.gpus("h200x1.csv").installed("torch-cpu.json").run(capsys=capsys)
        assert checks["torch"][0] == "FAIL" and "built for CUDA None, the stack is CUDA 13.0" in checks["torch"][1]

    def test_kernel_trimmed_for_another_target(self, machine, capsys):
        """A B300 with an sgl_kernel trimmed for sm90 lacks sm100/common_ops: FAIL."""
        kernel = {k: v for k, v in FULL_KERNEL.items() if "sm100" not in k}
        _, checks = machine.gpus("b300x8.csv", "b300x8-nv18.txt").installed("pinned.json", kernel).run(capsys=capsys)
        assert checks["sgl-kernel-cubins"][0] == "FAIL"
        assert checks["sgl-kernel-cubins"][1].startswith("sgl_kernel/sm100/common_ops.abi3.so is missing")

    def test_kernel_without_the_gpus_arch(self, machine, capsys):
        """sm100/common_ops with sm_100a only cannot run on a B300 (10.3)."""
        kernel = {**FULL_KERNEL, "sgl_kernel/sm100/common_ops.abi3.so": [sass(100, "a")]}
        _, checks = machine.gpus("b300x8.csv", "b300x8-nv18.txt").installed("pinned.json", kernel).run(capsys=capsys)
        assert checks["sgl-kernel-cubins"][1].startswith("sgl_kernel/sm100/common_ops.abi3.so has no SASS for 10.3")

    def test_arch_list_from_another_target_warns(self, machine, monkeypatch, capsys):
        """A TORCH_CUDA_ARCH_LIST left over from another target is a warning with the right value."""
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "10.0;10.3")
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["arch-lists"][0] == "warn" and "export TORCH_CUDA_ARCH_LIST='9.0'" in checks["arch-lists"][1]

    def test_libcuda_missing_and_found_on_ld_library_path(self, machine, monkeypatch, tmp_path, capsys):
        """No libcuda where Triton looks is a FAIL; one on LD_LIBRARY_PATH is found as Triton would."""
        machine.gpus("h200x1.csv").installed("pinned.json")
        monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path / "site"))
        _, checks = machine.run(capsys=capsys)
        assert checks["libcuda"][0] == "FAIL" and "-> set TRITON_LIBCUDA_PATH" in checks["libcuda"][1]
        monkeypatch.delenv("TRITON_LIBCUDA_PATH")
        monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "driver"))
        _, checks = machine.run(capsys=capsys)
        assert checks["libcuda"][0] == "ok"

    def test_stub_packages_are_reported(self, machine, capsys):
        """The serving stubs installed by install-offline are recognised as stubs."""
        machine.gpus("h200x1.csv").installed("pinned.json")
        shutil.copytree(REPO_ROOT / "repro" / "data" / "stubs" / "xgrammar", machine.tmp / "site" / "xgrammar")
        _, checks = machine.run(capsys=capsys)
        assert checks["serve-stubs"] == ("ok", "xgrammar are stubs: serve with --grammar-backend none")


class TestProbes:
    def test_triton_failure_names_the_cause(self, machine, capsys):
        """A Triton JIT failure on Python.h becomes one FAIL line with its remedy."""
        machine.probe_results["triton"] = (False, (DOCTOR / "triton" / "python-h.txt").read_text())
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["triton-kernel"] == ("FAIL", ("Python headers are missing  -> install the Python headers "
                                                    "(python3.12-dev) or use `nix develop .#sm90`"))

    def test_sglang_import_failure(self, machine, capsys):
        """A failing `import sglang.launch_server` shows its last line."""
        machine.probe_results["sglang"] = (False, "Traceback ...\nValueError: 'qwen3_asr' is already used")
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["sglang-import"][0] == "FAIL" and "'qwen3_asr' is already used" in checks["sglang-import"][1]

    def test_patches_not_applied(self, machine, capsys):
        """A partly patched sglang FAILs with the apply command."""
        machine.patch_output = "sglang 0.5.17 at SITE: 0/4 patches applied\n"
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["sglang-patched"][0] == "FAIL" and "-> repro patch apply --site" in checks["sglang-patched"][1]

    def test_patch_tooling_missing_is_unknown(self, machine, monkeypatch, tmp_path, capsys):
        """Without repro/patch.py the patch state is 'unknown', a warning, not a crash."""
        monkeypatch.setattr(doctor, "REPO_ROOT", tmp_path)
        _, checks = machine.gpus("h200x1.csv").installed("pinned.json").run(capsys=capsys)
        assert checks["sglang-patched"][:1] == ("warn",)
        assert checks["sglang-patched"][1].startswith("unknown: patch tooling not found")

    @pytest.mark.parametrize(("fixture", "meaning"), [
        ("python-h.txt", "Python headers are missing"), ("no-libcuda.txt", "the linker cannot find libcuda"),
        ("no-cc.txt", "no C compiler"), ("other.txt", "torch.AcceleratorError: CUDA error: out of memory"),
    ])
    def test_diagnose_triton(self, fixture, meaning):
        """Recorded Triton failures map to their cause (else the last line of the output)."""
        assert doctor.diagnose_triton((DOCTOR / "triton" / fixture).read_text(), "sm90")[0] == meaning


def test_json_report(machine, capsys):
    """--json prints every check, the verdict and the stack fingerprint."""
    machine.gpus("h200x1.csv").installed("pinned.json")
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["target"] == "sm90"
    assert {c["name"] for c in report["checks"]} >= {"gpu", "driver", "sglang", "triton-kernel", "sgl-kernel-cubins"}
    assert report["fingerprint"]["sm"] == ["sm_90"] and report["fingerprint"]["packages"]["sglang"] == "0.5.17"


def test_unknown_target_is_a_usage_error(machine, capsys):
    """--target naming no stack.toml target exits 2 with one line."""
    assert cli.main(["doctor", "--target", "sm75"]) == 2
    assert "target must be one of sm90, sm100, sm120 (got 'sm75')" in capsys.readouterr().err
