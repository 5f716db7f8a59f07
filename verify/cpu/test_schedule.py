"""Tests for `repro.schedule`: parsing, routing by padded batch size, and what a server sizes from it."""

from __future__ import annotations

import pytest

from repro.schedule import BudgetSchedule, pad

GRAPHS = (1, 2, 4, 8, 16)


class TestParse:
    def test_text_json_and_mapping_agree(self):
        """The compact text, the JSON object and a TOML-style table give one schedule."""
        text = BudgetSchedule.parse("1:63, 4:31,16:15")
        assert text == BudgetSchedule.parse('{"16": 15, "1": 63, "4": 31}')
        assert text == BudgetSchedule.from_mapping({"1": 63, "4": 31, "16": 15})
        assert text.text == "1:63,4:31,16:15"
        assert BudgetSchedule.parse(text.as_json()) == text
        assert text.toml() == "budget-schedule = { 1 = 63, 4 = 31, 16 = 15 }"

    @pytest.mark.parametrize(("text", "match"), [
        ("4:31,16:15", "from 1"),
        ("1:63,1:31", "BS:B pairs"),
        ('{"1": 63, "01": 4}', "twice"),
        ("1:-3", "integer"),
        ("1:x", "integer"),
        ("63", "BS:B pairs"),
        ("{1: 63}", "JSON"),
        ("[1, 63]", "BS:B pairs"),
        ('{"1": true}', "integer"),
        ("", "BS:B pairs"),
    ])
    def test_bad_schedules_are_one_line_errors(self, text, match):
        """Each malformed schedule is a ValueError naming what is wrong."""
        with pytest.raises(ValueError, match=match) as err:
            BudgetSchedule.parse(text)
        assert "\n" not in str(err.value)

    def test_fixed_is_one_budget(self):
        """A fixed budget is the schedule 1:B."""
        fixed = BudgetSchedule.fixed(32)
        assert fixed.text == "1:32" and fixed.is_fixed and fixed.distinct == (32,)
        assert not BudgetSchedule.parse("1:63,16:15").is_fixed


class TestRoute:
    def test_largest_key_at_or_below(self):
        """Budget of a batch size: the largest key at or below it."""
        s = BudgetSchedule.parse("1:63,4:31,16:15")
        assert [s.budget(b) for b in (1, 2, 3, 4, 15, 16, 40)] == [63, 63, 63, 31, 31, 15, 15]
        with pytest.raises(ValueError, match=">= 1"):
            s.budget(0)

    def test_batches_pad_to_their_graph_bucket(self):
        """A round takes the budget of the bucket it replays; past the buckets (eager), its own."""
        s = BudgetSchedule.parse("1:63,3:47,4:31,16:15")
        assert pad(3, GRAPHS) == 4 and pad(17, GRAPHS) == 17 and pad(3, ()) == 3
        assert s.route(3, GRAPHS) == 31  # bs 3 replays the bs 4 graph: B(4)
        assert s.route(3, ()) == 47  # no graphs: B(3)
        assert s.route(20, GRAPHS) == 15

    def test_each_budget_captures_only_its_buckets(self):
        """Every captured batch size belongs to exactly one budget's verify graphs."""
        s = BudgetSchedule.parse("1:63,4:31,16:15")
        lists = {b: s.captured_for(b, GRAPHS) for b in s.distinct}
        assert lists == {15: [16], 31: [4, 8], 63: [1, 2]}
        assert sorted(b for v in lists.values() for b in v) == list(GRAPHS)
        for budget, sizes in lists.items():
            assert all(s.route(x, GRAPHS) == budget for size in sizes for x in range(1, size + 1)
                       if pad(x, GRAPHS) == size)

    def test_sizes_follow_the_widest_verify(self):
        """The logits buffer holds the widest captured verify; budgets no bucket runs are not used."""
        s = BudgetSchedule.parse("1:63,4:31,16:15,32:7")
        assert s.max_verify_tokens(GRAPHS) == max(2 * 64, 8 * 32, 16 * 16)
        assert s.used(GRAPHS) == (15, 31, 63)
        assert s.used(()) == (7, 15, 31, 63)
        assert s.max_budget == 63
