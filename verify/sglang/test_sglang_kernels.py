"""The pinned SGLang's kernels fed DDTree's tensors, against dense references (GPU, per SM).

- triton ``extend_attention_fwd`` with a DDTree FULL mask (the target-verify path of patch 0002)
  vs dense masked attention in float32: |diff| <= 2e-2 (bf16 inputs, float32 accumulation);
  a causal-only run is the negative control (it must differ on a non-chain tree).
- ``sgl_kernel.verify_tree_greedy`` on repro.ddtree's pointers vs ``repro.ddtree.walk``: exact.
- ``sgl_kernel.tree_speculative_sampling_target_only`` (draft probs 0, thresholds 1) on the same
  pointers: the first two emitted tokens follow the exact target distribution (chi-square at
  thresholds.toml [stats].alpha), as docs/SPEC.md §4 says it must for distinct siblings.

Every kernel output is also written to $REPRO_E2E_OUT/kernels-<sm>.safetensors, and compared
with the stored golden of this SM when ``golden/kernels/sglang-sm<sm>.safetensors`` exists
(attention within ATOL, the two walks' outputs exactly: fixed seeds on the pinned stack).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from repro.ddtree import build_trees, verify_tensors, walk
from repro.golden import cases
from verify.chi_square import chi_square_p, keyed
from verify.sglang import harness
from verify.sglang.test_ddtree_sampling import alpha

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

ATOL = 2e-2
GOLDEN = Path(__file__).resolve().parents[2] / "golden"
_SAVED: dict[str, torch.Tensor] = {}


def _tree(bs: int, horizon: int, vocab: int, budget: int, seed: int):
    """A batch of DDTree trees on the GPU from random drafter logits."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, horizon, vocab, generator=g) * 2
    roots = torch.randint(0, vocab, (bs,), generator=g)
    return build_trees(logits.cuda(), budget, roots.cuda())


def _save(name: str, t: torch.Tensor, atol: float = 0.0) -> None:
    """Write ``t`` with this run's other outputs; assert it matches the stored golden, if any."""
    _SAVED[name] = t.detach().cpu().contiguous()
    from safetensors.torch import save_file

    cap = "".join(map(str, torch.cuda.get_device_capability()))
    save_file(dict(_SAVED), str(harness.out_dir() / f"kernels-sm{cap}.safetensors"))
    golden = cases.load_kernel_golden(GOLDEN, cap)
    if golden is not None:
        want = golden[name]
        assert want.shape == _SAVED[name].shape and want.dtype == _SAVED[name].dtype, name
        assert (_SAVED[name].double() - want.double()).abs().max().item() <= atol, f"{name} differs from the golden"


def _dense_tree_attention(q, k_ext, v_ext, k_buf, v_buf, kv_indices, prefix, anc, sm_scale):
    """Reference: node i of request b sees all its prefix keys and the tree keys anc[b, i]."""
    bs, n, _ = anc.shape
    heads, kv_heads = q.shape[1], k_ext.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    start = 0
    for b in range(bs):
        s = int(prefix[b])
        idx = kv_indices[start : start + s]
        start += s
        keys = torch.cat([k_buf[idx], k_ext[b * n : (b + 1) * n]]).float()
        vals = torch.cat([v_buf[idx], v_ext[b * n : (b + 1) * n]]).float()
        allow = torch.cat([torch.ones(n, s, dtype=torch.bool, device=q.device), anc[b]], 1)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            scores = (q[b * n : (b + 1) * n, h].float() @ keys[:, kh].T) * sm_scale
            scores = scores.masked_fill(~allow, -math.inf)
            out[b * n : (b + 1) * n, h] = torch.softmax(scores, -1) @ vals[:, kh]
    return out


