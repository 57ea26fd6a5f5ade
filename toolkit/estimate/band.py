"""The step-time model's honest error band: the range a measured step fell in, on runs the model never saw.

    low, high = step_range(step_s, regime_of(hw))

benchmarks/steptime_accuracy.py --write-band scores every visible source with the fitted figure refitted without
it (leave-one-source-out) and writes each regime's band to toolkit/data/steptime_band.yaml: for a catalog GPU, the
80 % prediction interval of a row from a stack the model has not seen (the spread between the visible sources'
biases and within them: a new user's stack is a new source; the benchmark prints how many visible rows fall in
the band built without their source); for a run-calibrated accelerator, the spread of steps predicted from another step of the
same stack. A modelled step s with errors between e_lo and e_hi was measured between s / (1 + e_hi) and
s / (1 + e_lo).
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

__all__ = ["BAND_FILE", "SERVING_BAND_FILE", "regime_of", "step_range", "band", "serving_range"]

BAND_FILE = Path(__file__).resolve().parents[1] / "data" / "steptime_band.yaml"
SERVING_BAND_FILE = Path(__file__).resolve().parents[1] / "data" / "serving_band.yaml"
"""Serving's band: per figure, the 10th and 90th percentiles of the signed errors on the visible published serving
measurements (benchmarks/serving_accuracy.py --write-band; nothing fitted on them)."""


@functools.cache
def _bands() -> dict:
    return yaml.safe_load(BAND_FILE.read_text())


def band(regime: str) -> dict:
    """{error_low, error_high, rows, what}: the regime's held-out signed errors (10th, 90th percentile)."""
    return _bands()["regimes"][regime]


def regime_of(hw) -> str:
    """run_calibrated: scaled to a user's measured step (toolkit calibrate --step-s); kernel_profile: a catalog GPU
    priced from kernel measurements; calibrated: a device measured by toolkit calibrate; assumed: a catalog device
    with neither (the model's stated assumptions)."""
    if getattr(hw, "step_scale", 1.0) != 1.0 or getattr(hw, "communication_scale", None) is not None:
        return "run_calibrated"
    if hw.kernels is not None:
        return "kernel_profile"
    return "calibrated" if hw.assumptions is not None else "assumed"


def step_range(step_s, regime: str) -> tuple[float, float]:
    """(low, high) seconds a step modelled at step_s was measured at, on the regime's held-out runs."""
    b = band(regime)
    return step_s / (1 + b["error_high"]), step_s / (1 + b["error_low"])


@functools.cache
def _serving_bands() -> dict:
    return yaml.safe_load(SERVING_BAND_FILE.read_text()) if SERVING_BAND_FILE.exists() else {"figures": {}}


def serving_range(value, figure: str) -> list | None:
    """[low, high] a serving figure modelled at `value` (ttft_s, tpot_s, output_tokens_per_s) was measured between
    on the visible published runs; None without a value or a band."""
    b = _serving_bands()["figures"].get(figure)
    if value is None or b is None:
        return None
    return [value / (1 + b["error_high"]), value / (1 + b["error_low"])]
