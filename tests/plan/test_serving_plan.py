"""The serving planner: every plan meets the load and the bound it was asked for; what does not fit is never proposed;
a larger load takes more replicas."""

from __future__ import annotations

from toolkit.plan.serving import plan_serving
from toolkit.specs import Job


def _job(catalog, **serving) -> Job:
    base = {"input_tokens": 1024, "output_tokens": 256, **serving}
    return Job.from_dict({"model": {"preset": "llama2-70b"}, "workload": "inference", "serving": base}, catalog)


def test_every_plan_meets_the_load_and_the_bound(catalog):
    result = plan_serving(
        _job(catalog, target_tokens_per_s=5000, max_tpot_s=0.05), catalog, ["p4de.24xlarge", "p5.48xlarge"], top=50
    )
    assert result["plans"]
    for p in result["plans"]:
        assert p["output_tokens_per_s"] >= 5000 and p["tpot_s"] <= 0.05
        # Llama-2-70B's 138 GB of bf16 weights never sit on one 80 GB GPU
        assert not (p["weights"] == "bf16" and p["tp"] == 1)
        assert p["devices"] == p["replicas"] * p["tp"] and p["devices"] <= 8 * p["instances"]
    costs = [p["usd_per_hour"] for p in result["plans"]]
    assert costs == sorted(costs)


def test_a_larger_load_rents_more(catalog):
    small = plan_serving(_job(catalog, target_tokens_per_s=2000), catalog, ["p4de.24xlarge"])["plans"][0]
    large = plan_serving(_job(catalog, target_tokens_per_s=40000), catalog, ["p4de.24xlarge"])["plans"][0]
    assert large["instances"] > small["instances"]
    assert large["output_tokens_per_s"] >= 40000 > small["output_tokens_per_s"] >= 2000


def test_an_impossible_bound_says_so(catalog, cli):
    result = plan_serving(_job(catalog, max_tpot_s=1e-4), catalog, ["p4de.24xlarge"])
    assert result["plans"] == [] and "max-tpot" in result["why_none"][0]
    code, _out, err = cli("plan", "--workload", "inference", "--model", "llama2-7b")
    assert code == 2 and "--offers" in err and err.count("\n") == 1


def test_with_a_target_each_plan_is_simulated_under_its_load_and_a_split_is_offered(catalog):
    """Each deployment runs its share of the target as Poisson arrivals (the steady formula has no queue); a tight
    bound on time to first token is met by splitting the same instances into prefill and decode workers."""
    job = _job(catalog, target_requests_per_s=20, max_tpot_s=0.05, max_ttft_s=0.3, input_tokens=1000, output_tokens=300)
    result = plan_serving(job, catalog, ["p5.48xlarge"], top=50)
    assert result["plans"]
    for p in result["plans"]:
        sim = p["simulated"]
        assert not sim["saturated"] and sim["tpot_s"] <= 0.05 and sim["ttft_s"] <= 0.3
        assert sim["ttft_s_p99"] >= sim["ttft_s"]
    splits = [p["disaggregated"] for p in result["plans"] if p["disaggregated"]]
    assert splits and all(s["prefill_workers"] + s["decode_workers"] >= 2 for s in splits)
