"""DDTree: draft trees from one block-diffusion drafter pass, verified in one target forward.

Behavioural contract: docs/SPEC.md. Imports only torch and the standard library: no engine
code, no files, no environment variables. ``reference`` (the heap oracle) is deliberately not
re-exported: tests and ``repro golden`` import it by name.
"""

from repro.ddtree.accept import Accepted, SlotTable, accept
from repro.ddtree.chain import ChainFields, chain_fields
from repro.ddtree.commit import emitted_tokens
from repro.ddtree.tensors import ancestor_mask, full_mask, positions, tree_inputs, tree_pointers, verify_tensors
from repro.ddtree.topk import merge_topk, topk_logprobs
from repro.ddtree.tree import build_trees, build_trees_from_topk
from repro.ddtree.types import (
    NO_CHILD,
    NO_PARENT,
    NO_SIBLING,
    NO_TOKEN,
    NOT_ACCEPTED,
    DraftTree,
    TopK,
    VerifyTensors,
    WalkResult,
)
from repro.ddtree.walk import greedy_tokens, sample_target_tokens, walk

__all__ = [
    "NOT_ACCEPTED",
    "NO_CHILD",
    "NO_PARENT",
    "NO_SIBLING",
    "NO_TOKEN",
    "Accepted",
    "ChainFields",
    "DraftTree",
    "SlotTable",
    "TopK",
    "VerifyTensors",
    "WalkResult",
    "accept",
    "ancestor_mask",
    "build_trees",
    "build_trees_from_topk",
    "chain_fields",
    "emitted_tokens",
    "full_mask",
    "greedy_tokens",
    "merge_topk",
    "positions",
    "sample_target_tokens",
    "topk_logprobs",
    "tree_inputs",
    "tree_pointers",
    "verify_tensors",
    "walk",
]
