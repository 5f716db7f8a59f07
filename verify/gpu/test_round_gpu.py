"""A DDTree round on CUDA: the fused tail and accept equal the torch path, the tail
replays inside a CUDA graph, and whole rounds over an engine with SGLang's layouts (a slot
table, a flat FULL mask, static buffers) run with no host synchronisation and stay lossless."""

from __future__ import annotations

import pytest
import torch

from repro.ddtree import SlotTable, build_trees
from repro.ddtree import accept as accept_torch
from repro.ddtree.tensors import tree_inputs, tree_mask_index
from repro.kernels.accept import accept_fused
from repro.kernels.tree_build import tree_inputs_fused
from repro.round import AcceptBuffers, DraftBuffers, Drafted, DraftTail, ddtree_round
from verify.cpu.test_ddtree_accept import _pool, _round

pytestmark = pytest.mark.gpu
DEV = "cuda"
FIELDS = ("accept_index", "accept_len", "bonus", "tokens", "rows", "positions", "new_seq_lens", "path_slots")


@pytest.mark.parametrize("budget", [1, 8, 32, 128, 256])
def test_fused_accept_equals_torch_on_cuda(budget):
    """The one-launch accept writes exactly the reference's outputs and table rewrite."""
    for seed in range(6):
        logits = torch.randn(4, 15, 64, generator=torch.Generator().manual_seed(seed)) * 3
        tree, target = _round(logits, budget, seed)
        prefix = torch.randint(0, 50, (4,), generator=torch.Generator().manual_seed(seed))
        table, rows = _pool(4, tree.n, prefix, seed)
        cuda = lambda t: t.to(DEV)  # noqa: E731
        t1, t2 = cuda(table), cuda(table)
        tree = type(tree)(*(cuda(getattr(tree, f)) for f in ("tokens", "parents", "depths", "num_nodes", "scores")),
                          tree.budget, tree.horizon, tree.has_root)
        want = accept_torch(tree, cuda(target), cuda(prefix), SlotTable(t1, cuda(rows)))
        got = accept_fused(tree, cuda(target), cuda(prefix), SlotTable(t2, cuda(rows)))
        for name in FIELDS:
            assert torch.equal(getattr(want, name), getattr(got, name)), (budget, seed, name)
        assert torch.equal(t1, t2)


@pytest.mark.parametrize("budget", [1, 16, 64, 256])
def test_fused_tree_inputs_equal_torch_on_cuda(budget):
    """Input ids, positions and the ancestor blocks of the flat mask, bit for bit."""
    g = torch.Generator().manual_seed(budget)
    x = (torch.randn(5, 15, 300, generator=g) * 2).to(DEV)
    tree = build_trees(x, budget, torch.arange(5, device=DEV))
    lens = torch.randint(0, 100, (5,), generator=g).to(DEV)
    size = tree.n * int(lens.sum()) + 5 * tree.n**2
    m1 = torch.full((size,), 9, dtype=torch.uint8, device=DEV)
    m2 = m1.clone()
    a, b = tree_inputs(tree, lens, m1), tree_inputs_fused(tree, lens, m2)
    assert torch.equal(m1, m2) and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_tail_replays_in_a_cuda_graph():
    """The fused tail captured once (static buffers, the mask written in place) replays to the
    eager tail's outputs on new drafter rows."""
    bs, horizon, vocab, budget = 4, 15, 4096, 32
    tail = DraftTail(budget, horizon, vocab)
    bufs = DraftBuffers.empty(bs, budget, horizon, DEV)
    rows = torch.zeros(bs, horizon, vocab, device=DEV, dtype=torch.bfloat16)
    roots = torch.zeros(bs, dtype=torch.int64, device=DEV)
    lens = torch.full((bs,), 40, dtype=torch.int64, device=DEV)
    mask = torch.zeros(bs * tail.n * (200 + tail.n), dtype=torch.uint8, device=DEV)
    tail(rows, roots, lens, mask, out=bufs)  # compile and fill caches outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tail(rows, roots, lens, mask, out=bufs)
    g = torch.Generator(device=DEV).manual_seed(0)
    for _ in range(3):
        rows.copy_(torch.randn(rows.shape, generator=g, device=DEV) * 3)
        roots.random_(0, vocab, generator=g)
        lens.random_(0, 100, generator=g)
        graph.replay()
        mask_eager = mask.clone()
        want = tail(rows, roots, lens, mask_eager)
        for name in ("tokens", "parents", "depths", "num_nodes"):
            assert torch.equal(getattr(bufs.tree, name), getattr(want.tree, name)), name
        assert torch.equal(bufs.input_ids, want.input_ids) and torch.equal(bufs.positions, want.positions)
        assert torch.equal(mask, mask_eager)


