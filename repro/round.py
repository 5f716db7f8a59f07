"""One DDTree round, composed once for every engine: the toy (``repro.toy``) and SGLang's worker.

    drafted  = engine.draft(tail)       # drafter pass; tail: top-K -> tree -> verify inputs
    logits   = engine.target(drafted)   # one target forward over the N = B + 1 nodes per request
    tokens   = engine.choose(logits)    # the target's token per node: argmax, or its sampling rule
    accepted = accept(tree, tokens)     # walk + commit: path, tau, bonus, emission, KV window
    engine.commit(drafted, accepted)    # the engine's own bookkeeping (drafter KV, scheduler)

The engine decides *where* the tail runs: SGLang captures it in the drafter's CUDA graph (so a
round launches no tree kernel from the host), the toy calls it eagerly. Everything the tail and
``accept`` compute comes from ``repro.ddtree`` (the torch path) or ``repro.kernels`` (the fused
Triton kernels), chosen here and nowhere else (``REPRO_DDTREE_KERNELS``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Protocol

import torch

from repro.ddtree import NOT_ACCEPTED, DraftTree, TopK, WalkResult, build_trees_from_topk, merge_topk, topk_logprobs
from repro.ddtree.accept import Accepted, SlotTable, commit_width
from repro.ddtree.accept import accept as accept_torch
from repro.ddtree.tensors import tree_inputs

KERNELS_ENV = "REPRO_DDTREE_KERNELS"
MODES = ("auto", "fused", "torch")

# all_gather(t) -> the tensors every tensor-parallel rank passed, in rank order
AllGather = Callable[[torch.Tensor], list[torch.Tensor]]


def kernels_mode() -> str:
    """The path chosen by REPRO_DDTREE_KERNELS: auto (default), fused or torch."""
    mode = os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        msg = f"{KERNELS_ENV} must be one of {', '.join(MODES)} (got {mode!r})"
        raise ValueError(msg)
    return mode


@cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_kernels(device: torch.device, *, fits: bool) -> bool:
    """Whether a step runs the fused kernels: forced by the mode, else on CUDA when they fit."""
    mode = kernels_mode()
    if mode != "auto":
        return mode == "fused"
    return device.type == "cuda" and fits and _has_triton()


def topk(logits: torch.Tensor, k: int) -> TopK:
    """Top-``k`` and lse of each row of (one vocabulary shard's) logits [bs, L, V_shard]."""
    from repro.kernels.topk_lse import MAX_K

    k = min(k, logits.shape[-1])
    if not use_kernels(logits.device, fits=k <= MAX_K):
        return topk_logprobs(logits, k)
    from repro.kernels.topk_lse import topk_lse

    values, ids, lse = topk_lse(logits, k)
    return TopK(values, ids, lse, logits.shape[-1])


@dataclass(frozen=True)
class Drafted:
    """A drafter pass turned into verify inputs: what the target forward and the walk read."""

    tree: DraftTree
    input_ids: torch.Tensor  # [bs*N] int64
    positions: torch.Tensor  # [bs*N] int64 prefix + depth
    mask: torch.Tensor  # flat FULL mask whose ancestor blocks the tail wrote (prefix columns untouched)


@dataclass(frozen=True)
class DraftBuffers:
    """Preallocated outputs of the tail for up to ``capacity`` requests (CUDA-graph static)."""

    tree: DraftTree
    input_ids: torch.Tensor
    positions: torch.Tensor
    _views: dict[tuple[int, int, int], Drafted] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def empty(cls, capacity: int, budget: int, horizon: int, device: torch.device | str) -> DraftBuffers:
        """Uninitialised buffers for ``capacity`` requests of N = budget + 1 rows."""
        n = budget + 1
        i64 = {"dtype": torch.int64, "device": device}
        tree = DraftTree(
            tokens=torch.empty(capacity, n, **i64), parents=torch.empty(capacity, n, **i64),
            depths=torch.empty(capacity, n, **i64), num_nodes=torch.empty(capacity, **i64),
            scores=torch.empty(capacity, n, dtype=torch.float64, device=device),
            budget=budget, horizon=horizon, has_root=True,
        )
        return cls(tree, torch.empty(capacity * n, **i64), torch.empty(capacity * n, **i64))

    def drafted(self, bs: int, mask: torch.Tensor) -> Drafted:
        """What a graph replay of the tail wrote for the first ``bs`` requests, as a ``Drafted``
        (its views made once per ``bs``: a round slices nothing on the host)."""
        key = (bs, mask.data_ptr(), mask.numel())
        if key not in self._views:
            t, n = self.tree, self.tree.tokens.shape[1]
            tree = DraftTree(t.tokens[:bs], t.parents[:bs], t.depths[:bs], t.num_nodes[:bs], t.scores[:bs],
                             t.budget, t.horizon, t.has_root)
            self._views[key] = Drafted(tree, self.input_ids[: bs * n], self.positions[: bs * n], mask)
        return self._views[key]


class DraftTail:
    """Top-K -> tree -> verify inputs of one drafter pass (docs/SPEC.md §2-3).

    Runs wherever the engine puts it (inside a CUDA graph too: no host sync, fixed shapes, and
    with ``out`` no output allocation). ``logits`` are the drafter rows of this rank's vocabulary
    shard, [bs, L, V_shard] in any float dtype (bf16 straight from the LM head is read once).
    """

    def __init__(self, budget: int, horizon: int, vocab_size: int) -> None:
        self.budget, self.horizon, self.vocab_size = budget, horizon, vocab_size
        self.k = max(1, min(budget, vocab_size))

    @property
    def n(self) -> int:
        """Verify rows per request, N = B + 1."""
        return self.budget + 1

    def topk(self, logits: torch.Tensor, *, id_offset: int = 0, all_gather: AllGather | None = None) -> TopK:
        """The shard's top-K with global ids, merged across ranks when ``all_gather`` is given."""
        part = topk(logits, self.k)
        part = TopK(part.logits, part.ids + id_offset if id_offset else part.ids, part.lse, self.vocab_size)
        if all_gather is None:
            return part
        gathered = [all_gather(t.contiguous()) for t in (part.logits, part.ids, part.lse)]
        parts = [TopK(lg, ids, lse, self.vocab_size) for lg, ids, lse in zip(*gathered, strict=True)]
        return merge_topk(parts, self.k)

    def tree(self, top: TopK, roots: torch.Tensor, out: DraftTree | None = None) -> DraftTree:
        """The B best prefixes of the drafter's marginals, best first (fused or torch)."""
        from repro.kernels.tree_build import MAX_BUDGET, build_trees_fused

        if self.budget >= 1 and use_kernels(roots.device, fits=self.budget <= MAX_BUDGET):
            return build_trees_fused(top, self.budget, roots, out=out)
        tree = build_trees_from_topk(top, self.budget, roots)
        return tree if out is None else _copy_tree(tree, out)

    def inputs(
        self, tree: DraftTree, prefix_lens: torch.Tensor, mask_out: torch.Tensor, out: DraftBuffers | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, positions) of the verify forward; the ancestor blocks go into ``mask_out``."""
        from repro.kernels.tree_build import tree_inputs_fused

        bufs = None if out is None else (out.input_ids, out.positions)
        if use_kernels(tree.device, fits=True):
            return tree_inputs_fused(tree, prefix_lens, mask_out, out=bufs)
        ids, pos = tree_inputs(tree, prefix_lens, mask_out)
        if bufs is None:
            return ids, pos
        m = ids.numel()
        return bufs[0][:m].copy_(ids), bufs[1][:m].copy_(pos)

    def __call__(
        self,
        logits: torch.Tensor,
        roots: torch.Tensor,
        prefix_lens: torch.Tensor,
        mask_out: torch.Tensor,
        *,
        id_offset: int = 0,
        all_gather: AllGather | None = None,
        out: DraftBuffers | None = None,
        rank0_out: torch.Tensor | None = None,
    ) -> Drafted:
        """The whole tail: ``roots`` [bs] are the bonus tokens, ``prefix_lens`` [bs] committed lengths;
        ``rank0_out`` [>= bs, L] int64, when given, receives each depth's rank-0 token (what an
        acceptance recording needs for the DFLASH chain, ``repro.recording``)."""
        top = self.topk(logits, id_offset=id_offset, all_gather=all_gather)
        if rank0_out is not None:
            rank0_out[: top.ids.shape[0]].copy_(top.ids[..., 0])
        tree = self.tree(top, roots, None if out is None else out.tree)
        ids, pos = self.inputs(tree, prefix_lens, mask_out, out)
        return Drafted(tree, ids, pos, mask_out)


def _copy_tree(tree: DraftTree, out: DraftTree) -> DraftTree:
    bs = tree.bs
    fields = ("tokens", "parents", "depths", "num_nodes", "scores")
    views = {f: getattr(out, f)[:bs].copy_(getattr(tree, f)) for f in fields}
    return DraftTree(**views, budget=tree.budget, horizon=tree.horizon, has_root=tree.has_root)


def accept(
    tree: DraftTree,
    target_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    slots: SlotTable | None = None,
    out: Accepted | None = None,
) -> Accepted:
    """Walk + commit (``repro.ddtree.accept``): one launch on the fused path, ``out`` reused."""
    if use_kernels(tree.device, fits=True):
        from repro.kernels.accept import accept_fused

        return accept_fused(tree, target_tokens, prefix_lens, slots, out)
    return accept_torch(tree, target_tokens, prefix_lens, slots)


class AcceptBuffers:
    """Two preallocated sets of ``accept`` outputs, handed out in turn: with an overlap
    scheduler round i's outputs are still being read while round i + 1 writes the other set."""

    def __init__(self, capacity: int, tree_budget: int, horizon: int, *, device: torch.device | str,
                 seq_dtype: torch.dtype, slots: bool) -> None:
        from repro.kernels.accept import empty_accepted

        width = min(horizon, tree_budget) + 1
        self.capacity = capacity
        self._sets = [empty_accepted(capacity, width, device=device, seq_dtype=seq_dtype, slots=slots)
                      for _ in range(2)]
        self._views: dict[tuple[int, int], Accepted] = {}
        self._turn = 0

    def next(self, bs: int) -> Accepted | None:
        """The next set's first ``bs`` rows (None when ``bs`` exceeds the capacity: the step
        allocates); the views are made once per (set, bs), so a round slices nothing."""
        if bs > self.capacity:
            return None
        view = self._view(self._turn, bs)
        self._turn ^= 1
        return view

    def each(self, bs: int) -> tuple[Accepted, Accepted]:
        """Both sets' first ``bs`` rows, the very views :meth:`next` hands out (to capture work
        that reads them), without taking a turn."""
        if bs > self.capacity:
            msg = f"bs {bs} exceeds the accept buffers' capacity {self.capacity}"
            raise ValueError(msg)
        return self._view(0, bs), self._view(1, bs)

    def _view(self, turn: int, bs: int) -> Accepted:
        key = (turn, bs)
        if key not in self._views:
            self._views[key] = self._sets[turn].head(bs)
        return self._views[key]


