"""The planner's search: it agrees with `estimate` plan by plan, keeps only what fits, ranks and fronts right."""

import numpy as np
import pytest

from toolkit.estimate import estimate
from toolkit.plan import pareto_front, search
from toolkit.specs import Job, SpecError


@pytest.fixture(scope="module")
def result(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-13b"}, "precision": {"mode": "mixed-bf16"}}, catalog)
    return search(job, catalog, offers=["p5.48xlarge", "p4de.24xlarge"], objective="cost", max_gpus=64, top=20)


def _job_of(plan, catalog):
    layout = plan["layout"]
    return Job.from_dict(
        {
            "model": {"preset": "llama2-13b"},
            "precision": {"mode": "mixed-bf16"},
            "cluster": {"accelerator": plan["accelerator"], "count": plan["devices"]},
            "cost": {"offer": plan["offer"]},
            "parallel": {k: layout[k] for k in ("dp", "tp", "pp", "vpp", "sp", "zero", "offload")},
            "batch": {"micro_batch": layout["micro_batch"], "global_batch": plan["global_batch"]},
            "memory": {"recompute": layout["recompute"]},
        },
        catalog,
    )


def test_each_plan_is_what_estimate_says_of_that_job(result, catalog):
    assert result["plans"]
    for plan in result["plans"][:5] + result["pareto"]:
        est = estimate(_job_of(plan, catalog), catalog)
        assert est["memory"]["fits"] is True
        assert plan["peak_bytes"] == pytest.approx(est["memory"]["peak_bytes"], rel=1e-9)
        assert plan["step_s"] == pytest.approx(est["time"]["step_s"], rel=1e-9)
        assert plan["cost"] == pytest.approx(est["cost"]["amount"], rel=1e-9)


def test_ranked_by_cost_and_the_front_is_undominated(result):
    costs = [p["cost"] for p in result["plans"]]
    assert costs == sorted(costs)
    front = result["pareto"]
    cheapest = result["plans"][0]  # nothing is cheaper, so nothing dominates it: on the front
    assert min(p["cost"] for p in front) == pytest.approx(cheapest["cost"])
    days, prices = [p["train_days"] for p in front], [p["cost"] for p in front]
    assert days == sorted(days) and prices == sorted(prices, reverse=True)  # faster plans cost more
    for a in front:
        assert not any(b["train_days"] < a["train_days"] and b["cost"] < a["cost"] for b in result["plans"])
    assert result["evaluated"] > result["fitting"] > 0


def test_pareto_front_on_known_points():
    times = np.array([1.0, 2.0, 3.0, 2.5, 1.5])
    costs = np.array([9.0, 5.0, 4.0, 6.0, 9.5])
    assert list(pareto_front(times, costs)) == [0, 1, 2]


def test_fixed_choices_are_not_varied(catalog):
    job = Job.from_dict(
        {"model": {"preset": "llama2-7b"}, "parallel": {"tp": 2, "zero": 1}, "precision": {"mode": "mixed-bf16"}},
        catalog,
    )
    result = search(job, catalog, gpus=(16, "H100-SXM"), fixed={"tp", "zero"}, top=50)
    assert {(p["layout"]["tp"], p["layout"]["zero"]) for p in result["plans"]} == {(2, 1)}


def test_deadline_and_nothing_fits(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-70b"}, "precision": {"mode": "mixed-bf16"}}, catalog)
    none = search(job, catalog, gpus=(8, "RTX-4090"), fixed={"offload"})  # offload none: 70B needs > 8 x 24 GB
    assert none["plans"] == [] and none["evaluated"] > 0
    quick = search(job, catalog, offers=["p5.48xlarge"], max_gpus=256, deadline_days=100)
    assert quick["plans"] and all(p["train_days"] <= 100 for p in quick["plans"])


def test_bad_requests_are_named(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-7b"}}, catalog)
    with pytest.raises(SpecError, match="give the hardware"):
        search(job, catalog)
    with pytest.raises(SpecError, match="needs prices"):
        search(job, catalog, gpus=(8, "H100-SXM"), objective="cost")
    with pytest.raises(SpecError, match="is below one p5.48xlarge instance"):
        search(job, catalog, offers=["p5.48xlarge"], max_gpus=4)