class _BigramEngine:
    """An engine with SGLang's layouts on the GPU: the target is a bigram table (its greedy next
    token after t is succ[t], so greedy decoding is known), KV lives in slots of a req_to_token
    table whose verify windows the accept reorders, the tail writes static buffers and the mask."""

    def __init__(self, succ: torch.Tensor, drafter_rows, tail: DraftTail, bs: int, cap: int) -> None:
        self.succ, self.rows_of, self.tail = succ, drafter_rows, tail
        n = tail.n
        self.table = torch.arange(bs * cap, device=DEV, dtype=torch.int32).view(bs, cap)
        self.req = torch.arange(bs, device=DEV)
        self.kv_token = torch.full((bs * cap,), -1, dtype=torch.int64, device=DEV)  # the "KV": token per slot
        self.prefix_lens = torch.zeros(bs, dtype=torch.int64, device=DEV)
        self.roots = torch.zeros(bs, dtype=torch.int64, device=DEV)
        self.mask = torch.zeros(bs * n * (cap + n), dtype=torch.uint8, device=DEV)
        self.bufs = DraftBuffers.empty(bs, tail.budget, tail.horizon, DEV)
        self.acc = AcceptBuffers(bs, tail.budget, tail.horizon, device=DEV, seq_dtype=torch.int64, slots=True)
        self.vocab = succ.shape[0]

    def draft(self, tail: DraftTail) -> Drafted:
        return tail(self.rows_of(self.roots), self.roots, self.prefix_lens, self.mask, out=self.bufs)

    def target(self, drafted: Drafted) -> torch.Tensor:
        # verify rows write their token's KV into the window slots; a node's logits follow its token
        n = drafted.tree.n
        cols = self.prefix_lens[:, None] + torch.arange(n, device=DEV)
        slots = self.table[self.req[:, None], cols].long()
        self.kv_token[slots.reshape(-1)] = drafted.input_ids
        anc = self.mask[tree_mask_index(self.prefix_lens, n)]  # the ancestor blocks must be in place
        self.ancestors_ok = anc.diagonal(dim1=1, dim2=2).all()
        logits = torch.zeros(drafted.input_ids.numel(), self.vocab, device=DEV)
        return logits.scatter_(1, self.succ[drafted.input_ids][:, None], 9.0)

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)

    def slots(self) -> SlotTable:
        return SlotTable(self.table, self.req)

    def accept_out(self, bs: int):
        return self.acc.next(bs)

    def commit(self, drafted: Drafted, accepted) -> None:
        self.prefix_lens = accepted.new_seq_lens.clone()
        self.roots = accepted.bonus.clone()


def test_rounds_run_without_host_sync_and_stay_lossless():
    """Whole rounds (fused tail, target, argmax, one-launch accept) under sync-debug "error":
    the committed KV reads back the greedy continuation, token for token."""
    bs, vocab, horizon, budget, cap = 3, 512, 15, 32, 400
    gen = torch.Generator().manual_seed(0)
    succ = torch.randperm(vocab, generator=gen).to(DEV)
    g = torch.Generator(device=DEV).manual_seed(1)

    def drafter_rows(roots: torch.Tensor) -> torch.Tensor:
        # noisy rows around the true continuation: the right token holds ~3/4 of each row's mass
        out, cur = [], roots
        for _ in range(horizon):
            cur = succ[cur]
            row = torch.randn(roots.shape[0], vocab, generator=g, device=DEV)
            row.scatter_add_(1, cur[:, None], torch.full((roots.shape[0], 1), 8.0, device=DEV))
            out.append(row)
        return torch.stack(out, 1)

    tail = DraftTail(budget, horizon, vocab)
    engine = _BigramEngine(succ, drafter_rows, tail, bs, cap)
    ddtree_round(engine, tail)  # compile outside the check
    engine.prefix_lens.zero_()
    engine.roots.zero_()
    torch.cuda.synchronize()
    taus = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):
            rnd = ddtree_round(engine, tail)
            taus.append(rnd.accepted.accept_len.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool(engine.ancestors_ok)
    lens = engine.prefix_lens.tolist()
    for b in range(bs):
        got = engine.kv_token[engine.table[b, : lens[b]].long()].tolist()
        want, t = [], 0
        for _ in range(lens[b]):
            want.append(t)
            t = int(succ[t])
        assert got == want, b
    assert float(torch.stack(taus).float().mean()) > 3.0  # side branches really were accepted
