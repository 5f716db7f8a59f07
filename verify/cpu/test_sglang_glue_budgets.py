"""Tests for `repro.sglang_glue.budgets`: the server's schedule, one state per budget, and every batch
size routed to one."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from repro.schedule import BudgetSchedule
from repro.sglang_glue.budgets import BudgetStates, server_schedule

GRAPHS = [1, 2, 4, 8, 16]


@dataclass
class FakeMask:
    """SGLang's VerifyMask: a buffer sized for ``max_bs`` requests."""

    buffer: torch.Tensor
    max_bs: int

    def fits(self, bs: int) -> bool:
        """Whether ``bs`` requests' mask fits the buffer."""
        return bs <= self.max_bs


def _target_for(schedule: BudgetSchedule, captured: list[int], built: list[int]):
    """A stand-in of the worker's: a backend and runner per budget with captured sizes."""
    def target_for(budget: int):
        built.append(budget)
        sizes = schedule.captured_for(budget, captured)
        if not sizes:
            return SimpleNamespace(_verify_mask=None, name="default"), None
        n = budget + 1
        backend = SimpleNamespace(_verify_mask=FakeMask(torch.zeros(max(sizes) * n * (64 + n), dtype=torch.uint8),
                                                        max(sizes)), name=f"B{budget}")
        return backend, SimpleNamespace(captured_req_width=n, capture_bs=sizes)
    return target_for


def _states(text: str, captured: list[int], capacity: int = 24) -> tuple[BudgetStates, list[int]]:
    schedule = BudgetSchedule.parse(text)
    built: list[int] = []
    states = BudgetStates.build(schedule, captured, capacity=capacity, block_size=16, vocab_size=100, device="cpu",
                                target_for=_target_for(schedule, captured, built))
    return states, built


class TestBudgetStates:
    def test_one_state_per_budget_routed_to(self):
        """Every budget some batch size 1..capacity routes to gets one state, and only those."""
        states, built = _states("1:63,4:31,16:15,64:7", GRAPHS)
        assert sorted(built) == [15, 31, 63] == sorted(states.states)  # 64 > capacity: B 7 never runs
        assert [s.budget for s in states] == [15, 31, 63]

    def test_each_batch_size_gets_its_budgets_buffers_and_mask(self):
        """A batch's state has its budget's tail, buffers of N = B + 1 rows and its backend's mask
        (the buffer that budget's verify graphs read), for padded and eager batch sizes alike."""
        states, _ = _states("1:63,4:31,16:15", GRAPHS)
        for bs in range(1, 25):
            state = states.for_batch(bs)
            budget = BudgetSchedule.parse("1:63,4:31,16:15").route(bs, GRAPHS)
            assert state.budget == state.tail.budget == budget
            assert state.draft_out.tree.tokens.shape[1] == state.num_verify == budget + 1
            assert state.slots(bs).numel() == bs * (budget + 1)
            assert state.accept_out.next(bs).tokens.shape[1] == min(15, budget) + 1
            mask = state.mask(bs)
            if bs <= 16:
                assert state.attn_backend.name == f"B{budget}" and mask is state.attn_backend._verify_mask.buffer
            else:
                assert mask is None  # past the graphs: a round allocates its own mask
        assert states.for_batch(3) is states.for_batch(4)  # bs 3 replays the bs 4 graphs

    def test_small_budgets_have_narrower_commits(self):
        """A budget below the drafter block commits at most B + 1 tokens a round."""
        states, _ = _states("1:7,4:3", GRAPHS)
        assert [(s.budget, s.commit_width) for s in states] == [(3, 4), (7, 8)]
        states, _ = _states("1:40", GRAPHS)
        assert [s.commit_width for s in states] == [16]

    def test_without_graphs_every_budget_runs_eagerly(self):
        """With no captured batch sizes each batch size takes its own budget, no runner anywhere."""
        states, _ = _states("1:63,3:47,4:31", [], capacity=6)
        assert {bs: states.for_batch(bs).budget for bs in range(1, 7)} == {1: 63, 2: 63, 3: 47, 4: 31, 5: 31, 6: 31}
        assert all(s.graph_runner is None for s in states)

    def test_graphs_of_another_width_or_sizes_are_refused(self):
        """check_graphs names a budget whose verify graphs have the wrong width or batch sizes."""
        states, _ = _states("1:63,4:31,16:15", GRAPHS)
        states.check_graphs(lambda r: r.captured_req_width, lambda r: r.capture_bs)
        states.states[31].graph_runner.capture_bs = [4]
        with pytest.raises(RuntimeError, match=r"budget 31: .* at batch sizes \[4\], but its rounds need 32 at \[4, 8\]"):
            states.check_graphs(lambda r: r.captured_req_width, lambda r: r.capture_bs)
        states.states[31].graph_runner.capture_bs = [4, 8]
        states.states[15].graph_runner.captured_req_width = 64
        with pytest.raises(RuntimeError, match=r"budget 15: .*captured for 64 tokens"):
            states.check_graphs(lambda r: r.captured_req_width, lambda r: r.capture_bs)


class TestServerSchedule:
    def test_the_schedule_flag_wins(self):
        """--speculative-ddtree-budget-schedule is the schedule; the budget SGLang derives from it is not read."""
        args = SimpleNamespace(speculative_ddtree_budget_schedule="1:63,16:15", speculative_ddtree_budget=63)
        assert server_schedule(args) == BudgetSchedule.parse("1:63,16:15")
        assert [server_schedule(args).budget(bs) for bs in (1, 15, 16, 64)] == [63, 63, 15, 15]

    @pytest.mark.parametrize("schedule", [None, ""])
    def test_a_fixed_budget_is_the_schedule_1_b(self, schedule):
        """Without a schedule (unset or empty) every batch size runs --speculative-ddtree-budget."""
        args = SimpleNamespace(speculative_ddtree_budget_schedule=schedule, speculative_ddtree_budget="32")
        assert server_schedule(args) == BudgetSchedule.fixed(32)
        assert server_schedule(SimpleNamespace(speculative_ddtree_budget=8)).text == "1:8"
