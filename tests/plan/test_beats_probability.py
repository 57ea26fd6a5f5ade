"""The chance a plan below #1 is in fact the better one: even at equal modelled times, smaller the further it
trails, and read from the error two layouts of one stack do not share (the run-calibrated band), so a plan outside
that band's reach gets a small chance."""

from __future__ import annotations

import math

import pytest

from toolkit.estimate.band import band
from toolkit.plan.search import beats_probability


def test_equal_plans_are_a_coin_toss_and_trailing_ones_less_likely():
    shared = band("run_calibrated")
    assert beats_probability(1.0, shared) == pytest.approx(0.5)
    chances = [beats_probability(r, shared) for r in (1.02, 1.05, 1.1, 1.2)]
    assert chances == sorted(chances, reverse=True) and chances[0] < 0.5


def test_a_plan_past_the_unshared_spread_is_rarely_the_better():
    """Past the band's 80 % spread of a row predicted from another of its stack, the order holds 9 times in 10."""
    shared = band("run_calibrated")
    past = (1 + shared["error_high"]) / (1 + shared["error_low"])  # the band's whole width as a ratio
    assert beats_probability(math.sqrt(past), shared) == pytest.approx(0.10, abs=0.005)
