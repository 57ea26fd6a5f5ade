"""Spot instances: what interruptions cost, and how often to checkpoint (Young/Daly).

A job on n instances stops whenever any instance is reclaimed. With a per-instance share p of
capacity reclaimed per month (AWS Spot Advisor's "frequency of interruption"), the job's rate is
λ = n·(−ln(1−p))/month. Writing a checkpoint takes δ = checkpoint bytes per device / write
bandwidth (ranks write their shards in parallel). Young's optimal interval τ = √(2δ/λ)
(Daly's refinement changes it by under 1 % while δ ≪ 1/λ). The expected wall time is

    T = T₀ · (1 + δ/τ + λ·(τ/2 + δ + restart))

checkpoints every τ, and per interruption half an interval of lost work, a restore (≈ δ) and the
restart (new capacity, launch, load). All inputs may be numpy arrays (the planner's grid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SpotRun", "spot_run", "MONTH_S"]

MONTH_S = 730.0 * 3600  # a mean month


@dataclass(frozen=True)
class SpotRun:
    interval_s: float
    """Young's optimal time between checkpoints."""
    checkpoint_write_s: float
    interruptions: float
    """Expected interruptions over the run."""
    overhead_fraction: float
    """Extra wall time over an uninterrupted, checkpoint-free run."""
    wall_s: float


def spot_run(
    train_s,
    instances,
    interruptions_per_month: float,
    checkpoint_bytes_per_device,
    write_bytes_per_s: float,
    restart_s: float,
) -> SpotRun:
    rate = np.asarray(instances, dtype=float) * -np.log1p(-interruptions_per_month) / MONTH_S
    write_s = np.asarray(checkpoint_bytes_per_device, dtype=float) / write_bytes_per_s
    interval = np.sqrt(2 * write_s / np.maximum(rate, 1e-30))
    overhead = write_s / interval + rate * (interval / 2 + write_s + restart_s)
    wall = np.asarray(train_s, dtype=float) * (1 + overhead)
    return SpotRun(
        interval_s=interval,
        checkpoint_write_s=write_s,
        interruptions=rate * wall,
        overhead_fraction=overhead,
        wall_s=wall,
    )
