"""The step-time band a new software stack can expect, and calibration on one measured row, from held-out errors.

A new user's stack is a new source: its error is its source's bias plus the row's own scatter. Each visible source's
mean log error is one draw of that bias; the band is the 80 % prediction interval of a new source's row, from the
spread between sources (Student's t on k − 1 degrees of freedom, k sources) and the scatter within them.

    low, high, centre = new_source_band(held_out)       # signed errors (modelled / measured - 1)
    coverage, half_width = loso_coverage(held_out)      # each source checked against the band of the others
    errors = one_row_calibrated(held_out)               # scale on one row, predict the source's other rows
"""

from __future__ import annotations

import math
import statistics

__all__ = ["new_source_band", "loso_coverage", "one_row_calibrated", "T90"]

T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383, 10: 1.372,
       12: 1.356, 15: 1.341, 20: 1.325, 30: 1.310}  # fmt: skip
"""Student's t, 90th percentile, by degrees of freedom (any statistics table); 1.2816 beyond 30."""


def _t90(dof: int) -> float:
    keys = [k for k in sorted(T90) if k <= dof]
    return T90[keys[-1]] if keys and dof <= 30 else (1.2816 if dof > 30 else T90[1])


def _by_source(rows: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["source"], []).append(math.log1p(r["error"]))
    return out


def new_source_band(rows: list[dict]) -> tuple[float, float, float]:
    """(low, high, centre) signed errors of a row from a source not among `rows`' sources: 80 % of such rows."""
    groups = _by_source(rows)
    means = [statistics.fmean(v) for v in groups.values()]
    k = len(means)
    within = [x - statistics.fmean(v) for v in groups.values() for x in v]
    sigma_w = statistics.pstdev(within) if len(within) > 1 else 0.0
    sigma_b = statistics.stdev(means) if k > 1 else 0.5
    centre = statistics.fmean(means)
    half = _t90(max(k - 1, 1)) * math.sqrt(sigma_b**2 * (1 + 1 / k) + sigma_w**2)
    return math.expm1(centre - half), math.expm1(centre + half), math.expm1(centre)


def loso_coverage(rows: list[dict]) -> tuple[float, float]:
    """(share of rows inside the band built without their source, median half-width of those bands)."""
    inside, widths = [], []
    for source in sorted({r["source"] for r in rows}):
        others = [r for r in rows if r["source"] != source]
        if len({r["source"] for r in others}) < 2:
            continue
        low, high, _centre = new_source_band(others)
        for r in rows:
            if r["source"] == source:
                inside.append(low <= r["error"] <= high)
                widths.append((high - low) / 2)
    return (sum(inside) / len(inside), statistics.median(widths)) if inside else (float("nan"), float("nan"))


def one_row_calibrated(rows: list[dict]) -> list[float]:
    """Signed errors of each row predicted after scaling the model to one other row of its source (every ordered
    pair within a source): what `toolkit calibrate --step-s` gives a user with one measured step."""
    errors = []
    for values in _by_source(rows).values():
        for i, xi in enumerate(values):
            errors += [math.expm1(xj - xi) for j, xj in enumerate(values) if j != i]
    return errors
