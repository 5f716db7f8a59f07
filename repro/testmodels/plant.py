"""Planting a loaded model in memory: the full-size planted targets, which no disk could hold.

SGLang loads the target with ``--load-format dummy`` (every weight uniform in +-1e-3), and patch
0005 then calls :func:`plant_file` when ``SGLANG_REPRO_PLANT`` names a ``planted.json``. Planting
rewrites, by parameter name, what the planted construction (repro.testmodels.planted) needs and
leaves every other weight as loaded, so every matmul still runs at full size:

- ``embed_tokens``: one-hot rows; ``lm_head``: the planted head (rows past the vocabulary zero);
- every RMSNorm weight (``*norm.weight``: input / post-attention / q / k / q_a / kv_a / final): 1;
- every output projection: attention ``o_proj``, dense and shared-expert ``down_proj``, and the
  fused-MoE down weights ``w2_weight`` (shared experts fused into them included): 0;
- each MoE router (``mlp.gate.weight``) gets :func:`router_weight` and its
  ``e_score_correction_bias`` 0, so with the residual stream one-hot in ``c = t mod H`` each
  token picks its own 8 experts per layer, as a real router spreads tokens (verify cost grows
  with the number of distinct tree tokens).

MLA's absorbed ``w_kc`` / ``w_vc`` (copied from ``kv_b_proj`` by the model's post-load step) are
not parameters and are left alone: ``kv_b_proj`` keeps its loaded values, so the copies stay
consistent, and the zero ``o_proj`` makes the attention output irrelevant anyway. The names
match SGLang's modules (fused ``qkv_proj`` / ``gate_up_proj`` / ``w13_weight``) and Hugging
Face's (checkpoint ``experts.{j}.down_proj.weight``, fused ``experts.down_proj``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from repro.testmodels.planted import fill_embedding_, fill_head_

ENV_VAR = "SGLANG_REPRO_PLANT"
ZERO_MODULES = ("o_proj", "down_proj", "w2")  # output projections, by module (or fused-MoE) name
ROUTER_STEP = 2.0 ** -15  # router logits stay within +-0.5: no sigmoid saturates, no two tie

log = logging.getLogger(__name__)
_LAYER = re.compile(r"layers\.(\d+)\.")


@dataclass
class PlantReport:
    """What :func:`plant_parameters` changed, per kind (counts of tensors)."""

    zeroed: int = 0
    ones: int = 0
    routers: int = 0
    layers_zeroed: dict[int, set[str]] = field(default_factory=dict)  # layer -> {"attn", "mlp"}

    def summary(self) -> str:
        """One line for the server log."""
        return (f"zeroed {self.zeroed} output projections in {len(self.layers_zeroed)} layers, "
                f"{self.ones} norms set to 1, {self.routers} routers planted")


def router_weight(seed: int, layer: int, n_experts: int, hidden: int) -> torch.Tensor:
    """[E, H] float32 router whose every column is a random permutation of E distinct values.

    The values are ``k * ROUTER_STEP`` for the E integers k around 0, exact in bf16 (E <= 512), so
    a token's router logits (its one-hot times this) rank the experts by that permutation, with
    no ties in bf16 or after the sigmoid.
    """
    if not 1 <= n_experts <= 512:  # bf16 holds the integers up to 256 exactly
        msg = f"router_weight: n_experts must be in 1..512 (got {n_experts})"
        raise ValueError(msg)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + layer)
    grid = (torch.arange(n_experts, dtype=torch.float32) - n_experts // 2) * ROUTER_STEP
    perms = torch.rand(hidden, n_experts, generator=gen, dtype=torch.float32).argsort(dim=1)  # [H, E]
    return grid[perms].T.contiguous()


def _module_of(name: str) -> str:
    """The projection a parameter belongs to: ``...self_attn.o_proj.weight`` -> ``o_proj``,
    ``...experts.w2_weight`` -> ``w2``, a fused ``...experts.down_proj`` -> ``down_proj``."""
    parts = name.split(".")
    if parts[-1] in ("weight", "bias") and len(parts) > 1:
        return parts[-2]
    return "w2" if parts[-1] in ("w2_weight", "w2_weight_bias") else parts[-1]


def _finite(param: torch.Tensor, chunk: int = 1 << 28) -> bool:
    """Whether every value is finite, checked in chunks (no full-size temporary)."""
    flat = param.detach().reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


def _plant_io(name: str, param: torch.Tensor, info: dict) -> bool:
    vocab, hidden = info["vocab_size"], info["hidden_size"]
    if not name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return False
    if param.dim() != 2 or param.shape[0] < vocab or param.shape[1] != hidden:
        msg = (f"planting {name}: expected [>= {vocab}, {hidden}] (the whole vocabulary on one rank, "
               f"tp 1), got {list(param.shape)}")
        raise ValueError(msg)
    if name.endswith("embed_tokens.weight"):
        fill_embedding_(param.data, vocab)
    else:
        fill_head_(param.data, info["ranked"])
    return True


@torch.no_grad()
def plant_parameters(params: Iterable[tuple[str, torch.Tensor]], info: dict) -> PlantReport:
    """Plant the named parameters of a target in place (see the module docstring).

    ValueError when the embedding or head is missing or sharded, when a layer is left with a
    nonzero attention or MLP output, or when a weight is not finite.
    """
    report, io_seen = PlantReport(), set()
    for name, param in params:
        layer = _LAYER.search(name)
        if _plant_io(name, param, info):
            io_seen.add("embed" if "embed_tokens" in name else "head")
        elif name.endswith("norm.weight"):
            param.data.fill_(1.0)
            report.ones += 1
        elif _module_of(name) in ZERO_MODULES:
            param.data.zero_()
            report.zeroed += 1
            if layer:
                kind = "attn" if _module_of(name) == "o_proj" else "mlp"
                report.layers_zeroed.setdefault(int(layer.group(1)), set()).add(kind)
        elif name.endswith("mlp.gate.weight") and layer:
            weight = router_weight(info["router_seed"], int(layer.group(1)), *param.shape)
            param.data.copy_(weight.to(param.dtype))
            report.routers += 1
        elif name.endswith("mlp.gate.e_score_correction_bias"):
            param.data.zero_()
        if not _finite(param):
            msg = f"planting: {name} holds a non-finite value; an inert layer would pass it on"
            raise ValueError(msg)
    missing = sorted({"embed", "head"} - io_seen)
    layers = info.get("num_hidden_layers", 1 + max(report.layers_zeroed, default=-1))
    open_layers = [i for i in range(layers) if report.layers_zeroed.get(i) != {"attn", "mlp"}]
    if missing or open_layers:
        msg = (f"planting: no {' or '.join(missing)} parameter found" if missing else
               f"planting: layers {open_layers} keep a nonzero attention or MLP output")
        raise ValueError(msg)
    return report


def plant(model: torch.nn.Module, info: dict) -> PlantReport | None:
    """Plant ``model`` if it is the architecture ``info`` names; None (untouched) otherwise.

    The drafter loads through the same dummy loader and is skipped here by its class name.
    """
    if type(model).__name__ != info["architecture"]:
        return None
    return plant_parameters(model.named_parameters(), info)


def plant_file(model: torch.nn.Module, path: str | Path) -> PlantReport | None:
    """Patch 0005's entry: plant ``model`` from the ``planted.json`` at ``path`` and log it."""
    info = json.loads(Path(path).read_text())
    report = plant(model, info)
    name = type(model).__name__
    if report is None:
        log.info("%s=%s: %s is not %s, left as loaded", ENV_VAR, path, name, info["architecture"])
    else:
        log.info("%s=%s: planted %s: %s", ENV_VAR, path, name, report.summary())
    return report
