"""``repro doctor [--target smXX] [--json]``: does this machine match the pinned stack?

One line per check, each with a verdict (ok, warn, FAIL, skip) and, when not ok, a remedy: the
GPUs, driver and interconnect (``nvidia-smi``), the target, installed versions against
``stack.toml``, the build toolchain Triton's JIT needs, a real Triton kernel compiled and run, the
DDTree patch series, the serving stubs, ``import sglang``, and the sglang-kernel cubins for the GPU.
Exits 1 when any check FAILs. On a machine without a GPU the first line says so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.stack import fatbin, gpuinfo
from repro.stack.pins import (
    REPO_ROOT,
    Stack,
    Target,
    fingerprint,
    format_capability,
    installed_version,
    load_stack,
    torch_cuda_version,
)

# remedies for a missing or wrong package: the wheelhouse ships [wheelhouse] serve, the host the rest
WHEELHOUSE_REMEDY = ("`repro install-offline DIR` (from `repro wheelhouse`), `uv sync --extra gpu` "
                     "or `nix develop .#{target}`")
HOST_REMEDY = "`uv sync --extra gpu`, `nix develop .#{target}` or `pip install {name}=={version}`"
HEADERS_REMEDY = "install the Python headers (python3.12-dev) or use `nix develop .#{target}`"
LIBCUDA_REMEDY = "set TRITON_LIBCUDA_PATH to the directory holding the driver's libcuda.so.1"
TRITON_PROBE = """
import torch, triton, triton.language as tl

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

x = torch.zeros(1000, device="cuda")
add_one[(4,)](x, 1000, BLOCK=256)
torch.cuda.synchronize()
assert bool((x == 1).all()), "kernel ran but computed the wrong values"
print("triton", triton.__version__, "compiled and ran a kernel on", torch.cuda.get_device_name())
"""
# (text in the failure output, what it means, remedy); the first match wins
TRITON_FAILURES = (
    ("Python.h", "Python headers are missing", HEADERS_REMEDY),
    ("-lcuda", "the linker cannot find libcuda", LIBCUDA_REMEDY),
    ("libcuda.so", "libcuda cannot be loaded", LIBCUDA_REMEDY),
    ("Failed to find C compiler", "no C compiler", "install gcc or set CC"),
    ("ptxas", "ptxas failed", "set TRITON_PTXAS_PATH to a CUDA 13 ptxas that knows this GPU"),
)


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    verdict: str  # ok | warn | FAIL | skip
    detail: str
    remedy: str = ""


@dataclass(frozen=True)
class Context:
    """What every check may look at."""

    stack: Stack
    gpus: gpuinfo.GpuQuery
    target: Target | None
    target_note: str  # how the target was chosen

    @property
    def target_name(self) -> str:
        """The target's name, or ``smXX`` for remedies when there is none."""
        return self.target.name if self.target else "smXX"

    @property
    def capability(self) -> tuple[int, int] | None:
        """The first GPU's compute capability, if any."""
        return self.gpus.gpus[0].capability if self.gpus.gpus else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro doctor``."""
    parser.add_argument("--target", help="SM target of stack.toml to check against (default: from the GPU)")
    parser.add_argument("--json", action="store_true", help="print the checks and the stack fingerprint as JSON")


def run_probe(code: str, timeout: float, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run Python ``code`` from a file in a fresh interpreter; (succeeded, its combined output)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(code)
        try:
            done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                                  timeout=timeout, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            return False, f"did not finish within {timeout:.0f}s"
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def run_patch_check(site: Path) -> subprocess.CompletedProcess[str]:
    """``repro patch check --site SITE`` in a subprocess (verbs do not import each other)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "repro.cli", "patch", "check", "--site", str(site)],
                          capture_output=True, text=True, check=False, timeout=120, env={**os.environ, "PYTHONPATH": path})


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1][:200] if text.strip() else "no output"


def diagnose_triton(output: str, target: str) -> tuple[str, str]:
    """(what went wrong, remedy) for a failed Triton probe."""
    for needle, meaning, remedy in TRITON_FAILURES:
        if needle in output:
            return meaning, remedy.format(target=target)
    return _last_line(output), "run the probe by hand to see the whole error"


