"""Tests for `repro.argtypes`: flag value types that say what they expect."""

from __future__ import annotations

import argparse

import pytest

from repro.argtypes import PORT, SECONDS, comma_list, integer, number


class TestTypes:
    @pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-1", "x", ""])
    def test_seconds_are_finite_and_positive(self, text: str) -> None:
        """A timeout of nan, inf, zero or a negative number is refused with what is expected."""
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be a finite number > 0 \(got"):
            SECONDS(text)

    def test_ports_and_bounded_integers(self) -> None:
        """Ports lie in 1..65535; integers take their bounds inclusively."""
        assert PORT("65535") == 65535 and integer(0)("0") == 0
        for text in ("0", "65536", "1.5", "http"):
            with pytest.raises(argparse.ArgumentTypeError, match=r"integer in 1\.\.65535"):
                PORT(text)

    def test_comma_lists_check_every_item(self) -> None:
        """A list parses every item; one bad item (or none at all) names the whole value."""
        temperatures = comma_list(number(at_least=0), "finite numbers >= 0")
        assert temperatures("0, 0.7,1") == [0.0, 0.7, 1.0]
        for text in ("0,nan", "inf", "-1", ",", "0,x"):
            with pytest.raises(argparse.ArgumentTypeError,
                               match=r"must be a comma list of finite numbers >= 0 \(got"):
                temperatures(text)
