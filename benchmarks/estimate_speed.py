"""How fast one Job is built, resolved and estimated (the path a slider move takes).

    .venv/bin/python benchmarks/estimate_speed.py

The planner's vectorised search is a separate path; this measures the scalar one.
"""
import time

from toolkit.estimate import estimate
from toolkit.specs import Job, load_catalog


def per_second(fn, seconds: float = 1.0) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def main() -> None:
    catalog = load_catalog()
    data = {"model": {"preset": "llama2-70b"}, "parallel": {"tp": 8, "pp": 4, "zero": 1},
            "precision": {"mode": "mixed-bf16"}, "cluster": {"accelerator": "H100-SXM", "count": 256},
            "tokens": 2e12, "mfu": 0.4, "cost": {"offer": "p5.48xlarge"}}
    job = Job.from_dict(data, catalog)
    build = per_second(lambda: Job.from_dict(data, catalog))
    full = per_second(lambda: estimate(job, catalog))
    print(f"build_job_per_s: {build:,.0f}")
    print(f"estimates_per_s: {full:,.0f}")
    print(f"estimate_ms: {1000 / full:.3f}")


if __name__ == "__main__":
    main()