class Engine(Protocol):
    """What a round asks of an engine."""

    prefix_lens: torch.Tensor  # [bs] committed lengths, root excluded

    def draft(self, tail: DraftTail) -> Drafted:
        """Run the drafter on [root, MASK x L] and the tail on its rows."""

    def target(self, drafted: Drafted) -> torch.Tensor:
        """The target's verify forward over ``drafted``: logits [bs*N, V]."""

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's token at every node [bs, N] (argmax at T = 0, else its sampling rule)."""

    def slots(self) -> SlotTable | None:
        """The KV slot table whose verify windows the commit reorders (None: the engine has none)."""

    def accept_out(self, bs: int) -> Accepted | None:
        """Preallocated outputs for ``accept`` (None: allocate)."""

    def commit(self, drafted: Drafted, accepted: Accepted) -> None:
        """The engine's own commit: drafter context from the path's rows, KV lengths, ..."""


@dataclass(frozen=True)
class Round:
    """What a round leaves behind: its tree and verify inputs, and what was accepted."""

    drafted: Drafted
    accepted: Accepted

    @property
    def width(self) -> int:
        """W = min(L, B) + 1, the widest emission of the round."""
        return commit_width(self.drafted.tree)

    @property
    def tree(self) -> DraftTree:
        """The round's tree."""
        return self.drafted.tree

    @property
    def walk(self) -> WalkResult:
        """The accepted path as ``repro.ddtree.walk`` returns it ([bs, L + 1], NOT_ACCEPTED padded)."""
        idx = self.accepted.accept_index
        pad = self.tree.horizon + 1 - idx.shape[1]
        if pad:
            idx = torch.cat([idx, idx.new_full((idx.shape[0], pad), NOT_ACCEPTED)], 1)
        return WalkResult(idx, self.accepted.accept_len.to(torch.int64), self.accepted.bonus)


def ddtree_round(engine: Engine, tail: DraftTail) -> Round:
    """One round for the engine's batch (see the module docstring)."""
    # §2-3: the drafter's rows -> the B best prefixes -> input ids, depth positions, ancestor mask
    drafted = engine.draft(tail)
    # one target forward over every node, each row seeing only its ancestors
    logits = engine.target(drafted)
    # §4: the target's own choice at every node
    tokens = engine.choose(logits)
    if tokens.dim() != 2:
        tokens = tokens.view(drafted.tree.bs, tail.n)
    # §4-5: walk from the root while the target's token is a child; emit drafts + bonus; keep the path's KV
    accepted = accept(drafted.tree, tokens, engine.prefix_lens, engine.slots(), engine.accept_out(drafted.tree.bs))
    engine.commit(drafted, accepted)
    return Round(drafted, accepted)
