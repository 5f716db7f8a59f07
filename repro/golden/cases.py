"""The golden set: seeded DDTree cases, their stored outputs, and the manifest that pins them.

A case is one safetensors file holding its inputs (drafter logits, roots, prefix lengths, the
target's tokens per node) and every output the spec defines (tree, positions, masks, pointers,
walk, emission). ``derive`` recomputes the outputs with the batched code or with the heap
oracle, so a check proves both paths against the stored bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from repro.ddtree import build_trees as build_batched
from repro.ddtree import emitted_tokens, positions, tree_pointers, verify_tensors, walk
from repro.ddtree.types import DraftTree, WalkResult
from repro.errors import UsageError
from repro.files import atomic_output, check_inside, read_json, safe_relative

MANIFEST = "manifest.json"
KIND = "ddtree-case"  # manifest entries of other kinds (kernel goldens) are checked by their tiers
KERNEL_KIND = "sglang-kernels"  # outputs of the pinned SGLang's kernels on one SM (verify/sglang)
REGEN_COMMAND = "repro golden regen"

# the spec's worked example (docs/SPEC.md §6): drafter probabilities per depth
WORKED_Q = [[0.05, 0.60, 0.25, 0.07, 0.03], [0.50, 0.04, 0.10, 0.30, 0.06], [0.08, 0.70, 0.12, 0.06, 0.04]]
WORKED_TARGETS = [[2, 0, 9, 9, 9, 9, 9], [1, 3, 9, 9, 9, 1, 4]]

OUTPUTS = (
    "tokens", "parents", "depths", "num_nodes", "scores", "positions", "ancestor_mask", "full_mask",
    "retrive_index", "retrive_next_token", "retrive_next_sibling", "accept_index", "accept_len", "bonus",
    "emitted",
)


@dataclass(frozen=True)
class CaseSpec:
    """How one case's inputs are made: a logits family, its sizes and its RNG seed."""

    name: str
    family: str  # worked-example | ties | flat | peaked | random | float | certain | tiny-vocab
    seed: int
    bs: int
    horizon: int
    vocab: int
    budget: int
    dtype: str = "float32"


def case_specs() -> list[CaseSpec]:
    """The fixed list of golden cases (the spec's worked example + seeded families)."""
    specs = [CaseSpec(f"worked-example-b{b}", "worked-example", 0, 2, 3, 5, b) for b in (1, 3, 6)]
    rng = random.Random(20261130)  # noqa: S311 - seeded case parameters, not secrets
    families = [
        ("ties", [(1, 3, 8), (2, 4, 16), (4, 15, 64), (8, 6, 256), (2, 15, 1024), (3, 9, 31)], [3, 8, 50]),
        ("flat", [(1, 2, 4), (2, 5, 30), (3, 15, 100), (1, 8, 512)], [2, 6, 40]),
        ("peaked", [(2, 15, 8), (2, 15, 15), (3, 10, 64), (1, 15, 256), (4, 15, 32)], [64, 300]),
        ("random", [(1, 1, 1), (2, 1, 7), (3, 2, 20), (4, 7, 128), (2, 15, 256), (1, 15, 512), (6, 5, 33)], [50, 2000]),
        ("float", [(3, 6, 16), (2, 15, 128), (4, 3, 64)], [100]),
        ("certain", [(2, 6, 10), (2, 15, 40), (1, 15, 200)], [4, 30]),
        ("tiny-vocab", [(2, 1, 64), (2, 2, 256), (1, 3, 1024), (2, 15, 100), (2, 4, 20)], [1, 2, 3, 5]),
        ("budget-zero", [(3, 15, 0), (1, 1, 0)], [16]),
    ]
    for family, shapes, vocabs in families:
        for i, (bs, horizon, budget) in enumerate(shapes):
            specs.extend(
                CaseSpec(f"{family}-{i}-v{vocab}", family, rng.randrange(2**31), bs, horizon, vocab, budget)
                for vocab in (vocabs[:1] if budget >= 512 else vocabs)  # big trees: one vocab keeps files small
            )
    for dtype in ("bfloat16", "float16"):
        for i, (bs, horizon, budget) in enumerate([(2, 8, 32), (1, 15, 256)]):
            specs.append(CaseSpec(f"dtype-{dtype}-{i}", "random", rng.randrange(2**31), bs, horizon, 1000, budget, dtype))
    return specs


