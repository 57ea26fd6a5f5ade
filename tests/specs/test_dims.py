"""ParallelDims, the run-time layout: the dp rule every launcher applies, the facts the program branches on, and
the mesh's shape, checked against torch's own device mesh and against what the program builds."""

import pytest

from toolkit.specs import Job, SpecError
from toolkit.specs.dims import ParallelDims, reset_layout


def _job(**parallel):
    return Job.from_dict(
        {"model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}, "parallel": parallel}
    )


def test_the_dp_rule_for_a_world_and_its_refusals():
    assert ParallelDims.for_world(_job(tp=2, pp=2), 8).dp == 2
    with pytest.raises(SpecError, match="multiple of tp × pp = 4"):
        ParallelDims.for_world(_job(tp=2, pp=2), 6)
    with pytest.raises(SpecError, match="asks for dp × tp × pp = 8 ranks"):
        ParallelDims.for_world(_job(tp=2, dp=4), 4)
    laid = ParallelDims.for_world(_job(tp=2), 4).on_job(_job(tp=2))
    assert (laid.parallel.dp, laid.cluster.count) == (2, 4)


@pytest.mark.parametrize(
    "dims, plain_ddp, by_hand, sharded",
    [
        (ParallelDims(dp=4), True, False, False),
        (ParallelDims(dp=2, tp=2), False, True, True),
        (ParallelDims(dp=4, ep=2), False, True, True),
        (ParallelDims(dp=4, zero=3), False, False, True),
        (ParallelDims(dp=1, zero=2), False, False, True),
    ],
)
def test_the_facts_the_program_branches_on(dims, plain_ddp, by_hand, sharded):
    assert (dims.ddp, dims.hand_reduce, dims.sharded) == (plain_ddp, by_hand, sharded)


def test_the_mesh_shape_and_the_ranks_of_its_groups():
    """torchtitan's order (pp outermost, tp innermost) on a fake 16-rank group: rank 0's tp group is its neighbour,
    its ep group the next tp groups, its experts' data-parallel group the far ones, its dp all of dp's ranks."""
    import torch.distributed as dist

    from toolkit.program.compat import FakeStore
    from toolkit.program.mesh import build_mesh

    dims = ParallelDims(pp=2, dp=4, ep=2, tp=2)
    assert dims.mesh_shape() == (("pp", "edp", "ep", "tp"), (2, 2, 2, 2), {"dp": ("edp", "ep")})
    dist.init_process_group("fake", rank=0, world_size=dims.world_size, store=FakeStore())
    try:
        mesh = build_mesh(dims, "cpu")
        ranks = {
            name: sorted(dist.get_process_group_ranks(mesh[name].get_group()))
            for name in ("tp", "ep", "edp", "dp", "pp")
        }
    finally:
        dist.destroy_process_group()
    assert ranks == {"tp": [0, 1], "ep": [0, 2], "edp": [0, 4], "dp": [0, 2, 4, 6], "pp": [0, 8]}


def test_the_planner_starts_every_axis_from_its_default():
    """A job fixing ep (or any axis) still searches from a plain layout: its base must resolve on any cluster."""
    par = reset_layout(_job(tp=2, ep=1, zero=3, dp_replicate=1).parallel)
    assert (par.tp, par.ep, par.zero, par.dp, par.offload) == (1, 1, 0, None, "none")


def test_a_mixtral_job_with_ep_4_is_searched_on_two_gpus(catalog):
    from toolkit.plan import search

    job = Job.from_dict(
        {
            "model": {"preset": "mixtral-8x7b"},
            "parallel": {"ep": 4},
            "precision": {"mode": "mixed-bf16"},
            "tokens": 1e9,
        },
        catalog,
    )
    result = search(job, catalog, gpus=(2, "H100-SXM"), top=5)
    assert result["evaluated"] > 0 and all(p["layout"]["ep"] <= 2 for p in result["plans"])
