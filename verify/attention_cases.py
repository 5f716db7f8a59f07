"""Verify-attention cases: batches of draft trees (or chains) over cached prefixes in a scrambled
KV pool, SGLang's argument layout, and the attention they must produce (float64 reference).

Used by the CPU test (the kernels under ``TRITON_INTERPRET=1``), the GPU test and the benchmark
(``verify/bench/bench_verify_attention.py``). As a script it runs ``verify_attention`` on every case
of a saved list and saves the outputs:

    TRITON_INTERPRET=1 python -m verify.attention_cases IN.pt OUT.pt
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def random_tree_mask(q_len: int, gen: torch.Generator) -> torch.Tensor:
    """[q_len, q_len] bool: node i sees its ancestors and itself, node 0 the root, each node's
    parent an earlier node."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q_len)]
    mask = torch.zeros(q_len, q_len, dtype=torch.bool)
    for i in range(q_len):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


def make_case(prefixes: list[int], q_len: int, *, q_heads: int, kv_heads: int, head_dim: int, tree: bool,
              dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0,
              mask_dtype: torch.dtype = torch.bool) -> dict:
    """One batch: ``prefixes[b]`` cached tokens of request b at scrambled pool slots, ``q_len``
    draft tokens each, a random tree mask per request (``tree``) or causal chains."""
    gen = torch.Generator().manual_seed(seed)
    bs, tokens = len(prefixes), len(prefixes) * q_len
    pool = sum(prefixes) + 7

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    slots = torch.randperm(pool, generator=gen)[: sum(prefixes)]
    kv_indptr = torch.tensor([0, *torch.tensor(prefixes).cumsum(0).tolist()], dtype=torch.int32)
    qo_indptr = torch.arange(bs + 1, dtype=torch.int32) * q_len
    case = {
        "q": rand(tokens, q_heads, head_dim), "k_ext": rand(tokens, kv_heads, head_dim),
        "v_ext": rand(tokens, kv_heads, head_dim), "k_buffer": rand(pool, kv_heads, head_dim),
        "v_buffer": rand(pool, kv_heads, head_dim), "qo_indptr": qo_indptr.to(device),
        "kv_indptr": kv_indptr.to(device), "kv_indices": slots.to(torch.int64).to(device),
        "custom_mask": None, "mask_indptr": None, "max_q_len": q_len, "sm_scale": head_dim ** -0.5,
    }
    if tree:  # SGLang's full-mask layout: each row spans prefix + q_len columns, the prefix all True
        rows, starts = [], [0]
        for prefix in prefixes:
            full = torch.ones(q_len, prefix + q_len, dtype=torch.bool)
            full[:, prefix:] = random_tree_mask(q_len, gen)
            rows.append(full.flatten())
            starts.append(starts[-1] + full.numel())
        case["custom_mask"] = torch.cat(rows).to(mask_dtype).to(device)
        case["mask_indptr"] = torch.tensor(starts, dtype=torch.int64).to(device)
    return case


def reference(case: dict) -> torch.Tensor:
    """[T, Hq, Dv] float64: each draft token's attention over its request's prefix and the draft
    tokens its mask (or causality) lets it see."""
    q, k_ext, v_ext = (case[n].double().cpu() for n in ("q", "k_ext", "v_ext"))
    k_buf, v_buf = case["k_buffer"].double().cpu(), case["v_buffer"].double().cpu()
    qo, kv = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    slots = case["kv_indices"].cpu()
    group = q.shape[1] // k_ext.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v_ext.shape[2], dtype=torch.float64)
    for b in range(len(qo) - 1):
        q_len, prefix = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        cached = slots[kv[b]: kv[b + 1]]
        keys = torch.cat([k_buf[cached], k_ext[qo[b]: qo[b + 1]]])  # [prefix + q_len, Hkv, D]
        vals = torch.cat([v_buf[cached], v_ext[qo[b]: qo[b + 1]]])
        if case["custom_mask"] is not None:
            start = int(case["mask_indptr"][b])
            see = case["custom_mask"].cpu()[start: start + q_len * (prefix + q_len)].view(q_len, -1).bool()
        else:
            see = torch.ones(q_len, prefix + q_len, dtype=torch.bool)
            see[:, prefix:] = torch.ones(q_len, q_len, dtype=torch.bool).tril()
        for h in range(q.shape[1]):
            s = q[qo[b]: qo[b + 1], h] @ keys[:, h // group].T * case["sm_scale"]
            s = s.masked_fill(~see, float("-inf"))
            out[qo[b]: qo[b + 1], h] = torch.softmax(s, -1) @ vals[:, h // group]
    return out


KERNEL_ARGS = ("q", "k_ext", "v_ext", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr", "kv_indices",
               "custom_mask", "mask_indptr", "max_q_len", "sm_scale")
"""A case's entries that ``verify_attention`` takes, by name."""


def run(case: dict, o: torch.Tensor | None = None) -> torch.Tensor:
    """``verify_attention`` on one case, into ``o`` (allocated here if None)."""
    from repro.kernels.verify_attention import verify_attention

    if o is None:
        o = torch.empty(case["q"].shape[0], case["q"].shape[1], case["v_ext"].shape[2],
                        dtype=case["q"].dtype, device=case["q"].device)
    return verify_attention(o=o, **{n: case[n] for n in KERNEL_ARGS})


def sglang_extend(case: dict, o: torch.Tensor) -> Callable[[], object] | None:
    """A call of SGLang's ``extend_attention_fwd`` on the case into ``o`` (causal for a chain), or
    None where SGLang is not importable."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except ImportError:
        return None
    tree = case["custom_mask"] is not None
    return lambda: extend_attention_fwd(
        case["q"], case["k_ext"], case["v_ext"], o, case["k_buffer"], case["v_buffer"], case["qo_indptr"],
        case["kv_indptr"], case["kv_indices"], case["custom_mask"], not tree, case["mask_indptr"], case["max_q_len"],
        1.0, 1.0, case["sm_scale"])


def _interpreter_scalar_index() -> None:
    """Let the Triton interpreter loop to a loaded bound: its scalars are NumPy arrays of shape
    (1,), which it turns into a loop bound by ``int(array)``, an error since NumPy 2.4 (triton
    3.6's interpreter; compiled kernels are unaffected)."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor: type, scope: object) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if __name__ == "__main__":
    _interpreter_scalar_index()
    cases = torch.load(sys.argv[1])
    torch.save([run(c) for c in cases], sys.argv[2])
