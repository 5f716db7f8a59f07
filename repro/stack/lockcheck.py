"""Offline consistency checks of the pinned stack.

Each ``*_problems`` function takes parsed files and returns one line per problem (empty when
consistent): ``flake.lock`` against the inputs ``flake.nix`` declares, ``uv.lock`` and the ``gpu``
extra against the pinned stack (:mod:`repro.stack.pins`), and each evaluated devShell's environment
against its target. Reading the files and running ``nix`` is the caller's business (``verify/cpu``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from repro.stack.pins import Stack, Target, format_capability

GPU_EXTRA = "gpu"  # the pyproject.toml extra that is the pinned stack
# The only host driver libraries a shell links into its private directory (never all of /usr/lib).
DRIVER_LIBS = (
    "libcuda.so*",
    "libnvidia-ml.so*",
    "libnvidia-ptxjitcompiler.so*",
    "libnvidia-nvvm.so*",
)

_REV = re.compile(r"[0-9a-f]{40}")
_NAR_HASH = re.compile(r"sha256-[A-Za-z0-9+/]{43}=")
_FILE_HASH = re.compile(r"sha256:[0-9a-f]{64}")


def parse_flake_url(url: str) -> dict[str, str]:
    """The ``original`` lock node Nix records for a flake URL (``github:owner/repo[/ref]``)."""
    if url.startswith("github:"):
        parts = url.removeprefix("github:").split("/")
        if len(parts) not in (2, 3):
            msg = f"flake input url must be github:owner/repo[/ref] (got {url!r})"
            raise ValueError(msg)
        original = {"owner": parts[0], "repo": parts[1], "type": "github"}
        if len(parts) == 3:
            original["ref"] = parts[2]
        return original
    kind, _, rest = url.partition(":")
    return {"type": kind, "url": rest}


def _leaks(node: Mapping[str, Any]) -> bool:
    """Whether a lock node points at a local path (a lock written while overriding with stubs)."""
    for key in ("locked", "original"):
        ref = node.get(key, {})
        if ref.get("type") == "path" or any(
            isinstance(v, str) and (v.startswith(("path:", "/", "file:")) or "/nix/store/" in v)
            for v in ref.values()
        ):
            return True
    return False


def _locked_problems(name: str, node: Mapping[str, Any]) -> list[str]:
    locked, original = node.get("locked", {}), node.get("original", {})
    problems = []
    if not _REV.fullmatch(str(locked.get("rev", ""))):
        problems.append(
            f"flake.lock: {name}.locked.rev must be 40 hex digits (got {locked.get('rev')!r})"
        )
    if not _NAR_HASH.fullmatch(str(locked.get("narHash", ""))):
        problems.append(
            f"flake.lock: {name}.locked.narHash must be SRI sha256 (got {locked.get('narHash')!r})"
        )
    if not isinstance(locked.get("lastModified"), int):
        problems.append(f"flake.lock: {name}.locked.lastModified must be an integer")
    problems += [
        f"flake.lock: {name}.locked.{key} must equal original's {original.get(key)!r}"
        f" (got {locked.get(key)!r})"
        for key in ("type", "owner", "repo")
        if locked.get(key) != original.get(key)
    ]
    return problems


def flake_lock_problems(inputs: Mapping[str, Any], lock: Mapping[str, Any]) -> list[str]:
    """Problems of ``lock`` (flake.lock) against ``inputs`` (``(import ./flake.nix).inputs``).

    ``--override-input`` hides a stale lock from Nix itself, so this is checked on its own.
    """
    nodes = lock.get("nodes", {})
    if lock.get("version") != 7 or lock.get("root") not in nodes:
        return [
            f"flake.lock: expected version 7 with a root node (got version {lock.get('version')!r})"
        ]
    problems = [
        f"flake.lock: node {n} holds a local path (a lock written with path: overrides)"
        for n, node in nodes.items()
        if _leaks(node)
    ]
    root_inputs = nodes[lock["root"]].get("inputs", {})
    problems += [
        f"flake.lock: locks input {name}, which flake.nix does not declare"
        for name in sorted(set(root_inputs) - set(inputs))
    ]
    reached = {lock["root"]}
    for name, spec in sorted(inputs.items()):
        key = root_inputs.get(name)
        if not isinstance(key, str) or key not in nodes:
            problems.append(
                f"flake.lock: input {name} of flake.nix has no lock node (run `nix flake lock`)"
            )
            continue
        reached.add(key)
        node = nodes[key]
        expected = parse_flake_url(spec["url"])
        if node.get("original") != expected:
            problems.append(
                f"flake.lock: {name}.original must be {expected} (got {node.get('original')})"
            )
        problems += _locked_problems(name, node)
        for sub, sub_spec in sorted(spec.get("inputs", {}).items()):
            want = sub_spec["follows"].split("/")
            got = node.get("inputs", {}).get(sub)
            if got != want:
                problems.append(f"flake.lock: {name}.inputs.{sub} must follow {want} (got {got})")
    for name in sorted(set(nodes) - reached):
        problems.append(f"flake.lock: node {name} is not reachable from the root inputs")
    return problems


def _cp312_tag(python_tag: str, abi: str) -> bool:
    if python_tag == "cp312":
        return True
    if python_tag.startswith("cp3") and abi == "abi3":
        return int(python_tag[3:]) <= 12
    return python_tag.startswith("py3") and int(python_tag[3:] or 0) <= 12


def _cp312_linux_wheel(filename: str) -> bool:
    """Whether a wheel's tags install on CPython 3.12, manylinux x86_64."""
    pythons, abi, platform = filename.removesuffix(".whl").split("-")[-3:]
    platform_ok = platform == "any" or any(
        p.endswith("_x86_64") and p.startswith(("manylinux", "linux")) for p in platform.split(".")
    )
    return (
        abi in ("none", "abi3", "cp312")
        and platform_ok
        and any(_cp312_tag(t, abi) for t in pythons.split("."))
    )