def make_inputs(spec: CaseSpec) -> dict[str, torch.Tensor]:
    """Drafter logits, roots, prefix lengths and per-node target tokens of a case."""
    g = torch.Generator().manual_seed(spec.seed)
    shape = (spec.bs, spec.horizon, spec.vocab)
    if spec.family == "worked-example":
        logits = torch.tensor(WORKED_Q).log().expand(shape).contiguous()
    else:
        logits = _family_logits(spec.family, shape, g)
    logits = logits.to(getattr(torch, spec.dtype))
    roots = torch.randint(0, spec.vocab, (spec.bs,), generator=g)
    prefix_lens = torch.randint(0, 24, (spec.bs,), generator=g)
    tree = build_batched(logits, spec.budget, roots)
    worked = spec.family == "worked-example"
    targets = torch.tensor(WORKED_TARGETS)[:, : tree.n] if worked else _target_tokens(tree, spec.vocab, g)
    return {"draft_logits": logits, "roots": roots, "prefix_lens": prefix_lens, "target_tokens": targets}


def _family_logits(family: str, shape: tuple[int, int, int], g: torch.Generator) -> torch.Tensor:
    if family in ("ties", "tiny-vocab"):
        return torch.randint(-2, 3, shape, generator=g).float()
    if family == "flat":
        return torch.zeros(shape)
    if family == "peaked":
        x = torch.round(torch.randn(shape, generator=g) * 8) / 8
        hot = torch.randint(0, shape[2], shape[:2], generator=g)
        return x.scatter_add(2, hot[..., None], torch.full((*shape[:2], 1), 8.0))
    if family == "certain":  # some rows have one token with probability 1.0 in float32
        x = torch.round(torch.randn(shape, generator=g) * 4) / 4
        rows = torch.rand(shape[:2], generator=g) < 0.5
        return torch.where(rows[..., None] & (torch.arange(shape[2]) == 0), 200.0, x)
    if family == "float":
        return torch.randn(shape, generator=g) * 3
    return torch.round(torch.randn(shape, generator=g) * 16) / 16  # random, budget-zero, dtype-*


def _target_tokens(tree: DraftTree, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Per node: a random child's token 3 times in 4 (so walks go deep), else a random token."""
    out = torch.randint(0, vocab, tree.tokens.shape, generator=g)
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    for b, row in enumerate(parents):
        children: dict[int, list[int]] = {}
        for i, p in enumerate(row):
            if p >= 0:
                children.setdefault(p, []).append(i)
        for p, kids in children.items():
            if torch.rand((), generator=g) < 0.75:
                pick = kids[int(torch.randint(0, len(kids), (), generator=g))]
                out[b, p] = tokens[b][pick]
    return out


def derive(inputs: dict[str, torch.Tensor], budget: int, path: str = "batched", device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every output of a case, computed by the batched code or by the heap oracle (on CPU)."""
    if path == "reference":
        return _derive_reference(inputs, budget)
    x = {k: v.to(device) for k, v in inputs.items()}
    tree = build_batched(x["draft_logits"], budget, x["roots"])
    prefix_sum = int(inputs["prefix_lens"].sum())
    vt = verify_tensors(tree, x["prefix_lens"], prefix_sum)
    result = walk(tree, x["target_tokens"])
    out = _outputs(tree, vt.ancestor_mask, vt.full_mask, tree_pointers(tree), result)
    out["positions"] = positions(tree, x["prefix_lens"])
    return {k: v.cpu() for k, v in out.items()}


def _outputs(
    tree: DraftTree,
    anc: torch.Tensor,
    full: torch.Tensor,
    pointers: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    result: WalkResult,
) -> dict[str, torch.Tensor]:
    index, next_token, next_sibling = pointers
    return {
        "tokens": tree.tokens, "parents": tree.parents, "depths": tree.depths, "num_nodes": tree.num_nodes,
        "scores": tree.scores, "ancestor_mask": anc, "full_mask": full, "retrive_index": index,
        "retrive_next_token": next_token, "retrive_next_sibling": next_sibling,
        "accept_index": result.accept_index, "accept_len": result.accept_len, "bonus": result.bonus,
        "emitted": emitted_tokens(tree, result),
    }


def _derive_reference(inputs: dict[str, torch.Tensor], budget: int) -> dict[str, torch.Tensor]:
    from repro.ddtree import reference as ref

    logits, roots = inputs["draft_logits"], inputs["roots"].tolist()
    lens, targets = inputs["prefix_lens"].tolist(), inputs["target_tokens"].tolist()
    trees = [ref.build_tree_reference(logits[b], budget, roots[b]) for b in range(len(roots))]
    cols: dict[str, list] = {k: [] for k in OUTPUTS}
    horizon = logits.shape[1]
    for b, t in enumerate(trees):
        parents, tokens = t.parents[0].tolist(), t.tokens[0].tolist()
        mask = ref.ancestor_mask_reference(parents)
        first, sibling = ref.pointers_reference(parents)
        path, bonus = ref.walk_reference(tokens, parents, targets[b])
        n = len(tokens)
        for k in ("tokens", "parents", "depths", "scores"):
            cols[k].append(getattr(t, k)[0])
        cols["num_nodes"].append(t.num_nodes[0])
        cols["positions"].append(t.depths[0] + lens[b])
        cols["ancestor_mask"].append(torch.tensor(mask))
        cols["full_mask"].append(torch.tensor(ref.full_mask_reference(mask, lens[b]), dtype=torch.bool))
        cols["retrive_index"].append(torch.arange(n) + b * n)
        cols["retrive_next_token"].append(torch.tensor(first))
        cols["retrive_next_sibling"].append(torch.tensor(sibling))
        pad = [-1] * (horizon + 1 - len(path))
        cols["accept_index"].append(torch.tensor(path + pad))
        cols["accept_len"].append(torch.tensor(len(path)))
        cols["bonus"].append(torch.tensor(bonus))
        cols["emitted"].append(torch.tensor([tokens[i] for i in path[1:]] + [bonus] + pad))
    out = {k: torch.stack(v) for k, v in cols.items() if k != "full_mask"}
    out["full_mask"] = torch.cat(cols["full_mask"])
    return out


SCORE_ATOL = 1e-4
"""Prefix scores computed on another backend or CPU may differ by this much: each rounds its
per-depth float32 logsumexp on its own (a few ulps of |lse| <= 32, summed over <= 15 depths; an
AVX-512 Xeon's torch.logsumexp differs by one ulp from the machine that wrote the golden set).
Trees, masks, pointers and walks are still compared exactly."""


def mismatches(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], score_atol: float = 0.0) -> list[str]:
    """Names of outputs that differ (shape, dtype or any value; NaN-free by construction).

    ``score_atol`` > 0 (use SCORE_ATOL) lets prefix scores move by lse rounding; trees, masks,
    pointers and walks must still match exactly.
    """
    bad = []
    for k in OUTPUTS:
        e, g = expected[k], got[k]
        if e.shape != g.shape or e.dtype != g.dtype:
            bad.append(k)
        elif k == "scores" and score_atol > 0:
            if not torch.allclose(e, g, rtol=0.0, atol=score_atol, equal_nan=False):
                bad.append(k)
        elif not torch.equal(e, g):
            bad.append(k)
    return bad


_BITS, _SHAPE = ".packbits", ".shape"


def _pack(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool tensor -> (uint8 bits, 8 per byte little-endian; int64 shape)."""
    flat = mask.reshape(-1).to(torch.uint8)
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)])
    bits = (flat.view(-1, 8) << torch.arange(8, dtype=torch.uint8)).sum(1, dtype=torch.uint8)
    return bits, torch.tensor(mask.shape, dtype=torch.int64)