def check_gpu(ctx: Context) -> list[Check]:
    """The GPUs and the driver."""
    gpus, stack = ctx.gpus.gpus, ctx.stack
    if not gpus:
        return [Check("gpu", "FAIL", f"no GPU: {ctx.gpus.error}",
                      "run on the GPU host; on this machine only the software checks mean anything")]
    names = sorted({g.name for g in gpus})
    caps = sorted({format_capability(g.capability) for g in gpus if g.capability})
    mem = min(g.memory_mib or 0 for g in gpus) / 1024
    detail = f"{len(gpus)}x {', '.join(names)} (capability {', '.join(caps) or '?'}, {mem:.0f} GiB each)"
    mixed = len(names) > 1 or len(caps) != 1
    checks = [Check("gpu", "warn", f"{detail}: mixed GPU models", "serve on one GPU model per node")
              if mixed else Check("gpu", "ok", detail)]
    major = int((ctx.gpus.driver or "0").split(".")[0] or 0)
    if major >= stack.min_driver:
        checks.append(Check("driver", "ok", f"{ctx.gpus.driver} (CUDA {stack.cuda} needs >= {stack.min_driver})"))
    else:
        checks.append(Check("driver", "FAIL", f"{ctx.gpus.driver} is older than {stack.min_driver}",
                            f"install NVIDIA driver >= {stack.min_driver} (CUDA {stack.cuda})"))
    return checks


def check_target(ctx: Context) -> list[Check]:
    """The target exists and fits the GPU."""
    t = ctx.target
    if t is None:
        if ctx.gpus.gpus:
            return [Check("target", "FAIL", ctx.target_note, "add a [targets.*] table to repro/data/stack.toml")]
        return [Check("target", "skip", ctx.target_note)]
    if ctx.capability is not None and ctx.capability not in t.capabilities:
        wanted = ", ".join(format_capability(c) for c in t.capabilities)
        return [Check("target", "FAIL", f"the GPU is {format_capability(ctx.capability)}, {t.name} is for {wanted}",
                      "omit --target to detect it from the GPU")]
    return [Check("target", "ok", f"{t.name}: {t.description} ({ctx.target_note}); "
                  f"tree verify with --attention-backend {t.attention_backend}")]


def check_topology(ctx: Context) -> list[Check]:
    """NVLink or PCIe between the GPUs."""
    count = len(ctx.gpus.gpus)
    if count < 2:
        return [Check("topology", "ok", "single GPU") if count else Check("topology", "skip", "no GPU")]
    text, why = gpuinfo.run_tool(["nvidia-smi", "topo", "-m"])
    if text is None:
        return [Check("topology", "warn", f"unknown: {why}", "run `nvidia-smi topo -m` by hand")]
    try:
        links = gpuinfo.parse_topology(text)
    except ValueError as exc:
        return [Check("topology", "warn", f"unknown: cannot parse `nvidia-smi topo -m` ({exc})",
                      "run `nvidia-smi topo -m` by hand")]
    kind = gpuinfo.interconnect(links, count)
    detail = f"{count} GPUs, {kind} ({', '.join(sorted(set(links.values())))}); see `repro topology`"
    if kind == "mixed":
        return [Check("topology", "warn", detail, "some GPU pairs lack NVLink: keep TP groups inside NVLinked sets")]
    return [Check("topology", "ok", detail)]


def check_versions(ctx: Context) -> list[Check]:
    """Python and every pinned package (torch also for its CUDA version)."""
    stack, python = ctx.stack, sys.version.split()[0]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == stack.python:
        checks = [Check("python", "ok", python)]
    else:
        checks = [Check("python", "FAIL", f"{python}, the stack is Python {stack.python}",
                        f"run under Python {stack.python} (the wheels are cp{stack.python.replace('.', '')})")]
    for name, pinned in stack.packages.items():
        have = installed_version(name)
        template = WHEELHOUSE_REMEDY if name in stack.wheelhouse.serve else HOST_REMEDY
        remedy = template.format(target=ctx.target_name, name=name, version=pinned)
        if have is None:
            checks.append(Check(name, "FAIL", f"not installed (pinned {pinned})", remedy))
        elif have.split("+")[0] != pinned:
            checks.append(Check(name, "FAIL", f"{have} installed, pinned {pinned}", remedy))
        elif name == "torch" and torch_cuda_version() != stack.cuda:
            checks.append(Check(name, "FAIL", f"{have} is built for CUDA {torch_cuda_version()}, the stack is "
                                f"CUDA {stack.cuda}", f"install the CUDA {stack.cuda} wheel of torch {pinned}"))
        else:
            checks.append(Check(name, "ok", have + (f" (CUDA {stack.cuda})" if name == "torch" else "")))
    return checks


