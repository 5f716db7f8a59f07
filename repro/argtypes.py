"""argparse value types that say what they expect: ``argument --port: must be an integer in
1..65535 (got '0')``. Floats are finite (``nan`` and ``inf`` are refused), so a typo cannot become
a timeout that never fires or a temperature no sampler defines."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _fail(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"must be {expected} (got {text!r})")


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An int parser bounded by ``minimum``/``maximum`` (inclusive)."""
    expected = _int_words(minimum, maximum)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _fail(expected, text) from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise _fail(expected, text)
        return value

    parse.__name__ = "integer"
    return parse


def _int_words(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in {minimum}..{maximum}"
    return f"an integer >= {minimum}" if minimum is not None else "an integer"


def number(*, above: float | None = None, at_least: float | None = None) -> Callable[[str], float]:
    """A finite float parser, ``> above`` or ``>= at_least`` when given."""
    expected = "a finite number" + (f" > {above:g}" if above is not None else "") + (
        f" >= {at_least:g}" if at_least is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _fail(expected, text) from None
        if not math.isfinite(value) or (above is not None and value <= above) or (
                at_least is not None and value < at_least):
            raise _fail(expected, text)
        return value

    parse.__name__ = "number"
    return parse


def comma_list(item: Callable[[str], float], what: str) -> Callable[[str], list]:
    """A parser of ``a,b,c`` whose items ``item`` parses; ``what`` describes one item."""
    expected = f"a comma list of {what}"

    def parse(text: str) -> list:
        parts = [v.strip() for v in text.split(",") if v.strip()]
        if not parts:
            raise _fail(expected, text)
        try:
            return [item(v) for v in parts]
        except argparse.ArgumentTypeError:
            raise _fail(expected, text) from None

    parse.__name__ = "comma_list"
    return parse


PORT = integer(1, 65535)
POSITIVE_INT = integer(1)
NONNEGATIVE_INT = integer(0)
SECONDS = number(above=0)