def _unpack(bits: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """Inverse of _pack."""
    flat = ((bits[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(-1).bool()
    dims = shape.tolist()
    return flat[: int(torch.tensor(dims).prod())].reshape(dims)


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


FAMILIES = ("worked-example", "ties", "flat", "peaked", "random", "float", "certain", "tiny-vocab",
            "budget-zero")
DTYPES = ("float32", "bfloat16", "float16")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_INPUTS = ("draft_logits", "roots", "prefix_lens", "target_tokens")


def load_manifest(golden_dir: Path) -> dict:
    """The parsed manifest.json of a golden directory, every entry checked (a UsageError naming
    the entry and key otherwise), so a check never trips over a hand-edited manifest."""
    path = golden_dir / MANIFEST
    data = read_json(path, "golden manifest")
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        msg = f"{path}: must be an object with a 'cases' list"
        raise UsageError(msg)
    for i, entry in enumerate(data["cases"]):
        _check_entry(entry, f"{path}: cases[{i}]")
    return data


def _check_entry(entry: object, where: str) -> None:
    def fail(problem: str) -> None:
        msg = f"{where}: {problem}"
        raise UsageError(msg)

    if not isinstance(entry, dict):
        fail(f"must be an object (got {entry!r:.60})")
    for key in ("name", "kind", "file"):
        if not isinstance(entry.get(key), str):
            fail(f"key '{key}' must be a string (got {entry.get(key)!r:.60})")
    if not safe_relative(entry["file"]):
        fail(f"key 'file' must be a path inside the golden directory (got {entry['file']!r})")
    if not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"]):
        fail(f"key 'sha256' must be 64 hex digits (got {entry.get('sha256')!r:.70})")
    if entry["kind"] == KERNEL_KIND and not isinstance(entry.get("sm"), str):
        fail(f"key 'sm' must be a string like \"90\" (got {entry.get('sm')!r:.20})")
    if entry["kind"] == KIND:
        _check_spec(entry.get("spec"), fail)


def _check_spec(spec: object, fail: Callable[[str], None]) -> None:
    names = {f.name for f in fields(CaseSpec)}
    if not isinstance(spec, dict) or not set(spec) <= names or not names - {"dtype"} <= set(spec):
        fail(f"key 'spec' must be an object with the keys {', '.join(sorted(names))} (got {spec!r:.80})")
    ints = {"seed": 0, "bs": 1, "horizon": 1, "vocab": 1, "budget": 0}
    for key, low in ints.items():
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            fail(f"key 'spec.{key}' must be an integer >= {low} (got {value!r:.30})")
    if spec["family"] not in FAMILIES or spec.get("dtype", "float32") not in DTYPES or \
            not isinstance(spec["name"], str):
        fail(f"key 'spec' has an unknown family, dtype or name (family must be one of "
             f"{', '.join(FAMILIES)}; dtype one of {', '.join(DTYPES)})")


def iter_cases(golden_dir: Path) -> Iterator[tuple[dict, CaseSpec]]:
    """(manifest entry, spec) for every DDTree case in the manifest."""
    for entry in load_manifest(golden_dir)["cases"]:
        if entry.get("kind") == KIND:
            yield entry, CaseSpec(**entry["spec"])


def kernel_entries(golden_dir: Path) -> list[dict]:
    """Manifest entries of the SGLang kernel goldens (one file per SM target)."""
    return [e for e in load_manifest(golden_dir)["cases"] if e.get("kind") == KERNEL_KIND]


def load_kernel_golden(golden_dir: Path, sm: str) -> dict[str, torch.Tensor] | None:
    """The stored kernel outputs for ``sm`` (e.g. "90"), hash-checked; None when there are none."""
    from safetensors.torch import load_file

    for entry in kernel_entries(golden_dir):
        if entry["sm"] == sm:
            path = golden_dir / entry["file"]
            if sha256(path) != entry["sha256"]:
                msg = f"{entry['file']}: sha256 differs from {MANIFEST}"
                raise ValueError(msg)
            return load_file(str(path))
    return None


def load_case(golden_dir: Path, entry: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(inputs, stored outputs) of one case."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = golden_dir / entry["file"]
    try:
        data = load_file(str(path))
        for key in [k[: -len(_BITS)] for k in data if k.endswith(_BITS)]:
            data[key] = _unpack(data.pop(key + _BITS), data.pop(key + _SHAPE))
    except (SafetensorError, OSError, KeyError, RuntimeError) as exc:
        msg = f"{path}: not a readable golden case ({type(exc).__name__}: {exc})"
        raise ValueError(msg) from None
    inputs = {k[len("in."):]: v for k, v in data.items() if k.startswith("in.")}
    outputs = {k[len("out."):]: v for k, v in data.items() if k.startswith("out.")}
    absent = [k for k in _INPUTS if k not in inputs] + [k for k in OUTPUTS if k not in outputs]
    if absent:
        msg = f"{path}: not a golden case (no tensor {absent[0]!r})"
        raise ValueError(msg)
    return inputs, outputs


def write_case(golden_dir: Path, spec: CaseSpec) -> dict:
    """Make, derive (batched, cross-checked with the oracle) and save one case; its manifest entry."""
    from safetensors.torch import save_file

    inputs = make_inputs(spec)
    outputs = derive(inputs, spec.budget)
    bad = mismatches(outputs, derive(inputs, spec.budget, "reference"))
    if bad:
        msg = f"golden case {spec.name}: batched and reference paths differ on {bad}"
        raise RuntimeError(msg)
    rel = f"tensors/{spec.name}.safetensors"
    path = golden_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    check_inside(path.parent, golden_dir, "--dir")
    tensors = {f"in.{k}": v.contiguous() for k, v in inputs.items()}
    tensors.update({f"out.{k}": v.contiguous() for k, v in outputs.items()})
    for key in [k for k, v in tensors.items() if v.dtype == torch.bool]:  # masks: 1 bit per entry
        tensors[key + _BITS], tensors[key + _SHAPE] = _pack(tensors.pop(key))
    with atomic_output(path) as tmp:  # one metadata key: stable bytes
        save_file(tensors, str(tmp), metadata={"spec": json.dumps(asdict(spec))})
    return {"name": spec.name, "kind": KIND, "file": rel, "sha256": sha256(path), "spec": asdict(spec),
            "command": f"{REGEN_COMMAND} --only {spec.name}", "seed": spec.seed}


def summarize(spec: CaseSpec, outputs: dict[str, torch.Tensor]) -> str:
    """One line describing a case, for progress output."""
    nodes = outputs["num_nodes"].tolist()
    taus = outputs["accept_len"].tolist()
    return f"{spec.name}: bs={spec.bs} L={spec.horizon} V={spec.vocab} B={spec.budget} nodes={nodes} tau={taus}"