def check_arch_lists(ctx: Context) -> list[Check]:
    """TORCH_CUDA_ARCH_LIST / FLASHINFER_CUDA_ARCH_LIST, when set, are the target's."""
    if ctx.target is None:
        return [Check("arch-lists", "skip", "no target")]
    wanted = {"TORCH_CUDA_ARCH_LIST": ctx.target.torch_cuda_arch_list,
              "FLASHINFER_CUDA_ARCH_LIST": ctx.target.flashinfer_cuda_arch_list}
    wrong = [f"{k}={os.environ[k]!r}" for k, v in wanted.items() if os.environ.get(k, v) != v]
    if wrong:
        fix = "export " + " ".join(f"{k}='{v}'" for k, v in wanted.items())
        return [Check("arch-lists", "warn", f"{', '.join(wrong)} do not match {ctx.target.name}", fix)]
    shown = ", ".join(f"{k}={os.environ[k]}" for k in wanted if k in os.environ)
    return [Check("arch-lists", "ok", shown or "unset (JIT for the GPU at hand)")]


def check_toolchain(ctx: Context) -> list[Check]:
    """What Triton's JIT needs: Python.h, a C compiler, libcuda."""
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    checks = [Check("python-headers", "ok", str(header)) if header.is_file() else
              Check("python-headers", "FAIL", f"{header} is missing (Triton's JIT builds a C module)",
                    HEADERS_REMEDY.format(target=ctx.target_name))]
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    checks.append(Check("c-compiler", "ok", cc) if cc and shutil.which(cc) else
                  Check("c-compiler", "FAIL", f"no C compiler (CC={os.environ.get('CC', 'unset')}, no gcc/clang)",
                        "install gcc or set CC"))
    if not ctx.gpus.gpus:
        return [*checks, Check("libcuda", "skip", "no GPU")]
    where = _libcuda_source()
    checks.append(Check("libcuda", "ok", f"libcuda.so found via {where}") if where else
                  Check("libcuda", "FAIL", "no libcuda.so in TRITON_LIBCUDA_PATH, the ldconfig cache "
                        "or LD_LIBRARY_PATH", LIBCUDA_REMEDY))
    return checks


def _libcuda_source() -> str | None:
    """Where Triton would find libcuda (its own order: env, ldconfig cache, LD_LIBRARY_PATH)."""
    libdir = os.environ.get("TRITON_LIBCUDA_PATH")
    if libdir:
        return f"TRITON_LIBCUDA_PATH={libdir}" if any(Path(libdir).glob("libcuda.so*")) else None
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listing, _ = gpuinfo.run_tool([ldconfig, "-p"]) if Path(ldconfig).exists() else (None, None)
    if listing and "libcuda.so.1" in listing:
        return "the ldconfig cache"
    for directory in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        if any(Path(directory).glob("libcuda.so*")):
            return f"LD_LIBRARY_PATH ({directory})"
    return None


def check_triton_kernel(ctx: Context) -> list[Check]:
    """A Triton kernel compiles (fresh cache) and computes the right values on the GPU."""
    if not ctx.gpus.gpus:
        return [Check("triton-kernel", "skip", "no GPU")]
    if installed_version("triton") is None or installed_version("torch") is None:
        return [Check("triton-kernel", "skip", "torch or triton not installed")]
    with tempfile.TemporaryDirectory() as cache:
        ok, output = run_probe(TRITON_PROBE, timeout=300, env={"TRITON_CACHE_DIR": cache})
    if ok:
        return [Check("triton-kernel", "ok", _last_line(output))]
    return [Check("triton-kernel", "FAIL", *diagnose_triton(output, ctx.target_name))]


def _site_of(distribution: str) -> Path | None:
    try:
        return Path(str(importlib.metadata.distribution(distribution).locate_file("")))
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang(ctx: Context) -> list[Check]:
    """The DDTree patch series, the serving stubs, and ``import sglang.launch_server``."""
    site = _site_of("sglang")
    if site is None:
        return [Check(n, "skip", "sglang not installed") for n in ("sglang-patched", "serve-stubs", "sglang-import")]
    return [_patch_state(site), _stubs(ctx), _sglang_import()]


