"""The DDTREE worker's state for each budget a schedule runs (``repro.schedule``).

A server takes one budget schedule; a round takes its budget B from its batch size. Everything a
round writes or reads whose shape depends on B lives in one :class:`BudgetState`: the draft tail
(top-K width, tree budget, verify width N = B + 1), its static draft, slot and accept buffers, and
the target's attention backend of width N with its verify CUDA graphs (whose mask buffer the
drafter's graph writes). :class:`BudgetStates` routes a batch size to its state, the same way for
the drafter's graph capture and for every served round, so no piece of a round can use another
budget's buffers. KV reserve, request-table headroom, the logits buffer and the eager runner are
sized by SGLang for the largest budget (patch 0001).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from repro.round import AcceptBuffers, DraftBuffers, DraftTail
from repro.schedule import BudgetSchedule

# (budget) -> (the target's attention backend of width budget + 1, its verify graph runner or None)
TargetFor = Callable[[int], tuple[Any, Any]]


@dataclass
class BudgetState:
    """What one budget's rounds write and read (static buffers for up to ``capacity`` requests)."""

    budget: int
    block_size: int  # S, the drafter block: the tree's horizon is S - 1
    tail: DraftTail
    draft_out: DraftBuffers
    slots_out: torch.Tensor  # [capacity * N] int64: the verify window's KV slots
    accept_out: AcceptBuffers
    attn_backend: Any  # the target's attention backend whose verify-mask buffer this budget's graphs read
    graph_runner: Any  # the target verify CUDA graphs of width N (None: this budget runs eagerly)
    _slot_views: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_verify(self) -> int:
        """N = B + 1: target rows per request."""
        return self.budget + 1

    @property
    def commit_width(self) -> int:
        """W = min(N, S): the widest emission and drafter-KV commit of one round."""
        return min(self.num_verify, self.block_size)

    def slots(self, bs: int) -> torch.Tensor:
        """The first ``bs`` requests' verify slots in ``slots_out`` (a view made once per bs)."""
        if bs not in self._slot_views:
            self._slot_views[bs] = self.slots_out[: bs * self.num_verify]
        return self._slot_views[bs]

    def mask(self, bs: int) -> torch.Tensor | None:
        """The target backend's verify-mask buffer (its CUDA graphs read it), or None when it has
        none that fits ``bs`` requests (then a round allocates its own)."""
        verify_mask = getattr(self.attn_backend, "_verify_mask", None)
        if verify_mask is None or not verify_mask.fits(bs):
            return None
        return verify_mask.buffer


def server_schedule(server_args: Any) -> BudgetSchedule:
    """The server's budget schedule: ``--speculative-ddtree-budget-schedule``, else ``1:B``."""
    text = getattr(server_args, "speculative_ddtree_budget_schedule", None)
    return BudgetSchedule.parse(text) if text else BudgetSchedule.fixed(int(server_args.speculative_ddtree_budget))


class BudgetStates:
    """One :class:`BudgetState` per budget the schedule can route to, and the routing."""

    def __init__(self, schedule: BudgetSchedule, captured: Sequence[int], states: dict[int, BudgetState]) -> None:
        self.schedule, self.captured, self.states = schedule, tuple(captured), states

    def for_batch(self, bs: int) -> BudgetState:
        """The state of a round of ``bs`` requests: the budget of its graph bucket."""
        return self.states[self.schedule.route(bs, self.captured)]

    def __iter__(self):  # noqa: ANN204 - an iterator of states
        return iter(self.states.values())

    @classmethod
    def build(cls, schedule: BudgetSchedule, captured: Sequence[int], *, capacity: int, block_size: int,
              vocab_size: int, device: torch.device | str, target_for: TargetFor) -> BudgetStates:
        """A state for every budget a batch of 1..``capacity`` requests routes to, each with the
        target backend and graphs ``target_for`` gives for its width."""
        horizon = block_size - 1
        budgets = sorted({schedule.route(bs, captured) for bs in range(1, capacity + 1)})
        states = {}
        for budget in budgets:
            backend, runner = target_for(budget)
            states[budget] = BudgetState(
                budget=budget, block_size=block_size, tail=DraftTail(budget, horizon, vocab_size),
                draft_out=DraftBuffers.empty(capacity, budget, horizon, device),
                slots_out=torch.empty(capacity * (budget + 1), dtype=torch.int64, device=device),
                accept_out=AcceptBuffers(capacity, budget, horizon, device=device, seq_dtype=torch.int64, slots=True),
                attn_backend=backend, graph_runner=runner)
        return cls(schedule, captured, states)

    def check_graphs(self, width_of: Callable[[Any], int | None], sizes_of: Callable[[Any], Sequence[int]]) -> None:
        """RuntimeError unless every budget's verify graphs were captured at its width, for exactly
        the captured batch sizes the schedule routes to it (anything else would run another
        budget's graphs, or silently eager)."""
        for state in self:
            if state.graph_runner is None:
                continue
            width, sizes = width_of(state.graph_runner), sorted(sizes_of(state.graph_runner))
            want = self.schedule.captured_for(state.budget, self.captured) or list(self.captured)
            if width != state.num_verify or not set(want) <= set(sizes):
                msg = (f"DDTREE budget {state.budget}: its target verify graphs were captured for {width} tokens "
                       f"per request at batch sizes {sizes}, but its rounds need {state.num_verify} at {want}")
                raise RuntimeError(msg)
