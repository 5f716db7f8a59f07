"""Logit rows for the fused top-K + lse kernel's tests and benchmark, the torch reference and
the exactness check.

Also a runner for the Triton interpreter: ``python -m verify.kernel_cases IN.pt OUT.pt`` runs
:func:`repro.kernels.topk_lse.topk_lse` under ``TRITON_INTERPRET=1`` on every case saved in IN.pt
(a list of dicts with ``x``, ``k``, ``id_offset``) and saves the outputs to OUT.pt. The CPU tests
start it in a subprocess, because Triton picks interpreter or compiler when a kernel is defined,
once per process.
"""

from __future__ import annotations

import os
import sys

import torch

KINDS = ("random", "tied", "flat", "peaked", "floor", "creep", "ascending", "descending", "boundary", "signed_zeros")
"""random: N(0, 3²); tied: few distinct values; flat: one value; peaked: a few equal spikes over
noise; floor: 32 distinct values over a flat floor (the drafter test hook's rows: past k 32 the
top-K takes floor ties); creep: float32 values rising by an ulp every token or few within one
bf16 step (every token ties in the kernels' 16-bit keys, yet each beats the ones before it: the
slow path's worst case); ascending/descending: sorted rows; boundary: many ties exactly at the
k-th value; signed_zeros: -0.0/+0.0 (equal, so ordered by id) among a few other values."""


def make_logits(
    kind: str, rows: int, vocab: int, dtype: torch.dtype, *, k: int = 1, seed: int = 0
) -> torch.Tensor:
    """Rows of logits of one ``kind`` (see KINDS) in ``dtype``, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    shape = (rows, vocab)
    if kind in ("random", "boundary"):
        x = torch.randn(shape, generator=g) * 3
    elif kind == "tied":
        x = torch.randint(-4, 5, shape, generator=g).float() * 0.5
    elif kind == "flat":
        x = torch.full(shape, 1.25)
    elif kind == "peaked":
        x = torch.randn(shape, generator=g)
        spikes = torch.randint(0, vocab, (rows, 6), generator=g)
        x.scatter_(1, spikes, 14.0)
    elif kind in ("floor", "creep"):
        x = _slow_path_rows(kind, rows, vocab, g)
    elif kind in ("ascending", "descending"):
        x = torch.linspace(-8.0, 8.0, vocab).repeat(rows, 1) + torch.arange(rows)[:, None]
        if kind == "descending":
            x = x.flip(-1)
    elif kind == "signed_zeros":
        pool = torch.tensor([-0.0, 0.0, -0.0, 0.0, -1.5, 2.0])
        x = pool[torch.randint(0, len(pool), shape, generator=g)]
    else:
        msg = f"make_logits: kind must be one of {KINDS} (got {kind!r})"
        raise ValueError(msg)
    x = x.to(dtype)
    if kind == "boundary":
        kth = torch.sort(x.float(), dim=-1, descending=True).values[:, min(k, vocab) - 1]
        spots = torch.randint(0, vocab, (rows, 2 * k + 3), generator=g)
        x.scatter_(1, spots, kth.to(dtype)[:, None].expand_as(spots).contiguous())
    return x


def _slow_path_rows(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """float32 ``floor`` or ``creep`` rows (KINDS): past a small k, more candidates than the select's buffer."""
    if kind == "floor":
        x = torch.full((rows, vocab), -30.0)
        ranked = torch.rand((rows, vocab), generator=g).argsort(dim=-1)[:, :32]
        x.scatter_(1, ranked, -torch.rand(rows, ranked.shape[1], generator=g).sort(dim=-1).values * 20)
    else:
        ulps = torch.arange(vocab) * (2**16 - 1) // max(vocab - 1, 1)
        x = (1.0 + ulps.double() * 2**-23).float().repeat(rows, 1)
    return x


def reference_topk_lse(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contract on the CPU: stable descending sort of float32 (ties by ascending id), logsumexp."""
    xf = x.detach().float().cpu()
    vals, ids = torch.sort(xf, dim=-1, descending=True, stable=True)
    return vals[..., :k], ids[..., :k], torch.logsumexp(xf, dim=-1)


def assert_exact(x: torch.Tensor, k: int, out: tuple[torch.Tensor, ...], id_offset: int = 0) -> None:
    """``topk_lse`` outputs for rows ``x`` [..., V]: ids and logits equal the reference exactly,
    lse within ``LSE_RTOL`` (relative, at least 1 in the denominator)."""
    from repro.kernels.topk_lse import LSE_RTOL

    logits, ids = (t.cpu().reshape(-1, k) for t in out[:2])
    lse = out[2].cpu().reshape(-1)
    ref_logits, ref_ids, ref_lse = reference_topk_lse(x.reshape(-1, x.shape[-1]), k)
    assert torch.equal(ids, ref_ids + id_offset)
    assert torch.equal(logits, ref_logits)
    err = (lse - ref_lse).abs()
    assert (err <= LSE_RTOL * ref_lse.abs().clamp(min=1)).all(), err.max()


def _fix_interpreter_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter calls int() on 1-element arrays, an error since numpy 2.4.

    Upstream fix: triton-lang/triton#9172 (after 3.6). Re-register ``tensor.__index__`` after
    the interpreter patches the language module.
    """
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor

    def patched(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched


def _run_interpreted(src: str, dst: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    _fix_interpreter_for_numpy_2_4()
    from repro.kernels.topk_lse import TopKConfig, prepare, topk_lse

    outs = []
    for case in torch.load(src):
        config = TopKConfig(**case.get("config", {}))
        if "then" in case:  # launch twice on one set of buffers, new logits in place (as graph replays do)
            x = case["x"].clone()
            stream, select, out = prepare(x, case["k"], case.get("id_offset", 0), config=config)
            for logits in (case["x"], case["then"]):
                x.copy_(logits)
                stream()
                select()
            outs.append(out)
        else:
            outs.append(topk_lse(case["x"], case["k"], case.get("id_offset", 0), config=config))
    torch.save(outs, dst)


if __name__ == "__main__":
    _run_interpreted(sys.argv[1], sys.argv[2])


def interpret(script: str, *, timeout: float = 900) -> str:
    """Run ``script`` under the Triton interpreter (TRITON_INTERPRET=1) in a fresh interpreter at
    the repository root; its stdout, after asserting it exited 0 (stderr in the message)."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
