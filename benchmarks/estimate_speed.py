"""How fast one Job is built, resolved and estimated (the path a slider move takes).

    .venv/bin/python benchmarks/estimate_speed.py

Also the same memory model over a numpy grid of layouts, and the planner's whole search
(memory, step time, fit, cost and ranking) in layouts per second on one core.
"""

import time

from toolkit.estimate import estimate
from toolkit.estimate.grid import layout_grid
from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job, load_catalog


def per_second(fn, seconds: float = 1.0) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def main() -> None:
    catalog = load_catalog()
    data = {
        "model": {"preset": "llama2-70b"},
        "parallel": {"tp": 8, "pp": 4, "zero": 1},
        "precision": {"mode": "mixed-bf16"},
        "cluster": {"accelerator": "H100-SXM", "count": 256},
        "tokens": 2e12,
        "mfu": 0.4,
        "cost": {"offer": "p5.48xlarge"},
    }
    job = Job.from_dict(data, catalog)
    build = per_second(lambda: Job.from_dict(data, catalog))
    full = per_second(lambda: estimate(job, catalog))
    resolved, _ = job.resolve(catalog)
    grid = layout_grid(
        resolved,
        tp=[1, 2, 4, 8],
        pp=[1, 2, 4, 8],
        zero=[0, 1, 2, 3],
        vpp=[1, 2],
        micro_batch=[1, 2, 4, 8, 16],
        recompute=["none", "selective", "full"],
        sp=[False, True],
        offload=["none", "params"],
    )
    grids = per_second(lambda: memory_estimate(grid.job))
    single = per_second(lambda: memory_estimate(resolved))
    # torch's schedules with more than two stages: the first, second and last stage are compared
    torch_pp, _ = Job.from_dict(dict(data, precision={"mode": "amp-bf16"}), catalog).resolve(catalog)
    single_torch_pp = per_second(lambda: memory_estimate(torch_pp))
    print(f"layouts in the grid: {len(grid)}")
    print(f"build_job_per_s: {build:,.0f}")
    print(f"estimates_per_s: {full:,.0f}")
    # the planner's full path: memory + step time over the grid, fit, cost, ranking (two offers, 8 cluster sizes)
    from toolkit.plan import search

    plan_job = Job.from_dict({"model": {"preset": "llama2-70b"}, "precision": {"mode": "mixed-bf16"}}, catalog)
    start = time.perf_counter()
    runs, evaluated = 0, 0
    while time.perf_counter() - start < 2.0:
        evaluated += search(plan_job, catalog, offers=["p5.48xlarge", "p4de.24xlarge"], max_gpus=1024)["evaluated"]
        runs += 1
    plan_rate = evaluated / (time.perf_counter() - start)
    print(f"plan search: {evaluated // runs:,} layouts per search, {(time.perf_counter() - start) / runs:.2f} s each")
    # a Mixture of Experts: expert parallelism is one more axis of the grid
    moe_job = Job.from_dict({"model": {"preset": "mixtral-8x7b", "seq_len": 4096}, "tokens": 1e12}, catalog)
    start, runs, moe_evaluated = time.perf_counter(), 0, 0
    while time.perf_counter() - start < 2.0:
        moe_evaluated += search(moe_job, catalog, offers=["p5.48xlarge", "p4de.24xlarge"], max_gpus=1024)["evaluated"]
        runs += 1
    moe_rate = moe_evaluated / (time.perf_counter() - start)
    print(f"MoE plan search: {moe_evaluated // runs:,} layouts per search (ep among the axes)")
    print(f"estimate_ms: {1000 / full:.3f}")
    print(f"memory_model_single_ms: {1000 / single:.3f}")
    print(f"memory_model_single_torch_pp4_ms: {1000 / single_torch_pp:.3f}")
    print(f"grid_layouts_per_s: {grids * len(grid):,.0f}")
    print(f"plan_layouts_per_s: {plan_rate:,.0f}")
    print(f"moe_plan_layouts_per_s: {moe_rate:,.0f}")


if __name__ == "__main__":
    main()