class TestTritonExtendAttention:
    def test_tree_full_mask_matches_dense_attention(self):
        """The triton verify kernel with the FULL mask equals dense tree attention; causal does not."""
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        torch.manual_seed(0)
        bs, heads, kv_heads, dim = 3, 8, 2, 64
        tree = _tree(bs, horizon=7, vocab=12, budget=20, seed=1)
        n = tree.n
        prefix = torch.tensor([5, 37, 1], device="cuda")
        total = int(prefix.sum())
        vt = verify_tensors(tree, prefix, total)
        slots = 4 * (total + bs * n)
        k_buf = torch.randn(slots, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v_buf = torch.randn(slots, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        kv_indices = torch.randperm(slots, device="cuda")[:total].to(torch.int64)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
        kv_indptr[1:] = torch.cumsum(prefix, 0)
        qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device="cuda")
        mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device="cuda")
        mask_indptr[1:] = torch.cumsum(n * (prefix + n), 0)
        q = torch.randn(bs * n, heads, dim, device="cuda", dtype=torch.bfloat16)
        k_ext = torch.randn(bs * n, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v_ext = torch.randn(bs * n, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        scale = dim**-0.5

        def run(mask):
            o = torch.empty_like(q)
            extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                 mask, True, mask_indptr if mask is not None else None, n, 1.0, 1.0,
                                 sm_scale=scale)
            return o.float()

        want = _dense_tree_attention(q, k_ext, v_ext, k_buf, v_buf, kv_indices, prefix, vt.ancestor_mask, scale)
        got = run(vt.full_mask)
        _save("extend_attention_tree_out", got, atol=ATOL)
        assert (got - want).abs().max().item() <= ATOL
        assert (run(None) - want).abs().max().item() > 10 * ATOL  # causal-only is not tree attention


class TestTreeKernels:
    def _inputs(self, bs: int, seed: int):
        tree = _tree(bs, horizon=6, vocab=10, budget=16, seed=seed)
        vt = verify_tensors(tree, torch.zeros(bs, dtype=torch.int64, device="cuda"), 0)
        cands = vt.input_ids.view(bs, tree.n)
        return tree, vt, cands

    def test_verify_tree_greedy_walks_like_repro(self):
        """verify_tree_greedy on our pointers accepts the same path and bonus as repro's walk."""
        from sgl_kernel import verify_tree_greedy

        bs = 64
        tree, vt, cands = self._inputs(bs, seed=2)
        g = torch.Generator(device="cuda").manual_seed(3)
        # target tokens: a child's token 60% of the time, so paths get long
        pick = torch.gather(cands, 1, torch.randint(0, tree.n, cands.shape, device="cuda", generator=g))
        noise = torch.randint(0, 10, cands.shape, device="cuda", generator=g)
        target = torch.where(torch.rand(cands.shape, device="cuda", generator=g) < 0.6, pick, noise)
        width = tree.horizon + 1
        predicts = torch.full((bs * tree.n,), -1, dtype=torch.int32, device="cuda")
        accept_index = torch.full((bs, width), -1, dtype=torch.int32, device="cuda")
        accept_num = torch.zeros(bs, dtype=torch.int32, device="cuda")
        verify_tree_greedy(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                           candidates=cands, retrive_index=vt.retrive_index, retrive_next_token=vt.retrive_next_token,
                           retrive_next_sibling=vt.retrive_next_sibling, target_predict=target)
        res = walk(tree, target)
        _save("verify_tree_greedy_accept_index", accept_index)
        assert torch.equal(accept_num.long() + 1, res.accept_len)
        base = torch.arange(bs, device="cuda")[:, None] * tree.n
        cols = torch.arange(width, device="cuda")
        valid = cols < res.accept_len[:, None]
        assert torch.equal(torch.where(valid, accept_index.long() - base, -1), torch.where(valid, res.accept_index, -1))
        last = torch.gather(accept_index.long(), 1, (res.accept_len - 1)[:, None])[:, 0]
        assert torch.equal(predicts.long()[last], res.bonus)

    def test_target_only_sampling_follows_the_target_distribution(self):
        """With draft probs 0 and thresholds 1 the kernel's first two tokens follow the target."""
        from sgl_kernel import tree_speculative_sampling_target_only

        bs, vocab = 6000, 10
        tree, vt, _ = self._inputs(1, seed=4)
        n = tree.n
        g = torch.Generator(device="cuda").manual_seed(5)
        probs1 = torch.softmax(torch.randn(1, n, vocab, device="cuda", generator=g) * 1.5, -1)
        expand = lambda t: t.expand(bs, *t.shape[1:]).contiguous()  # noqa: E731
        cands = expand(vt.input_ids.view(1, n))
        index = torch.arange(bs * n, device="cuda").view(bs, n)
        width = tree.horizon + 1
        predicts = torch.full((bs * n,), -1, dtype=torch.int32, device="cuda")
        accept_index = torch.full((bs, width), -1, dtype=torch.int32, device="cuda")
        accept_num = torch.zeros(bs, dtype=torch.int32, device="cuda")
        tree_speculative_sampling_target_only(
            predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=cands,
            retrive_index=index, retrive_next_token=expand(vt.retrive_next_token),
            retrive_next_sibling=expand(vt.retrive_next_sibling),
            uniform_samples=torch.rand(bs, n, device="cuda", generator=g),
            uniform_samples_for_final_sampling=torch.rand(bs, device="cuda", generator=g),
            target_probs=expand(probs1), draft_probs=torch.zeros(bs, n, vocab, device="cuda"),
            threshold_single=1.0, threshold_acc=1.0, deterministic=True)
        # emitted: candidates along the path, then the bonus (predicts at the last accepted row)
        rows = accept_index.long()
        tau = accept_num.long() + 1
        emitted = []
        for b in range(bs):
            path = rows[b, : tau[b]].tolist()
            toks = [int(cands[b, r - b * n]) for r in path[1:]] + [int(predicts[path[-1]])]
            emitted.append((toks[0], toks[1] if len(toks) > 1 else -1))
        _save("target_only_sampling_pairs", torch.tensor(emitted))
        # exact law: t1 ~ p_root; if t1 is a child c's token, t2 ~ p_c, else the round ends (-1)
        p = probs1[0].double().cpu()
        child = {int(tree.tokens[0, i]): i for i in range(1, n) if int(tree.parents[0, i]) == 0}
        expected = {}
        for t1 in range(vocab):
            if t1 in child:
                for t2 in range(vocab):
                    expected[(t1, t2)] = float(p[0, t1] * p[child[t1], t2])
            else:
                expected[(t1, -1)] = float(p[0, t1])
        assert chi_square_p(*keyed(Counter(emitted), expected)) > alpha()