def _file_problems(pkg: Mapping[str, Any]) -> list[str]:
    files = list(pkg.get("wheels", [])) + ([pkg["sdist"]] if "sdist" in pkg else [])
    bad = [
        f.get("url", f.get("filename", "?")).rsplit("/", 1)[-1]
        for f in files
        if not _FILE_HASH.fullmatch(str(f.get("hash", "")))
    ]
    if not files:
        return [f"uv.lock: {pkg['name']} {pkg['version']} has no files"]
    return [f"uv.lock: {pkg['name']} file {name} lacks a sha256 hash" for name in bad]


def uv_lock_problems(
    stack: Stack, pyproject: Mapping[str, Any], uvlock: Mapping[str, Any]
) -> list[str]:
    """Problems of uv.lock and pyproject's ``gpu`` extra against stack.toml's pins."""
    pins = stack.packages
    problems = []
    extra = pyproject["project"].get("optional-dependencies", {}).get(GPU_EXTRA, [])
    want_extra = sorted(f"{name}=={version}" for name, version in pins.items())
    if sorted(extra) != want_extra:
        problems.append(
            f"pyproject.toml: extra {GPU_EXTRA} must be {want_extra} (got {sorted(extra)})"
        )
    packages = uvlock.get("package", [])
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for pkg in packages:
        by_name.setdefault(pkg["name"], []).append(pkg)
        if "registry" in pkg.get("source", {}):
            problems += _file_problems(pkg)
    for name, version in pins.items():
        found = by_name.get(name, [])
        versions = [p["version"] for p in found]
        if versions != [version]:
            problems.append(f"uv.lock: {name} must be locked once, at {version} (got {versions})")
        elif not any(
            _cp312_linux_wheel(w["url"].rsplit("/", 1)[-1]) for w in found[0].get("wheels", [])
        ):
            problems.append(f"uv.lock: {name} {version} has no cp312 manylinux x86_64 wheel")
    toolkit = [p["version"] for p in by_name.get("cuda-toolkit", [])]
    if [v.rsplit(".", 1)[0] for v in toolkit] != [stack.cuda]:
        problems.append(f"uv.lock: cuda-toolkit must be one {stack.cuda}.x wheel (got {toolkit})")
    project = next((p for p in packages if p["name"] == pyproject["project"]["name"]), None)
    requested = {
        (r["name"], r.get("specifier"))
        for r in (project or {}).get("metadata", {}).get("requires-dist", [])
        if r.get("marker") == f"extra == '{GPU_EXTRA}'"
    }
    stale = sorted(f"{n}=={v}" for n, v in pins.items() if (n, f"=={v}") not in requested)
    if stale:
        problems.append(f"uv.lock: was not locked from these gpu pins (run `uv lock`): {stale}")
    return problems


def target_problems(targets: Mapping[str, Target]) -> list[str]:
    """Problems of stack.toml's targets: arch lists must follow from the capabilities."""
    problems = []
    for name, t in sorted(targets.items()):
        caps = [format_capability(c) for c in t.capabilities]
        want = {
            "torch-cuda-arch-list": (t.torch_cuda_arch_list, ";".join(caps)),
            "flashinfer-cuda-arch-list": (
                t.flashinfer_cuda_arch_list,
                " ".join(f"{c}a" for c in caps),
            ),
        }
        for key, (got, value) in want.items():
            if got != value:
                problems.append(f"stack.toml: targets.{name}.{key} must be {value!r} (got {got!r})")
    return problems


def shell_env_problems(stack: Stack, shells: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Problems of the evaluated devShells' environments against stack.toml."""
    problems = [
        f"flake: no devShell for target {n}" for n in sorted(set(stack.targets) - set(shells))
    ]
    for name in sorted(set(stack.targets) & set(shells)):
        t, env = stack.targets[name], shells[name]
        want = {
            "REPRO_TARGET": name,
            "REPRO_CAPABILITIES": " ".join(format_capability(c) for c in t.capabilities),
            "TORCH_CUDA_ARCH_LIST": t.torch_cuda_arch_list,
            "FLASHINFER_CUDA_ARCH_LIST": t.flashinfer_cuda_arch_list,
            "REPRO_DRIVER_LIBS": " ".join(DRIVER_LIBS),
        }
        for key, value in want.items():
            if env.get(key) != value:
                problems.append(f"devShells.{name}: {key} must be {value!r} (got {env.get(key)!r})")
        suffixes = {
            "CC": "/bin/cc",
            "TRITON_PTXAS_PATH": "/bin/ptxas",
            "C_INCLUDE_PATH": f"/include/python{stack.python}",
            "CUDA_HOME": f"-cuda-home-{stack.cuda}",
        }
        for key, suffix in suffixes.items():
            value = env.get(key) or ""
            if not (value.startswith("/nix/store/") and value.endswith(suffix)):
                problems.append(
                    f"devShells.{name}: {key} must be a store path ending {suffix} (got {value!r})"
                )
    return problems
