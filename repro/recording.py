"""Acceptance recordings: per round and request, the tree nodes the walk accepted (JSONL, schema 1).

Nodes are numbered in best-first pop order (docs/SPEC.md §2.4), so the tree of any budget
B' <= B is the first B' + 1 rows of the tree of B, and the accepted path's node ids increase
along the path. One recording at budget B therefore tells, for every B' <= B, what B' would have
accepted on the same drafter rows: ``1 + #(path ids <= B')`` (``repro tau``, ``repro tune``).

File format: JSON lines, appended; several recordings may share a file. A header opens each::

    {"kind": "recording", "schema": 1, "rec": ID, "algorithm": "DDTREE", "budget": B,
     "horizon": L, "digest": SHA256, "config": {...}, "stack": {fingerprint}, "prompts": NAME,
     "source": "sglang" | "toy", "created": UNIX_TIME}

then one line per request and round::

    {"kind": "round", "rec": ID, "step": S, "req": REQUEST_ID, "prompts": NAME, "bs": BS,
     "budget": B_ROUND, "graph": true|false,
     "path": [node ids, root excluded, increasing], "rank0": [0|1 per path node], "chain": C}

``step`` counts the recorder's rounds (0, 1, ...); a request's own rounds are its lines in step
order. ``digest`` is the sha256 of the canonical JSON of ``{"stack": ..., "config": ...}`` (the
stack fingerprint of :func:`repro.stack.pins.fingerprint` and the engine's configuration), so
recordings of one deployment compare equal. ``rank0`` and ``chain`` are the
:class:`repro.ddtree.ChainFields` (absent when the engine does not pass them). ``prompts`` is
the part of the request id before its first ``/`` when there is one, else the header's.
``budget`` is the round's own budget (a server with a budget schedule runs several; the header's
is the largest, absent: the header's) and ``graph`` whether the round's target verify replayed a
CUDA graph (absent when the engine does not say).

Writing never synchronises with the GPU: :meth:`Recorder.record` packs the round's tensors on
their device, copies them into a pinned host buffer with ``non_blocking=True`` and records a
CUDA event; batches are turned into JSON only once their event has completed, at a later round
or at :meth:`Recorder.close`. CPU tensors are written at once.

An engine that schedules ahead (SGLang's overlap scheduler launches round k + 1 before it reads
round k's result) runs one round more for a request that round k finished, and throws its tokens
away. Given ``finished_tokens`` and each row's request ``handles``, the recorder leaves such rounds
out: a row is written only while the tokens the request emitted before it (prefill's first
included) are fewer than what the engine kept once the request finished. A request's lines are
then exactly the rounds the engine counted (SGLang's ``spec_verify_ct``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from repro.algorithms import DDTREE

if TYPE_CHECKING:
    import torch

    from repro.ddtree import ChainFields, DraftTree, WalkResult

SCHEMA = 1
HEADER = "recording"
ROUND = "round"
RECORD_ENV = "REPRO_DDTREE_RECORD"  # path of the JSONL; "{pid}" is replaced by the process id
PROMPTS_ENV = "REPRO_DDTREE_RECORD_PROMPTS"  # prompt-set name of requests whose id names none
NO_PROMPTS = "-"
TRACKED = 65536  # requests whose emitted-token count the over-run filter keeps (least recent dropped)


def prompts_of(request_id: str, default: str) -> str:
    """The prompt set a request id names (``"humaneval/17"`` -> ``"humaneval"``), else ``default``."""
    head, sep, _ = request_id.partition("/")
    return head if sep and head else default


def digest(stack: dict[str, Any], config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the stack fingerprint and the engine configuration."""
    text = json.dumps({"stack": stack, "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Recorder:
    """Appends one recording (a header, then per-round lines) to a JSONL file.

    Off unless constructed; engines use :meth:`from_env`. Not thread-safe: call from the thread
    that runs the rounds, outside CUDA-graph capture.

    ``finished_tokens(handle)``: the tokens the engine kept for a finished request (prefill's first
    included), None while it runs; with it, rounds run past a request's end are not written.
    """

    def __init__(self, path: str | Path, *, budget: int, horizon: int, algorithm: str = DDTREE,
                 config: dict[str, Any] | None = None, prompts: str = NO_PROMPTS, source: str = "",
                 stack: dict[str, Any] | None = None, max_pending: int = 256,
                 finished_tokens: Callable[[Any], int | None] | None = None) -> None:
        if stack is None:
            from repro.stack.pins import fingerprint

            stack = fingerprint()
        config = dict(config or {})
        self.path, self.budget, self.horizon, self.prompts = Path(path), budget, horizon, prompts
        self.rec = uuid.uuid4().hex[:16]
        self.step = 0
        self._ring: StagingRing | None = None
        self._max_pending = max_pending
        self._finished_tokens = finished_tokens
        self._emitted: OrderedDict[str, int] = OrderedDict()  # request id -> tokens emitted so far
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self._write([{"kind": HEADER, "schema": SCHEMA, "rec": self.rec, "algorithm": algorithm,
                      "budget": budget, "horizon": horizon, "digest": digest(stack, config),
                      "config": config, "stack": stack, "prompts": prompts, "source": source,
                      "created": time.time()}])
        atexit.register(self.close)

    @classmethod
    def from_env(cls, *, budget: int, horizon: int, config: dict[str, Any] | None = None,
                 rank: int = 0, source: str = "sglang",
                 finished_tokens: Callable[[Any], int | None] | None = None) -> Recorder | None:
        """A recorder writing to ``$REPRO_DDTREE_RECORD`` on rank 0, or None when it is unset."""
        path = os.environ.get(RECORD_ENV, "").strip()
        if not path or rank != 0:
            return None
        return cls(path.replace("{pid}", str(os.getpid())), budget=budget, horizon=horizon,
                   config=config, prompts=os.environ.get(PROMPTS_ENV, "").strip() or NO_PROMPTS,
                   source=source, finished_tokens=finished_tokens)

    def record(self, request_ids: Sequence[str], accept_index: torch.Tensor, accept_len: torch.Tensor,
               chain: ChainFields | None = None, handles: Sequence[Any] | None = None, *,
               budget: int | None = None, graph: bool | None = None) -> None:
        """Record one round: ``accept_index`` [bs, L+1] int64 (node ids root first, -1 padded, as
        ``WalkResult.accept_index``), ``accept_len`` [bs] (tau), ``chain`` fields [bs, L] / [bs],
        the host-side id of each batch row and, for the over-run filter, the engine's request
        objects (``handles``); the round's ``budget`` (at most the header's) and whether its verify
        replayed a ``graph``. No host synchronisation."""
        if budget is not None and not 0 <= budget <= self.budget:
            msg = f"a round's budget must be in 0..{self.budget}, the recording's (got {budget})"
            raise ValueError(msg)
        import torch

        bs = len(request_ids)
        shapes = {"accept_index": (tuple(accept_index.shape), (bs, self.horizon + 1)),
                  "accept_len": (tuple(accept_len.shape), (bs,))}
        if chain is not None:
            shapes["chain.rank0"] = (tuple(chain.rank0.shape), (bs, self.horizon))
            shapes["chain.in_tree"] = (tuple(chain.in_tree.shape), (bs,))
        for name, (got, want) in shapes.items():
            if got != want:
                msg = f"{name} must have shape {want} for {bs} request ids (got {got})"
                raise ValueError(msg)
        cols = [accept_len[:, None], accept_index]
        if chain is not None:
            cols += [chain.in_tree[:, None], chain.rank0]
        packed = torch.cat([c.to(torch.int64) for c in cols], 1)
        meta = _Batch(self.step, tuple(request_ids), chain is not None, None if handles is None else tuple(handles),
                      budget, graph)
        self.step += 1
        if packed.device.type != "cuda":
            self._write_batch(packed.tolist(), meta)
            return
        if self._ring is None:
            self._ring = StagingRing(event_factory=torch.cuda.Event, pin=True, max_pending=self._max_pending)
        for rows, done in self._ring.ready():  # before the push: this round is never written in its own call
            self._write_batch(rows, done)
        self._ring.push(packed, meta)

    def record_round(self, request_ids: Sequence[str], tree: DraftTree, rank0_ids: torch.Tensor,
                     result: WalkResult, handles: Sequence[Any] | None = None, *, graph: bool | None = None) -> None:
        """:meth:`record` with the chain fields and budget of ``tree`` (``rank0_ids`` [bs, L]: ``TopK.ids[:, :, 0]``)."""
        from repro.ddtree import chain_fields

        self.record(request_ids, result.accept_index, result.accept_len, chain_fields(tree, rank0_ids, result),
                    handles, budget=tree.budget, graph=graph)

    def close(self) -> None:
        """Wait for the batches still in flight, write them and close the file (idempotent)."""
        if self._file.closed:
            return
        if self._ring is not None:
            for rows, meta in self._ring.drain():
                self._write_batch(rows, meta)
        self._file.close()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_batch(self, rows: list[list[int]], meta: _Batch) -> None:
        width = self.horizon + 1
        lines = []
        for i, (request, row) in enumerate(zip(meta.requests, rows, strict=True)):
            tau = row[0]
            if meta.handles is not None and self._finished_tokens is not None and self._over_run(
                    request, tau, self._finished_tokens(meta.handles[i])):
                continue
            line = {"kind": ROUND, "rec": self.rec, "step": meta.step, "req": request,
                    "prompts": prompts_of(request, self.prompts), "bs": len(meta.requests),
                    "path": row[2 : 1 + tau]}
            if meta.budget is not None:
                line["budget"] = meta.budget
            if meta.graph is not None:
                line["graph"] = meta.graph
            if meta.chain:
                line["rank0"] = row[2 + width : 1 + width + tau]
                line["chain"] = row[1 + width]
            lines.append(line)
        self._write(lines)

    def _over_run(self, request: str, tau: int, final: int | None) -> bool:
        """True when the request had emitted all ``final`` tokens it kept before this round
        (prefill's first token counts); else count the round's ``tau`` tokens."""
        before = self._emitted.pop(request, 1)
        over = final is not None and before >= final
        self._emitted[request] = before if over else before + tau
        if len(self._emitted) > TRACKED:
            self._emitted.popitem(last=False)
        return over

    def _write(self, lines: list[dict[str, Any]]) -> None:
        self._file.write("".join(json.dumps(line) + "\n" for line in lines))  # one write per batch
        self._file.flush()


@dataclass(frozen=True)
class _Batch:
    """Host-side facts of one recorded round."""

    step: int
    requests: tuple[str, ...]
    chain: bool
    handles: tuple[Any, ...] | None
    budget: int | None = None
    graph: bool | None = None


class StagingRing:
    """Device -> host copies that are read only once complete: pinned buffers plus CUDA events.

    :meth:`push` starts an asynchronous copy and records an event after it; :meth:`ready` yields
    the oldest batches whose events have completed (``event.query()``), in push order. Buffers are
    reused once read. Only when ``max_pending`` batches are in flight (the GPU that many rounds
    behind the host) does :meth:`push` wait for the oldest.
    """

    def __init__(self, *, event_factory: Callable[[], Any], pin: bool, max_pending: int = 256) -> None:
        self.event_factory, self.pin, self.max_pending = event_factory, pin, max_pending
        self._pending: deque[tuple[torch.Tensor, torch.Tensor, Any, Any]] = deque()
        self._free: list[torch.Tensor] = []

    def push(self, packed: torch.Tensor, meta: object) -> None:
        """Copy ``packed`` [rows, cols] int64 to host asynchronously; ``meta`` comes back with it."""
        import torch

        if len(self._pending) >= self.max_pending:
            self._pending[0][2].synchronize()
        rows, cols = packed.shape
        fits = [b for b in self._free if b.shape[0] >= rows and b.shape[1] == cols]
        if fits:
            buffer = fits[0]
            self._free.remove(buffer)
        else:
            buffer = torch.empty((max(rows, 16), cols), dtype=torch.int64, pin_memory=self.pin)
        host = buffer[:rows]
        host.copy_(packed, non_blocking=True)
        event = self.event_factory()
        event.record()
        self._pending.append((buffer, host, event, meta))

    def ready(self) -> Iterator[tuple[list[list[int]], Any]]:
        """(rows, meta) of every completed batch at the head of the queue, oldest first."""
        while self._pending and self._pending[0][2].query():
            yield self._pop()

    def drain(self) -> Iterator[tuple[list[list[int]], Any]]:
        """(rows, meta) of every batch in flight, waiting for each."""
        while self._pending:
            self._pending[0][2].synchronize()
            yield self._pop()

    def _pop(self) -> tuple[list[list[int]], Any]:
        buffer, host, _, meta = self._pending.popleft()
        rows = host.tolist()  # host memory the completed copy wrote: no device access
        self._free.append(buffer)
        return rows, meta
