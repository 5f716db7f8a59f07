"""The DDTREE speculative worker of SGLang 0.5.17 (spec-v2): DFlash drafter, draft tree, tree verify.

Imported by SGLang through ``sglang/srt/speculative/ddtree_worker_v2.py`` (patch 0004): with its
start-up (:mod:`repro.sglang_glue.startup`), the only modules of ``repro`` that import SGLang, so only
a patched SGLang process loads them.

One drafter pass over [bonus, MASK x (S-1)] gives L = S - 1 per-position distributions; the tree of
the B best prefixes of their product is verified by the target in one forward of N = B + 1 tokens
per request under the tree's FULL attention mask (triton backend, CUDA graphs captured with the
mask buffer); the walk keeps the longest path the target agrees with.

A round is ``repro.round.ddtree_round`` with this worker as its engine: the worker supplies the
drafter and target forwards, the target's token choice and the commit into SGLang's KV and
scheduler state; the top-K, tree, verify inputs, walk and commit come from ``repro``. The tail of
the round's drafting (top-K -> tree -> verify inputs, the verify window's slots) is captured in the
drafter's CUDA graph, and the walk with the whole commit is one launch, so a round costs the host
about what a DFLASH round does.

The budget follows the running batch (``--speculative-ddtree-budget-schedule``, ``repro.schedule``;
a fixed ``--speculative-ddtree-budget B`` is the schedule ``1:B``). Each budget has its own
:class:`repro.sglang_glue.budgets.BudgetState`: tail, static buffers, and a target attention backend
with verify graphs of its width, captured only at the batch sizes routed to it. A round routes its
batch size once, at its start, and swaps the target's backend and graph runner to that budget's (as
SGLang's EAGLE adaptive mode swaps its runtime states); the drafter's graph for each batch size holds
the tail of the budget that batch size routes to, writing that budget's mask buffer.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.distributed import get_tp_group
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from repro.ddtree import SlotTable
from repro.recording import Recorder
from repro.round import Drafted, DraftTail, ddtree_round
from repro.sglang_glue.budgets import BudgetState, BudgetStates, server_schedule
from repro.sglang_glue.draft import head_shard, shard_logits
from repro.sglang_glue.sample import target_tokens
from repro.sglang_glue.slots import window_slots
from repro.sglang_glue.startup import WorkerStartUp

logger = logging.getLogger(__name__)


class DDTreeWorkerV2(WorkerStartUp, DFlashWorkerV2):
    """DFlashWorkerV2 with the chain verify replaced by a DDTree round (overlap on or off)."""

    def __init__(self, server_args: Any, gpu_id: int, ps: Any, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        self.schedule = server_schedule(server_args)
        self.budget = self.schedule.max_budget  # what KV reserve, headroom and eager buffers are sized for
        self.speculative_num_draft_tokens = self.budget + 1
        self.vocab_size = int(self.model_runner.model_config.vocab_size)
        self._shard = head_shard(self.model_runner.model.lm_head)
        tp_group = get_tp_group()
        self._all_gather = None
        if tp_group.world_size > 1:
            self._all_gather = lambda t: list(tp_group.all_gather(t.unsqueeze(0), dim=0).unbind(0))
        self._states: BudgetStates | None = None  # init_cuda_graphs builds them
        self._state: BudgetState | None = None  # the budget of the round in flight
        self._capacity = 0
        self._commit_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (accept_len buffer, bs) -> graph
        self._commit_hidden: torch.Tensor | None = None  # [cap * W_max, target hidden] the graphs' input
        self._cur: SimpleNamespace | None = None  # the round in flight: batch, draft_input, on_publish, slots, target_out
        horizon = int(self.block_size) - 1
        self._recorder = Recorder.from_env(  # acceptance recording: off unless $REPRO_DDTREE_RECORD names a file
            budget=self.budget, horizon=horizon, rank=self.ps.tp_rank,
            config={"target": server_args.model_path, "drafter": server_args.speculative_draft_model_path,
                    "budget": self.budget, "schedule": self.schedule.text, "block_size": int(self.block_size),
                    "tp_size": server_args.tp_size},
            finished_tokens=lambda req: len(req.output_ids) if req.finished() else None,  # drops overlap's over-run
        )
        self._rank0_out: torch.Tensor | None = None  # [cap, L] each depth's rank-0 token, written by the tail
        if self.ps.tp_rank == 0:
            logger.info("DDTREE worker: budget schedule %s (verify N = B + 1 up to %d), drafter block S=%d.",
                        self.schedule.text, self.budget + 1, self.block_size)

    def _maybe_build_draft_sampler(self) -> None:
        """DDTREE needs per-depth top-K log-probs, not the folded greedy head."""
        return

    @property
    def tail(self) -> DraftTail:
        """The draft tail of the round in flight (its budget's)."""
        return self._state.tail

    def _activate(self, state: BudgetState) -> None:
        """Make ``state`` the round's: its tail here, its backend and verify graphs on the target."""
        self._state = state
        self.model_runner.attn_backend = state.attn_backend
        self.model_runner.decode_cuda_graph_runner = state.graph_runner

    def _tail(self, state: BudgetState, hidden: torch.Tensor, roots: torch.Tensor, prefix_lens: torch.Tensor,
              req_pool_indices: torch.Tensor, bs: int, mask: torch.Tensor,
              table: torch.Tensor | None = None) -> tuple[Drafted, torch.Tensor]:
        """Drafter rows -> ``state``'s tail (into its static buffers when they fit), and the verify
        window's slots; returns (drafted, slots)."""
        shard = self._shard
        rows = shard_logits(hidden.view(bs, int(self.block_size), -1)[:, 1:, :], shard)
        if self._drafter_test_hook is not None:
            # Test-only: the hook's rows overwrite the LM head's, which still runs (as DFLASH's hook
            # overwrites its sampler's argmax): a round costs what a served round costs.
            self._drafter_test_hook.rows(roots, prefix_lens, out=rows, vocab_start=shard.start,
                                         vocab_end=shard.start + shard.num_org)
        fits = bs <= self._capacity
        drafted = state.tail(rows, roots, prefix_lens, mask, id_offset=shard.start, all_gather=self._all_gather,
                             out=state.draft_out if fits else None, rank0_out=self._rank0_out if fits else None)
        table = self.model_runner.req_to_token_pool.req_to_token if table is None else table
        slots = window_slots(table, req_pool_indices, prefix_lens, state.num_verify,
                             out=state.slots_out if fits else None)
        return drafted, slots

    # ---- the round's engine: draft / target / choose / slots / accept_out / commit

    @property
    def prefix_lens(self) -> torch.Tensor:
        """The round's committed lengths."""
        return self._cur.batch.seq_lens

    def draft(self, tail: DraftTail) -> Drafted:
        """The drafter block and, in its graph (or eagerly), the round's tail."""
        state, cur = self._state, self._cur
        if tail is not state.tail:
            msg = "DDTREE's drafter graph holds its budget's own tail; pass worker.tail."
            raise RuntimeError(msg)
        bs = len(cur.batch.seq_lens)
        blk = self._forward_draft_block(cur.batch, cur.draft_input)
        n = state.num_verify
        mask = state.mask(bs)
        if blk.draft_out.can_run_graph and bs <= self._capacity and mask is not None:
            cur.slots = state.slots(bs)  # what the replay wrote: no host op
            return state.draft_out.drafted(bs, mask)
        if mask is None:  # no graph buffer that fits: a mask for this round only
            bound = self._prefix_lens_sum_bound(cur.batch, cur.draft_input, bs)
            mask = torch.empty(n * bound + bs * n * n, dtype=torch.uint8, device=self.device)
        hidden = blk.draft_out.logits_output.hidden_states
        if hidden is None:
            msg = "DDTREE draft model returned no hidden states."
            raise RuntimeError(msg)
        drafted, cur.slots = self._tail(state, hidden, blk.block_ids[:, 0], blk.prefix_lens,
                                        cur.batch.req_pool_indices, bs, mask)
        return drafted

    def target(self, drafted: Drafted) -> torch.Tensor:
        """One verify forward of N tokens per request under the tree's mask: logits [bs*N, V]."""
        cur = self._cur
        batch, draft_input, n = cur.batch, cur.draft_input, self._state.num_verify
        verify_input = DFlashVerifyInput(
            draft_token=drafted.input_ids,
            positions=drafted.positions,
            draft_token_num=n,
            custom_mask=drafted.mask,  # the backend's own buffer: its replay copy is a no-op
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch.out_cache_loc = cur.slots
        seq_lens_cpu_backup, seq_lens_sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        if seq_lens_cpu_backup is not None:
            batch.seq_lens_cpu = seq_lens_cpu_backup + n  # host bound, as DFLASH does
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif draft_input.reserved_seq_lens_cpu is not None:
            batch.seq_lens_cpu = draft_input.reserved_seq_lens_cpu
            batch.seq_lens_sum = int(draft_input.reserved_seq_lens_sum)
        verify_forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu_backup, seq_lens_sum_backup
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_forward_batch, is_verify=True, skip_attn_backend_init=True)
        logits_output = target_out.logits_output
        if batch.sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits_output.next_token_logits,
                sampling_info=batch.sampling_info,
                draft_token_num=n,
            )
        cur.target_out = target_out
        return logits_output.next_token_logits

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's token at every node (argmax, or its sampling rule; rank 0's on every rank)."""
        batch = self._cur.batch
        tokens = target_tokens(logits, batch.sampling_info, len(batch.seq_lens), self._state.num_verify)
        tp_group = get_tp_group()
        if tp_group.world_size > 1 and batch.sampling_info is not None and not batch.sampling_info.is_all_greedy:
            tp_group.broadcast(tokens, src=0)  # every rank walks the same path
        return tokens

    def slots(self) -> SlotTable:
        """SGLang's request-to-token table and the batch's rows of it."""
        return SlotTable(self.model_runner.req_to_token_pool.req_to_token, self._cur.batch.req_pool_indices)

    def accept_out(self, bs: int) -> Any:
        """The next of the round's budget's two accept-buffer sets."""
        return self._state.accept_out.next(bs)

    def commit(self, drafted: Drafted, accepted: Any) -> None:
        """Publish the new lengths; the drafter KV of the path's rows (a graph replay when captured)."""
        del drafted
        cur = self._cur
        logits_output = cur.target_out.logits_output
        if cur.on_publish is not None:
            cur.on_publish(accepted.new_seq_lens)
        hidden = logits_output.hidden_states
        if hidden is None:
            msg = "DDTREE verify requires target hidden states, but got None."
            raise RuntimeError(msg)
        bs = int(accepted.accept_len.shape[0])
        graph = self._commit_graphs.get((accepted.accept_len.data_ptr(), bs))
        if graph is not None and hidden.dtype == self._commit_hidden.dtype:
            torch.index_select(hidden, 0, accepted.rows.view(-1), out=self._commit_hidden[: accepted.rows.numel()])
            graph.replay()
        else:
            self._append_target_hidden_to_draft_kv_by_loc(
                target_hidden=hidden.index_select(0, accepted.rows.view(-1)),
                cache_loc=accepted.path_slots.view(-1),
                cache_loc_2d=accepted.path_slots,
                positions=accepted.positions.view(-1),
                commit_lens=accepted.accept_len,
            )
        logits_output.hidden_states = None

    # ---- the scheduler's entry point

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish: Any = None,
                                 grammar_barrier: Any = None) -> GenerationBatchResult:
        """A prefill or idle batch as DFLASH; a decode batch as one DDTree round at its budget."""
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            # Prefill and idle batches are DFLASH's: no tree is involved.
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)
        if getattr(batch, "return_logprob", False):
            msg = "DDTREE speculative decoding does not support return_logprob."
            raise ValueError(msg)
        if batch.has_grammar:
            msg = "DDTREE speculative decoding does not support grammars."
            raise ValueError(msg)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            msg = "DDTREE expected DFlashDraftInputV2 state on the running batch."
            raise TypeError(msg)
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        self._activate(self._states.for_batch(len(batch.seq_lens)))
        self._cur = SimpleNamespace(batch=batch, draft_input=draft_input, on_publish=on_publish, slots=None,
                                    target_out=None)
        try:
            rnd = ddtree_round(self, self.tail)
            target_out = self._cur.target_out
        finally:
            self._cur = None
        accepted = rnd.accepted
        if self._recorder is not None and self._rank0_out is not None and rnd.tree.bs <= self._capacity:
            # async copies of the round's path into a pinned ring: no host sync (repro.recording)
            self._recorder.record_round([req.rid for req in batch.reqs], rnd.tree, self._rank0_out[: rnd.tree.bs],
                                        rnd.walk, handles=batch.reqs, graph=bool(target_out.can_run_cuda_graph))
        return GenerationBatchResult(
            logits_output=target_out.logits_output,
            next_token_ids=accepted.tokens.view(-1),
            accept_lens=accepted.accept_len,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=accepted.bonus, new_seq_lens=accepted.new_seq_lens
            ),
            speculative_num_draft_tokens=rnd.width,
            new_seq_lens=accepted.new_seq_lens,
        )

    def _prefix_lens_sum_bound(self, batch: ScheduleBatch, draft_input: Any, bs: int) -> int:
        """An upper bound of sum(prefix_lens) known on the host (no device read if possible).

        Sizes a round's own FULL mask when the backend's buffer is absent or too small; the tail
        past the exact layout is never read. The previous round may have run any budget."""
        cap = bs * int(self.model_runner.model_config.context_len)
        widest = max(s.commit_width for s in self._states)
        if batch.seq_lens_cpu is not None:
            return min(int(batch.seq_lens_cpu[:bs].sum()) + bs * widest, cap)
        if draft_input.reserved_seq_lens_cpu is not None:
            return min(int(draft_input.reserved_seq_lens_sum), cap)
        return int(batch.seq_lens.sum().item())