def _patch_state(site: Path) -> Check:
    if not (REPO_ROOT / "repro" / "patch.py").is_file():
        return Check("sglang-patched", "warn", "unknown: patch tooling not found", "use a full repro checkout")
    done = run_patch_check(site)
    summary = re.search(r"(\d+)/(\d+) patches applied", done.stdout)
    if done.returncode != 0 or summary is None:
        return Check("sglang-patched", "FAIL",
                     f"`repro patch check` failed: {_last_line(done.stderr or done.stdout)}",
                     f"`repro install-offline DIR --force`, then `repro patch apply --site {site}`")
    applied, total = int(summary[1]), int(summary[2])
    detail = f"{applied}/{total} DDTree patches applied at {site}"
    if applied == total:
        return Check("sglang-patched", "ok", detail)
    return Check("sglang-patched", "FAIL", detail, f"repro patch apply --site {site}")


def _stubs(ctx: Context) -> Check:
    stubs = []
    for name in ctx.stack.wheelhouse.stubs:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and "__repro_stub__" in Path(spec.origin).read_text(errors="replace"):
            stubs.append(name)
    if not stubs:
        return Check("serve-stubs", "ok", f"none: {', '.join(ctx.stack.wheelhouse.stubs)} are real or absent")
    return Check("serve-stubs", "ok", f"{', '.join(stubs)} are stubs: serve with --grammar-backend none")


def _sglang_import() -> Check:
    ok, output = run_probe("import sglang.launch_server\n", timeout=240)
    if ok:
        return Check("sglang-import", "ok", "import sglang.launch_server works")
    return Check("sglang-import", "FAIL", _last_line(output),
                 "fix the first error of `python -c 'import sglang.launch_server'`")


def check_cubins(ctx: Context) -> list[Check]:
    """The sglang-kernel libraries the loader picks carry SASS for the GPU (or the target)."""
    site = _site_of("sglang-kernel")
    if site is None:
        return [Check("sgl-kernel-cubins", "skip", "sglang-kernel not installed")]
    if ctx.target is None:
        return [Check("sgl-kernel-cubins", "skip", "no target")]
    caps = (ctx.capability,) if ctx.capability else ctx.target.capabilities
    required = ctx.target.sgl_kernel_libs
    libraries = {lib: fatbin.scan_library(site / lib) for lib in required if (site / lib).is_file()}
    bad = [c for c in fatbin.coverage(libraries, required, caps) if c.verdict != "ok"]
    if not bad:
        shown = ", ".join(format_capability(c) for c in caps)
        return [Check("sgl-kernel-cubins", "ok", f"SASS for {shown} in {len(libraries)} libraries the loader uses")]
    first = bad[0]
    why = "is missing" if not first.present else f"has no SASS for {format_capability(first.capability)}"
    return [Check("sgl-kernel-cubins", "FAIL", f"{first.library} {why} ({len(bad)} gaps)",
                  "install an sglang-kernel built for this GPU (a wheelhouse trimmed for another target lacks it)")]


CHECKS: tuple[Callable[[Context], list[Check]], ...] = (
    check_gpu, check_target, check_topology, check_versions, check_arch_lists, check_toolchain,
    check_triton_kernel, check_sglang, check_cubins,
)


def context(stack: Stack, target_name: str | None) -> Context:
    """Query the GPUs and settle the target (``--target`` wins over detection)."""
    gpus = gpuinfo.query_gpus()
    if target_name:
        return Context(stack, gpus, stack.target(target_name), "from --target")
    cap = gpus.gpus[0].capability if gpus.gpus else None
    if cap is None:
        return Context(stack, gpus, None, "no GPU to detect it from and no --target")
    found = stack.detect(cap)
    shown = format_capability(cap)
    note = f"detected from capability {shown}" if found else f"no pinned target for capability {shown}"
    return Context(stack, gpus, found, note)


def main(args: argparse.Namespace) -> int:
    """Run every check; print one line each (or JSON); exit 1 on any FAIL."""
    stack = load_stack()
    try:
        ctx = context(stack, args.target)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    checks = [check for group in CHECKS for check in group(ctx)]
    failed = any(c.verdict == "FAIL" for c in checks)
    if args.json:
        report = {"target": ctx.target.name if ctx.target else None, "target_note": ctx.target_note,
                  "ok": not failed, "checks": [asdict(c) for c in checks], "fingerprint": fingerprint(stack)}
        print(json.dumps(report, indent=1))
        return 1 if failed else 0
    print(f"repro doctor: target {ctx.target.name if ctx.target else 'none'} ({ctx.target_note})")
    for c in checks:
        remedy = f"  -> {c.remedy}" if c.remedy and c.verdict != "ok" else ""
        print(f"{c.verdict:<5} {c.name:<18} {c.detail}{remedy}")
    counts = {v: sum(c.verdict == v for c in checks) for v in ("FAIL", "warn", "ok", "skip")}
    print(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return 1 if failed else 0
