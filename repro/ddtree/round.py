"""One DDTree round, top to bottom: tree -> verify tensors -> target -> walk -> commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from repro.ddtree.commit import accepted_rows, emitted_tokens
from repro.ddtree.tensors import verify_tensors
from repro.ddtree.tree import build_trees
from repro.ddtree.types import DraftTree, VerifyTensors, WalkResult
from repro.ddtree.walk import walk


@dataclass(frozen=True)
class RoundOutput:
    """A round's tree and walk, plus what the caller commits."""

    tree: DraftTree
    verify: VerifyTensors
    target_logits: torch.Tensor  # [bs, N, V]
    walk: WalkResult
    emitted: torch.Tensor  # [bs, L+1] accepted drafts then bonus, NOT_ACCEPTED padded
    rows: torch.Tensor  # [bs, L+1] global verify rows to keep (KV slots, hidden states)


def ddtree_round(
    draft_logits: torch.Tensor,
    roots: torch.Tensor,
    budget: int,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    target: Callable[[VerifyTensors], torch.Tensor],
    choose: Callable[[torch.Tensor], torch.Tensor],
) -> RoundOutput:
    """Run one round for a batch; ``target`` maps verify tensors to logits [bs, N, V] and
    ``choose`` maps those logits to the target's token per node [bs, N]."""
    # §2: the B best prefixes of the drafter's per-position marginals, best first
    tree = build_trees(draft_logits, budget, roots, check_finite=False)
    # §3: root + nodes, positions prefix + depth, each row sees only its ancestors
    verify = verify_tensors(tree, prefix_lens, prefix_lens_sum)
    # one target forward over every node
    target_logits = target(verify)
    # §4: the target's own choice at every node: argmax at T = 0, its sampling rule at T > 0
    target_tokens = choose(target_logits)
    # §4: walk from the root while the target's token is a child; the bonus ends the path
    result = walk(tree, target_tokens)
    # §5: emit accepted drafts + bonus; keep KV and hidden states of the accepted rows only
    return RoundOutput(
        tree=tree,
        verify=verify,
        target_logits=target_logits,
        walk=result,
        emitted=emitted_tokens(tree, result),
        rows=accepted_rows(result, tree.n),
    )
