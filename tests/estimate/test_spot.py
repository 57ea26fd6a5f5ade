"""Spot interruptions: Young's interval minimises the modelled overhead; costs grow with interruptions."""

import numpy as np
import pytest

from toolkit.estimate import estimate
from toolkit.estimate.spot import MONTH_S, spot_run
from toolkit.specs import Job, SpecError, load_catalog


def test_young_interval_minimises_the_overhead():
    run = spot_run(1e6, 16, 0.10, 40e9, 1e9, 600)
    rate = 16 * -np.log(0.9) / MONTH_S
    assert run.interval_s == pytest.approx(np.sqrt(2 * 40 / rate))
    for factor in (0.5, 0.8, 1.25, 2.0):  # the same overhead formula at other intervals is worse
        tau = run.interval_s * factor
        other = 40 / tau + rate * (tau / 2 + 40 + 600)
        assert other > run.overhead_fraction
    assert run.interruptions == pytest.approx(rate * run.wall_s)


def test_more_instances_and_more_reclaiming_cost_more():
    base = spot_run(1e6, 8, 0.05, 10e9, 1e9, 600)
    assert spot_run(1e6, 64, 0.05, 10e9, 1e9, 600).overhead_fraction > base.overhead_fraction
    assert spot_run(1e6, 8, 0.20, 10e9, 1e9, 600).overhead_fraction > base.overhead_fraction
    assert spot_run(1e6, 8, 0.0, 10e9, 1e9, 600).interruptions == pytest.approx(0.0)


def test_estimate_reports_the_spot_run(catalog):
    data = {
        "model": {"preset": "llama2-7b"},
        "cluster": {"accelerator": "H100-SXM", "count": 16},
        "precision": {"mode": "mixed-bf16"},
        "cost": {"offer": "p5.48xlarge", "spot": True},
    }
    cost = estimate(Job.from_dict(data, catalog), catalog)["cost"]
    assert cost["spot_run"]["amount"] > cost["amount"] and cost["spot_run"]["interruptions"] > 0
    calmer = {**data, "cost": {**data["cost"], "interruptions_per_month": 0.01}}
    assert estimate(Job.from_dict(calmer, catalog), catalog)["cost"]["spot_run"]["amount"] < cost["spot_run"]["amount"]
    with pytest.raises(SpecError, match="cost.interruptions_per_month"):
        estimate(Job.from_dict({**data, "cost": {**data["cost"], "interruptions_per_month": 1.5}}, catalog), catalog)


def test_prices_in_other_currencies_convert_by_the_dated_rate(catalog, tmp_path):
    est = estimate(
        Job.from_dict(
            {"model": {"preset": "llama2-7b"}, "cost": {"offer": "ecs.gn7e-c16g1.32xlarge"}, "mfu": 0.4}, catalog
        ),
        catalog,
    )["cost"]
    assert est["currency"] == "CNY"
    assert est["amount_usd"] == pytest.approx(est["amount"] / catalog.exchange_rates["cny"].per_usd)
    mine = tmp_path / "rates.yaml"
    mine.write_text("exchange_rates:\n  - {name: CNY, per_usd: 7.0, source: my bank, as_of: 2026-11-29}\n")
    assert load_catalog(str(mine)).to_usd(70.0, "CNY") == pytest.approx(10.0)
    with pytest.raises(SpecError, match="has no exchange rate"):
        catalog.to_usd(1.0, "EUR")
