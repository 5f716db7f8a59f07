"""The pinned stack (``repro/data/stack.toml``) as Python objects, and a fingerprint of this machine.

``load_stack()`` validates the file once; ``Stack.target(name)`` and ``Stack.detect(capability)``
look a target up by name or by a GPU's compute capability. ``fingerprint()`` describes the machine
a result came from (package versions, torch/CUDA, GPUs, driver, SM, git revision): it never raises,
never imports torch, and costs two short subprocess calls at most, so reports and
``golden/manifest.json`` can call it freely, on a CPU-only machine too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from repro.stack import gpuinfo

STACK_TOML = Path(__file__).parents[1] / "data" / "stack.toml"
REPO_ROOT = Path(__file__).resolve().parents[2]
_NON_PACKAGE_KEYS = ("python", "cuda", "min-driver")
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")
_CUBIN_ARCH = re.compile(r"^sm_(\d+)(\d)([af]?)$")

Capability = tuple[int, int]


def parse_capability(text: str) -> Capability:
    """``"10.3"`` -> ``(10, 3)``; ValueError naming the value otherwise."""
    match = _CAPABILITY.match(text.strip())
    if not match:
        msg = f"capability must look like '9.0' (got {text!r})"
        raise ValueError(msg)
    return int(match.group(1)), int(match.group(2))


def format_capability(cap: Capability) -> str:
    """``(10, 3)`` -> ``"10.3"``."""
    return f"{cap[0]}.{cap[1]}"


@dataclass(frozen=True)
class Target:
    """One SM target: the GPUs it serves and what the stack needs for them."""

    name: str  # "sm90"
    description: str
    capabilities: tuple[Capability, ...]  # ((10, 0), (10, 3))
    torch_cuda_arch_list: str  # "10.0;10.3"
    flashinfer_cuda_arch_list: str  # "10.0a 10.3a"
    cubin_archs: tuple[str, ...]  # ("sm_100a", "sm_103a")
    attention_backend: str
    draft_attention_backend: str
    sgl_kernel_libs: tuple[str, ...]  # wheel members that must carry this target's cubins


@dataclass(frozen=True)
class Wheelhouse:
    """What an air-gapped host with torch and triton needs to serve (the ``[wheelhouse]`` table)."""

    manylinux: str  # glibc floor, "2_34"
    serve: tuple[str, ...]  # distribution names; versions come from uv.lock
    stubs: tuple[str, ...]  # import names replaced by repro/data/stubs/<name>
    trim: tuple[str, ...]  # fnmatch patterns of wheel members dropped by --trim


@dataclass(frozen=True)
class Stack:
    """The whole of ``stack.toml``."""

    python: str
    cuda: str
    min_driver: int
    packages: dict[str, str]  # distribution name -> pinned version
    targets: dict[str, Target]
    wheelhouse: Wheelhouse
    sha256: str  # of the file's bytes

    def target(self, name: str) -> Target:
        """The target called ``name``; ValueError listing the known ones otherwise."""
        if name not in self.targets:
            known = ", ".join(self.targets)
            msg = f"target must be one of {known} (got {name!r})"
            raise ValueError(msg)
        return self.targets[name]

    def detect(self, capability: Capability) -> Target | None:
        """The target serving a GPU of this compute capability, or None."""
        for target in self.targets.values():
            if capability in target.capabilities:
                return target
        return None


def _get(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in table:
        msg = f"{where}.{key} is missing"
        raise ValueError(msg)
    value = table[key]
    if not isinstance(value, kind):
        msg = f"{where}.{key} must be a {kind.__name__} (got {value!r})"
        raise ValueError(msg)
    if kind is list and not all(isinstance(v, str) for v in value):
        msg = f"{where}.{key} must be a list of strings (got {value!r})"
        raise ValueError(msg)
    return value


def _target(name: str, table: dict[str, Any]) -> Target:
    where = f"targets.{name}"
    caps = tuple(parse_capability(c) for c in _get(table, "capabilities", list, where))
    if not caps:
        msg = f"{where}.capabilities must not be empty"
        raise ValueError(msg)
    target = Target(
        name=name,
        description=_get(table, "description", str, where),
        capabilities=caps,
        torch_cuda_arch_list=_get(table, "torch-cuda-arch-list", str, where),
        flashinfer_cuda_arch_list=_get(table, "flashinfer-cuda-arch-list", str, where),
        cubin_archs=tuple(_get(table, "cubin-archs", list, where)),
        attention_backend=_get(table, "attention-backend", str, where),
        draft_attention_backend=_get(table, "draft-attention-backend", str, where),
        sgl_kernel_libs=tuple(_get(table, "sgl-kernel-libs", list, where)),
    )
    # the arch lists' agreement with the capabilities is checked by repro.stack.lockcheck.target_problems
    for arch in target.cubin_archs:
        if not _CUBIN_ARCH.match(arch):
            msg = f"{where}.cubin-archs entries must look like 'sm_90a' (got {arch!r})"
            raise ValueError(msg)
    return target


def parse_stack(text: str) -> Stack:
    """Validate ``stack.toml`` text; ValueError naming the first bad key."""
    data = tomllib.loads(text)
    stack = _get(data, "stack", dict, "stack.toml")
    for key, value in stack.items():
        if not isinstance(value, str):
            msg = f"stack.{key} must be a version string (got {value!r})"
            raise ValueError(msg)
    min_driver = _get(stack, "min-driver", str, "stack")
    if not min_driver.isdigit():
        msg = f"stack.min-driver must be a driver major version like '580' (got {min_driver!r})"
        raise ValueError(msg)
    targets = _get(data, "targets", dict, "stack.toml")
    if not targets:
        msg = "stack.toml must define at least one [targets.*] table"
        raise ValueError(msg)
    house = _get(data, "wheelhouse", dict, "stack.toml")
    return Stack(
        python=_get(stack, "python", str, "stack"),
        cuda=_get(stack, "cuda", str, "stack"),
        min_driver=int(min_driver),
        packages={k: v for k, v in stack.items() if k not in _NON_PACKAGE_KEYS},
        targets={name: _target(name, table) for name, table in targets.items()},
        wheelhouse=Wheelhouse(
            manylinux=_get(house, "manylinux", str, "wheelhouse"),
            serve=tuple(_get(house, "serve", list, "wheelhouse")),
            stubs=tuple(_get(house, "stubs", list, "wheelhouse")),
            trim=tuple(_get(house, "trim", list, "wheelhouse")),
        ),
        sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


@lru_cache(maxsize=4)
def load_stack(path: Path = STACK_TOML) -> Stack:
    """The validated stack file (``repro/data/stack.toml`` unless told otherwise)."""
    return parse_stack(path.read_text())


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution on this interpreter's path, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` of the installed torch, read from its file without importing torch."""
    try:
        version_py = importlib.metadata.distribution("torch").locate_file("torch/version.py")
        text = Path(str(version_py)).read_text()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def git_revision(repo: Path = REPO_ROOT) -> dict[str, Any] | None:
    """``{"revision": sha, "dirty": bool}`` of the checkout, or None outside a git checkout.

    ``$REPRO_GIT_REVISION``, when set, names the revision instead (a tree shipped to a GPU machine
    may carry a stale ``.git``); it is reported with ``dirty`` None (unknown).
    """
    if os.environ.get("REPRO_GIT_REVISION"):
        return {"revision": os.environ["REPRO_GIT_REVISION"], "dirty": None}
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # read-only: never refresh the index
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, env=env, check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, env=env, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": rev, "dirty": bool(status.strip())}


def fingerprint(stack: Stack | None = None) -> dict[str, Any]:
    """Where a result came from: stack pins, installed versions, torch/CUDA, GPUs, driver, SM, git.

    Missing pieces are None or empty, never an exception.
    """
    try:
        stack = stack or load_stack()
    except (OSError, ValueError):
        stack = None
    pinned = stack.packages if stack else {}
    gpus = gpuinfo.query_gpus()
    sm = sorted({f"sm_{g.capability[0]}{g.capability[1]}" for g in gpus.gpus if g.capability})
    target = None
    if stack and gpus.gpus and gpus.gpus[0].capability:
        detected = stack.detect(gpus.gpus[0].capability)
        target = detected.name if detected else None
    return {
        "stack_sha256": stack.sha256 if stack else None,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "packages": {name: installed_version(name) for name in pinned},
        "torch_cuda": torch_cuda_version(),
        "gpus": [g.as_dict() for g in gpus.gpus],
        "driver": gpus.driver,
        "sm": sm,
        "target": target,
        "git": git_revision(),
    }
