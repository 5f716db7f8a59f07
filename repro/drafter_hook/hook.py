"""The drafter test hook: drafter rows [bs, L, V] with a controlled rank for the correct token.

Off by default. The patched DFLASH and DDTREE workers build it only when the environment
variable ``SGLANG_DDTREE_TEST_DRAFTER`` names a JSON file (written by ``repro.testmodels``)::

    {"successor": [V ints], "profile": "NAME" | {profile table}, "seed": 0}
    {"successor": [V ints], "rank_probs": [p0, p1, ...], "seed": 0}   # the "fixed" kind

``successor[t]`` is the planted target's greedy next token after ``t``: the target's greedy
continuation of a root ``r`` is ``succ(r), succ(succ(r)), ...``, so the correct token at depth
``d`` is ``c_d = succ^d(root)`` and acceptance is a pure function of the hook's rows.

**A row.** Each row (request b, depth d = 1..L) has a *level* k (its shape) and gives rank
``j < R`` the logit ``logits[k, j]`` (rank 0 is 0, a unique maximum; the values strictly decrease,
are exact in float32, bfloat16 and float16, and stop at -30), every other token its *floor*
(``floor_logits``: -30 down to -59.75, a hash of the token id). The correct
token ``c_d`` sits at rank ``j`` with probability ``law[k, j]`` (absent with the rest); decoys
``(c_d + 1 + j * S) mod V`` fill the other ranks, ``S`` (``decoy_stride``) the largest odd number
at most V / R: spread over the vocabulary as a real drafter's candidates are. Packed into one
group of 32 ids, they sent ``repro.kernels.topk_lse``'s group-key select down its slow path at
every K > 2 (81 µs a B 16 round on the full-size target where spread rows take 16); at a power-of-two
stride the ranks aliased with the select's super keys on the GPU (maxima of 8 group keys over a
partition Triton may reorder), too few stood above the floor and K 15 took the slow path again (133
µs at bs 1 against 12: ``verify.bench.bench_hook_tail --decoy-stride 2048``). A rank's
decoy is the same token for a given correct token at every budget, and trees break ties by rank,
never by id, so the law of acceptance does not depend on ``S``.

**The floor.** A real drafter's tail is a spread of values, not one. With every unranked token at
-30, a top-K past the R ranks (DDTREE's at B >= 64: K 63 > R 32) met 150 K tokens tied at its
threshold and scanned the row whole (161 µs a B 63 round on the full-size target, a test
artifact). So an unranked token's logit is -30 minus a step per level, its level a 13-bit hash of
its id (``hashes.FLOOR_HASH``) capped at ``FLOOR_LEVELS`` - 1: about V / 8192 tokens a level (19 at Qwen3's
vocabulary), the rest at the lowest; a K-th best falls among a few tied tokens. No tree up to B 512
reaches an unranked token (``verify.bench.hook_law`` refuses one that would), so the law does not
depend on the floor either.

**The draws.** Everything is a deterministic hash of (seed, root, prefix length, depth): two
24-bit uniforms per row (one for the level, one for the rank), identical on every TP rank, no
generator state. Levels follow a Markov chain along the block, so difficulty persists as text
difficulty does. The rank law has two rows per level: *on* the drafter's path (every earlier
correct token was its rank 0) and *off* it (the text has left the path the drafter expected).

**Profiles**: ``repro.drafter_hook.profiles`` (the kinds, ``repro/data/drafter_profiles.toml``).

DFLASH proposes each row's argmax (rank 0); DDTREE builds its tree from the same rows, so side
branches really get accepted. ``DrafterTestHook.logits`` is the torch reference (the spec);
``DrafterTestHook.rows`` writes the same values (and ``top1`` the argmax alone) in one Triton
launch on CUDA (``repro.drafter_hook.rows``: no host sync, no allocation when the outputs are
given, so capturable in a CUDA graph).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from repro.drafter_hook.hashes import LEVEL_SALT, floor_logits, uniforms
from repro.drafter_hook.profiles import ROW_DTYPES, HookTables, compile_profile, hook_profile

ENV_VAR = "SGLANG_DDTREE_TEST_DRAFTER"


@dataclass(frozen=True)
class DrafterTestHook:
    """Controlled drafter rows [bs, L, V] for the planted target (see module docstring)."""

    successor: torch.Tensor  # [V] int64
    tables: HookTables
    seed: int
    horizon: int  # L
    profile: str = "default"
    powers: torch.Tensor = field(init=False, repr=False)  # [L, V] int32; powers[d-1, t] = succ^d(t)

    def __post_init__(self) -> None:
        succ = self.successor.to(torch.int32)
        rows, cur = [], succ
        for _ in range(self.horizon):
            rows.append(cur)
            cur = succ[cur.long()]
        object.__setattr__(self, "powers", torch.stack(rows).contiguous())

    @property
    def decoy_stride(self) -> int:
        """S: ids between consecutive decoys, the largest odd number at most V / R."""
        most = max(1, self.vocab_size // self.tables.ranks)
        return most - 1 + most % 2

    @property
    def vocab_size(self) -> int:
        """V."""
        return self.successor.shape[0]

    @classmethod
    def from_env(cls, *, horizon: int, vocab_size: int, device: torch.device | str) -> DrafterTestHook:
        """Load the hook named by ``SGLANG_DDTREE_TEST_DRAFTER``; ValueError if it is malformed."""
        return cls.from_file(Path(os.environ[ENV_VAR]), horizon=horizon, vocab_size=vocab_size, device=device)

    @classmethod
    def from_file(
        cls, path: Path, *, horizon: int, vocab_size: int, device: torch.device | str
    ) -> DrafterTestHook:
        """Load a hook file; one ValueError naming the field for each malformed entry."""
        spec = json.loads(Path(path).read_text())
        succ = spec.get("successor")
        if not isinstance(succ, list) or len(succ) != vocab_size:
            got = len(succ) if isinstance(succ, list) else type(succ).__name__
            msg = f"{path}: 'successor' must list {vocab_size} token ids (got {got})"
            raise ValueError(msg)
        seed = spec.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 31:
            msg = f"{path}: 'seed' must be an integer in [0, 2^31) (got {seed!r})"
            raise ValueError(msg)
        name, profile = hook_profile(spec, path)
        return cls.build(succ, profile, horizon=horizon, seed=seed, device=device, name=name, where=f"{path}: {name}")

    @classmethod
    def build(
        cls,
        successor: list[int] | torch.Tensor,
        profile: dict[str, Any],
        *,
        horizon: int,
        seed: int = 0,
        device: torch.device | str = "cpu",
        name: str = "inline",
        where: str = "profile",
    ) -> DrafterTestHook:
        """The hook for a successor table and a profile table (the TOML schema)."""
        succ = torch.as_tensor(successor, dtype=torch.int64).cpu()
        if succ.dim() != 1 or (succ.numel() and not 0 <= int(succ.min()) <= int(succ.max()) < succ.numel()):
            msg = f"{where}: 'successor' must hold token ids in [0, {succ.numel()})"
            raise ValueError(msg)
        tables = compile_profile(profile, vocab_size=succ.shape[0], where=where)
        return cls(succ.to(device), tables.to(device), seed, horizon, name)

    def correct_tokens(self, roots: torch.Tensor) -> torch.Tensor:
        """[bs, L] the planted target's greedy continuation of each root."""
        out, cur = [], roots.to(torch.int64)
        for _ in range(self.horizon):
            cur = self.successor[cur]
            out.append(cur)
        return torch.stack(out, 1)

    def levels(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L] int64 each row's level (its shape)."""
        return self.draws(roots, prefix_lens)[0]

    def ranks(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L] int64 rank of the correct token at each depth; R means absent."""
        return self.draws(roots, prefix_lens)[1]

    def logits(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L, V] float32 rows for roots [bs] at committed lengths [bs]: the reference."""
        vocab, n_ranks = self.vocab_size, self.tables.ranks
        correct = self.correct_tokens(roots)  # [bs, L]
        level, rank = self.draws(roots, prefix_lens)
        j = torch.arange(n_ranks, device=roots.device)
        decoys = (correct[..., None] + 1 + j * self.decoy_stride) % vocab  # [bs, L, R], never the correct token
        tokens = torch.where(j == rank[..., None], correct[..., None], decoys)
        floor = floor_logits(torch.arange(vocab, device=roots.device))
        out = floor.expand(*correct.shape, vocab).clone()
        out.scatter_(2, tokens, self.tables.logits[level])
        return out

    def rows(
        self,
        roots: torch.Tensor,
        prefix_lens: torch.Tensor,
        out: torch.Tensor | None = None,
        top1_out: torch.Tensor | None = None,
        *,
        vocab_start: int = 0,
        vocab_end: int | None = None,
    ) -> torch.Tensor:
        """The rows' columns ``vocab_start:vocab_end`` [bs, L, W], equal to ``logits`` there.

        ``roots`` [bs] int64 (a strided view is fine), ``prefix_lens`` [bs] int32/int64. ``out``
        (float32, bfloat16 or float16, last dim contiguous; default float32) receives them;
        ``top1_out`` [bs, L] int64, if given, each whole row's argmax (the rank-0 token, a unique
        maximum). On CUDA one Triton launch, no host sync, no allocation when ``out`` is given
        (``REPRO_DDTREE_KERNELS=torch`` takes the reference; ``fused`` the kernel anywhere, CPU
        under TRITON_INTERPRET=1).
        """
        end = self.vocab_size if vocab_end is None else vocab_end
        bs = roots.shape[0]
        self._check_rows_args(roots, prefix_lens, out, top1_out, vocab_start, end)
        if out is None:
            out = torch.empty((bs, self.horizon, end - vocab_start), dtype=torch.float32, device=roots.device)
        if bs == 0:
            return out
        if _use_kernel(roots.device):
            self._launch(roots, prefix_lens, out, top1_out, vocab_start)
            return out
        full = self.logits(roots, prefix_lens)
        out.copy_(full[..., vocab_start:end])
        if top1_out is not None:
            top1_out.copy_(full.argmax(-1))
        return out

    def top1(self, roots: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[bs, L] int64 each row's argmax (DFLASH's proposals) without writing the rows.

        The same path as ``rows`` (one launch of bs * L programs on CUDA); ``out`` receives it.
        """
        bs = roots.shape[0]
        self._check_rows_args(roots, prefix_lens, None, out, 0, self.vocab_size)
        if out is None:
            out = torch.empty((bs, self.horizon), dtype=torch.int64, device=roots.device)
        if bs == 0:
            return out
        if _use_kernel(roots.device):
            self._launch(roots, prefix_lens, None, out, 0)
            return out
        return out.copy_(self.logits(roots, prefix_lens).argmax(-1))

    def _launch(self, roots: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor | None,
                top1_out: torch.Tensor | None, vocab_start: int) -> None:
        from repro.drafter_hook.rows import hook_rows

        hook_rows(self.powers, self.tables, roots, prefix_lens, out, top1_out, seed=self.seed,
                  decoy_stride=self.decoy_stride, vocab_start=vocab_start)

    def _check_rows_args(
        self,
        roots: torch.Tensor,
        prefix_lens: torch.Tensor,
        out: torch.Tensor | None,
        top1_out: torch.Tensor | None,
        start: int,
        end: int,
    ) -> None:
        bs = roots.shape[0]
        if roots.dim() != 1 or roots.dtype != torch.int64 or prefix_lens.shape != (bs,):
            got = f"{roots.dtype} {tuple(roots.shape)}, {tuple(prefix_lens.shape)}"
            msg = f"rows: roots must be [bs] int64 and prefix_lens [bs] (got {got})"
            raise ValueError(msg)
        if prefix_lens.dtype not in (torch.int32, torch.int64):
            msg = f"rows: prefix_lens must be int32 or int64 (got {prefix_lens.dtype})"
            raise ValueError(msg)
        if not 0 <= start < end <= self.vocab_size:
            msg = f"rows: vocab_start:vocab_end must satisfy 0 <= start < end <= {self.vocab_size} (got {start}:{end})"
            raise ValueError(msg)
        want = (bs, self.horizon, end - start)
        if out is not None and (tuple(out.shape) != want or out.dtype not in ROW_DTYPES or out.stride(-1) != 1):
            got = f"{out.dtype} {tuple(out.shape)} strides {out.stride()}"
            msg = f"rows: out must be {list(want)} float32/bfloat16/float16 with a contiguous last dim (got {got})"
            raise ValueError(msg)
        if top1_out is not None and (tuple(top1_out.shape) != want[:2] or top1_out.dtype != torch.int64):
            msg = f"rows: top1_out must be {list(want[:2])} int64 (got {top1_out.dtype} {tuple(top1_out.shape)})"
            raise ValueError(msg)
        for name, t in (("prefix_lens", prefix_lens), ("out", out), ("top1_out", top1_out)):
            if t is not None and t.device != roots.device:
                msg = f"rows: {name} must be on {roots.device} like roots (got {t.device})"
                raise ValueError(msg)

    def draws(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(levels, ranks) [bs, L]: the level chain, then the correct ranks on / off the path."""
        u_level = uniforms(roots, prefix_lens, horizon=self.horizon, seed=self.seed, salt=LEVEL_SALT)
        u_rank = uniforms(roots, prefix_lens, horizon=self.horizon, seed=self.seed, salt=0)
        level = torch.full_like(u_level[:, 0], self.tables.levels)  # the start row of level_thresholds
        off = torch.zeros_like(level)  # 1 once an earlier correct token was not rank 0
        levels, ranks = [], []
        for d in range(self.horizon):
            level = (u_level[:, d, None] >= self.tables.level_thresholds[level]).sum(-1)
            rank = (u_rank[:, d, None] >= self.tables.rank_thresholds[off, level]).sum(-1)
            off = off | (rank != 0).long()
            levels.append(level)
            ranks.append(rank)
        return torch.stack(levels, 1), torch.stack(ranks, 1)


def _use_kernel(device: torch.device) -> bool:
    from repro.round import use_kernels  # the one place that picks kernels or torch

    return use_kernels(device, fits=True)


