"""The search prices an MoE layout at its fastest dispatcher and overlap: each plan is what `estimate` says of the
job it describes (options included), options the user fixed stay fixed, and overlap is offered only where
Megatron-Core accepts it (its A2A-overlap guide: ep > 1, vpp with pp, no full recompute)."""

import numpy as np
import pytest

from toolkit.estimate import estimate
from toolkit.plan import search
from toolkit.plan.moe_options import overlap_allowed
from toolkit.plan.search import plan_job
from toolkit.specs import Job

MIXTRAL = {
    "model": {"preset": "mixtral-8x7b"},
    "precision": {"mode": "mixed-bf16"},
    "batch": {"global_batch": 256},
    "tokens": 1e11,
}


@pytest.fixture(scope="module")
def plans(catalog):
    job = Job.from_dict(MIXTRAL, catalog)
    return search(job, catalog, gpus=(32, "H100-SXM"), top=8)["plans"]


def test_each_moe_plan_is_what_estimate_says_with_its_options(plans, catalog):
    assert plans and all(p["moe"] is not None for p in plans)
    assert any(p["layout"]["ep"] > 1 for p in plans)
    for plan in plans[:4]:
        job = plan_job(Job.from_dict(MIXTRAL, catalog), plan).resolve(catalog)[0]
        assert job.moe.dispatcher == plan["moe"]["dispatcher"]
        assert job.parallel.etp == plan["layout"]["etp"]
        assert estimate(job, catalog)["time"]["step_s"] == pytest.approx(plan["step_s"], rel=1e-9)


def test_no_other_option_prices_a_plan_faster(plans, catalog):
    plan = next(p for p in plans if p["layout"]["ep"] > 1)
    base = plan_job(Job.from_dict(MIXTRAL, catalog), plan)
    for dispatcher in ("alltoall", "deepep", "allgather"):
        for overlap in (False, True):
            trial = base.replace(
                moe=base.moe.__class__(**{**vars(base.moe), "dispatcher": dispatcher}),
                overlap=base.overlap.__class__(**{**vars(base.overlap), "ep_comm": overlap}),
            )
            allowed = bool(overlap_allowed(trial.resolve(catalog)[0]))
            if overlap and not allowed:
                continue
            assert estimate(trial.resolve(catalog)[0], catalog)["time"]["step_s"] >= plan["step_s"] * (1 - 1e-9)


def test_a_fixed_dispatcher_and_overlap_stay_as_given(catalog):
    job = Job.from_dict({**MIXTRAL, "moe": {"dispatcher": "allgather"}}, catalog)
    plans = search(job, catalog, gpus=(32, "H100-SXM"), top=5, fixed={"dispatcher", "ep_comm"})["plans"]
    assert plans and all(p["moe"] is None for p in plans)
    plans = search(job, catalog, gpus=(32, "H100-SXM"), top=5, fixed={"dispatcher"})["plans"]
    assert {p["moe"]["dispatcher"] for p in plans} == {"allgather"}


def test_overlap_only_where_megatron_accepts_it(catalog):
    job = Job.from_dict(MIXTRAL, catalog).resolve(catalog)[0]
    par = job.parallel.__class__(
        **{
            **vars(job.parallel),
            "ep": np.array([1, 8, 8, 8]),
            "pp": np.array([1, 1, 2, 2]),
            "vpp": np.array([1, 1, 1, 2]),
        }
    )
    assert overlap_allowed(job.replace(parallel=par)).tolist() == [False, True, False, True]
