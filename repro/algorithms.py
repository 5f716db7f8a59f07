"""The decoding algorithms a profile can serve, in one table every module reads.

A name is spelled as profiles, results files and CLIs spell it (``AR``, ``DFLASH``, ``DDTREE``);
:data:`ALGORITHMS` lists them in the order tables and reports show them. Each row says whether the
algorithm drafts (needs a drafter model), whether it takes a tree budget (or a budget schedule),
and the value SGLang's ``--speculative-algorithm`` takes for it (None: plain autoregressive
decoding, no flag).
"""

from __future__ import annotations

from typing import NamedTuple


class Algorithm(NamedTuple):
    """One row of the table."""

    name: str
    drafts: bool
    budgeted: bool
    sglang: str | None


AR, DFLASH, DDTREE = "AR", "DFLASH", "DDTREE"
TABLE: dict[str, Algorithm] = {
    AR: Algorithm(AR, drafts=False, budgeted=False, sglang=None),
    DFLASH: Algorithm(DFLASH, drafts=True, budgeted=False, sglang="DFLASH"),
    DDTREE: Algorithm(DDTREE, drafts=True, budgeted=True, sglang="DDTREE"),
}
ALGORITHMS = tuple(TABLE)
"""The names, in the order tables and reports list them."""


def algorithm(name: str) -> Algorithm:
    """The row of ``name``; ValueError for a name not in the table."""
    if name not in TABLE:
        msg = f"algorithm must be one of {', '.join(ALGORITHMS)} (got {name!r})"
        raise ValueError(msg)
    return TABLE[name]


def drafts(name: str) -> bool:
    """Whether ``name`` drafts (and so needs a drafter model)."""
    return algorithm(name).drafts


def budgeted(name: str) -> bool:
    """Whether ``name`` takes a tree budget or a budget schedule."""
    return algorithm(name).budgeted


def from_sglang(value: str | None) -> str:
    """The name of SGLang's ``speculative_algorithm`` value (None or empty: AR)."""
    for row in TABLE.values():
        if row.sglang == (value or None):
            return row.name
    msg = f"speculative_algorithm {value!r} is none of {', '.join(ALGORITHMS)}"
    raise ValueError(msg)
