"""The DDTREE worker's start-up (:class:`repro.sglang_glue.worker.DDTreeWorkerV2` inherits it).

Before serving: a :class:`repro.sglang_glue.budgets.BudgetState` per budget the schedule routes to,
each with a target attention backend and verify CUDA graphs of its width (captured only at the
batch sizes routed to it, SGLang's speculative width overridden while they are built); the
drafter's graphs, each batch size's holding the tail of its budget; every kernel warmed once per
batch size; and the commit's drafter-KV append captured as a CUDA graph per accept-buffer set and
batch size. Imports SGLang, so only a patched SGLang process loads it.
"""

from __future__ import annotations

import copy
import logging
import os
from contextlib import contextmanager
from typing import Any

import torch
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
from sglang.srt.runtime_context import get_context, get_exec, get_spec
from sglang.srt.utils.common import get_available_gpu_memory

from repro.ddtree import SlotTable
from repro.round import accept
from repro.sglang_glue.budgets import BudgetStates

logger = logging.getLogger(__name__)
COMMIT_GRAPHS_ENV = "SGLANG_DDTREE_COMMIT_GRAPHS"  # "0": the commit stays eager


class WorkerStartUp:
    """The start-up half of the DDTREE worker: builds its budget states and captures its graphs."""

    def init_cuda_graphs(self) -> None:
        """Build each budget's state and target verify graphs, then capture the drafter's graphs
        (each batch size's with its budget's tail), warm every kernel and capture the commits."""
        decode = get_exec().graph.cuda_graph_config.decode
        graphs_on = decode.backend != Backend.DISABLED and bool(decode.bs)
        captured: list[int] = []
        if graphs_on:
            captured, _ = get_batch_sizes_to_capture(self.model_runner, self.budget + 1, all_budgets=True)
        self._capacity = cap = max([*captured, int(self.model_runner.max_running_requests)])
        dev = self.device
        self._states = BudgetStates.build(
            self.schedule, captured, capacity=cap, block_size=int(self.block_size), vocab_size=self.vocab_size,
            device=dev, target_for=lambda budget: self._target_for(budget, captured))
        self._states.check_graphs(lambda r: getattr(r, "captured_req_width", None), lambda r: r.capture_bs)
        self._activate(self._states.for_batch(1))
        if self._recorder is not None:
            self._rank0_out = torch.zeros(cap, int(self.block_size) - 1, dtype=torch.int64, device=dev)
        self.draft_model_runner.capture_tail_hooks.append(self._capture_tail)
        super().init_cuda_graphs()
        drafter = getattr(self.draft_model_runner, "decode_cuda_graph_runner", None)
        got = getattr(drafter, "captured_req_width", None)
        if got is not None and int(got) != int(self.block_size):
            msg = (f"DDTREE drafter CUDA graphs were captured for {got} tokens per request, but this worker "
                   f"needs {self.block_size}.")
            raise RuntimeError(msg)
        graphs = drafter is not None
        self._warm_up(captured if graphs and captured else range(1, cap + 1))
        if graphs and captured:
            self._capture_commits(max(captured))
        if self.ps.tp_rank == 0:
            logger.info("DDTREE budgets: %s.", ", ".join(
                f"B={s.budget} at bs {self.schedule.captured_for(s.budget, captured) or 'eager'}" for s in self._states))

    def _target_for(self, budget: int, captured: list[int]) -> tuple[Any, Any]:
        """(the target's attention backend of width budget + 1, its verify graph runner or None).

        The largest budget's are SGLang's own (captured at the batch sizes routed to it, patch 0001);
        another budget with captured batch sizes gets a new backend and runner of its width."""
        mr = self.model_runner
        sizes = self.schedule.captured_for(budget, captured)
        if budget == self.budget or not sizes:
            return mr.attn_backend, mr.decode_cuda_graph_runner if budget == self.budget else None
        n = budget + 1
        before = get_available_gpu_memory(self.device, self.gpu_id)
        with _verify_width(n):
            backup = mr.init_new_workspace
            try:
                backend = mr._get_attention_backend(init_new_workspace=True)  # noqa: SLF001 - SGLang's own factory
            finally:
                mr.init_new_workspace = backup
            runner = mr._decode_cuda_graph_runner_cls()(mr, attn_backend=backend, speculative_num_draft_tokens=n)  # noqa: SLF001
        spent = before - get_available_gpu_memory(self.device, self.gpu_id)  # counted in /server_info's memory_usage
        usage = self._additional_graph_memory_usage
        usage["target_verify"] = usage.get("target_verify", 0.0) + spent
        if self.ps.tp_rank == 0:
            logger.info("DDTREE budget %d: target verify graphs at bs %s, %.2f GB.", budget, sizes, spent)
        return backend, runner

    def _capture_commits(self, top: int) -> None:
        """The commit's drafter-KV append (projection, fused K norm + RoPE, one prefix-valid write
        per drafter layer) as a CUDA graph per (accept-buffer set, bs): one launch a round, not a
        dozen host calls. Its fused-KV helper shares the weights but keeps its own fixed workspace
        (the shared one regrows for prefills, freeing what a graph captured). Eager (as DFLASH)
        without the fused helper, with SGLANG_DDTREE_COMMIT_GRAPHS=0, or if a capture fails."""
        helper = self._fused_kv_helper
        if not self._use_fused_kv_materialize or helper is None or os.environ.get(COMMIT_GRAPHS_ENV) == "0":
            return
        dev, cap = self.device, self._capacity
        width = max(s.commit_width for s in self._states)
        graphs, fused = {}, False
        try:
            fc = self.draft_model.fc
            own = copy.copy(helper)
            own._workspace_capacity, own._proj_workspace, own._k_workspace, own._v_workspace = 0, None, None, None  # noqa: SLF001
            own._ensure_workspace(cap * width, helper.flat_kv_weight_t.dtype)  # noqa: SLF001 - never regrows: bs <= cap
            self._commit_hidden = torch.zeros(cap * width, int(fc.in_features), dtype=fc.weight.dtype, device=dev)
            pool = torch.cuda.graph_pool_handle()
            self._fused_kv_helper = own
            for bs in range(1, top + 1):
                state = self._states.for_batch(bs)
                for acc in state.accept_out.each(bs):
                    for t in (acc.accept_len, acc.path_slots, acc.positions):
                        t.zero_()  # commit length 0: the warm-up and capture write no KV row
                    side = torch.cuda.Stream(device=dev)
                    side.wait_stream(torch.cuda.current_stream(dev))
                    with torch.cuda.stream(side):
                        self._append_rows(bs, acc, state.commit_width)  # compiles and allocates outside the capture
                    torch.cuda.current_stream(dev).wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._append_rows(bs, acc, state.commit_width)
                    graphs[(acc.accept_len.data_ptr(), bs)] = graph
            fused = self._use_fused_kv_materialize and self._fused_kv_helper is own  # no fallback ran
        except Exception as e:  # noqa: BLE001 - any capture failure leaves the eager commit
            logger.warning("DDTREE commit CUDA graphs not captured (the commit stays eager): %s", e)
        finally:
            self._use_fused_kv_materialize, self._fused_kv_helper = True, helper  # as before the capture
        self._commit_graphs = graphs if fused else {}
        if self.ps.tp_rank == 0:
            logger.info("DDTREE commit: %d CUDA graphs (bs 1-%d, 2 buffer sets).", len(self._commit_graphs), top)

    def _append_rows(self, bs: int, accepted: Any, width: int) -> None:
        """The drafter KV of the path's rows, from the hidden states gathered into _commit_hidden."""
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=self._commit_hidden[: bs * width],
            cache_loc=accepted.path_slots.view(-1),
            cache_loc_2d=accepted.path_slots,
            positions=accepted.positions.view(-1),
            commit_lens=accepted.accept_len,
        )

    def _warm_up(self, batch_sizes: Any) -> None:
        """Run the eager tail and the accept kernel once per batch size (with its budget's state):
        nothing compiles while serving."""
        dev, sizes = self.device, sorted(set(batch_sizes))
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        table = torch.zeros(max(sizes), req_to_token.shape[1], dtype=req_to_token.dtype, device=dev)
        for bs in sizes:
            state = self._states.for_batch(bs)
            n = state.num_verify
            roots = torch.zeros(bs, dtype=torch.int64, device=dev)
            lens = torch.ones(bs, dtype=torch.int64, device=dev)
            rows = torch.arange(bs, device=dev)
            hidden = torch.zeros(bs * int(self.block_size), self._shard.weight.shape[1],
                                 dtype=self._shard.weight.dtype, device=dev)
            mask = state.mask(bs)
            if mask is None:
                mask = torch.empty(n * int(lens.sum()) + bs * n * n, dtype=torch.uint8, device=dev)
            drafted, _ = self._tail(state, hidden, roots, lens, rows, bs, mask, table=table)
            tokens = torch.zeros(bs, n, dtype=torch.int64, device=dev)
            accept(drafted.tree, tokens, lens, SlotTable(table, rows), state.accept_out.next(bs))
        torch.cuda.synchronize(dev)

    def _capture_tail(self, runner: Any, out: Any, forward_batch: Any, num_tokens: int) -> None:
        """Drafter CUDA-graph tail hook: the tail of the budget this batch size routes to runs
        inside the captured graph, writing that budget's buffers and verify mask."""
        del runner, num_tokens
        bs = int(forward_batch.batch_size)
        state = self._states.for_batch(bs)
        mask = state.mask(bs)
        if mask is None:
            msg = (f"DDTREE budget {state.budget} has no target verify-mask buffer for {bs} requests to capture its "
                   f"drafter tail in (its verify graphs cover {getattr(state.graph_runner, 'capture_bs', None)}).")
            raise RuntimeError(msg)
        roots = forward_batch.input_ids.view(bs, int(self.block_size))[:, 0]
        self._tail(state, out.hidden_states, roots, forward_batch.seq_lens[:bs], forward_batch.req_pool_indices[:bs],
                   bs, mask)


@contextmanager
def _verify_width(n: int):  # noqa: ANN202 - a context manager
    """SGLang's speculative_num_draft_tokens read as ``n`` while a budget's target backend and
    verify graphs are built (as EAGLE's adaptive mode builds its states); restored after."""
    before = get_spec().speculative_num_draft_tokens
    get_context().override("ddtree.budget_capture", speculative_num_draft_tokens=n)
    try:
        yield
    finally:
        get_context().override("ddtree.budget_restore", speculative_num_draft_tokens=before)
