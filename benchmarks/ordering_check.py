"""Do the planner's ordering claims hold on measured pairs? `python benchmarks/ordering_check.py`

Pairs two measured runs of one source and one model shape (the same-model pairs benchmarks/steptime_accuracy.py
counts), each predicted leaving its source out (the held-out rows of benchmarks/results/steptime_accuracy.json). The
one modelled faster plays the planner's #1; the other gets the chance the planner gives a lower plan of being in
fact the faster (toolkit.plan.search.beats_probability, from the run-calibrated band). Claims should come true as
often as they say: by bands of the claimed chance, the mean claim against how often the second was faster, and
how many sources the band's pairs come from (pairs of one source's sweep are one observation, not many).
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

from toolkit.estimate.band import band
from toolkit.plan.search import beats_probability

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "steptime_accuracy.json"
BANDS = ((0.0, 0.05), (0.05, 0.2), (0.2, 0.5))
"""Bands of the claimed chance that the second is faster."""


def pairs() -> list[dict]:
    """Same source, same model shape, different measured steps: the modelled-faster one first."""
    rows = [r for r in json.loads(RESULTS.read_text())["held_out_rows"] if "error" in r]
    shared = band("run_calibrated")
    out = []
    for a, b in itertools.combinations(rows, 2):
        if a["group"] != b["group"] or a["model"] != b["model"] or a["measured_s"] == b["measured_s"]:
            continue
        if b["predicted_s"] < a["predicted_s"]:
            a, b = b, a
        out.append({
            "first": a["id"], "second": b["id"], "source": a["group"],
            "chance": beats_probability(b["predicted_s"] / a["predicted_s"], shared),
            "second_faster": b["measured_s"] < a["measured_s"],
        })  # fmt: skip
    return out


def main() -> None:
    found = pairs()
    print(f"{'claimed chance':>16} {'pairs':>6} {'sources':>8} {'mean claim':>11} {'observed':>9}")
    for low, high in BANDS:
        chosen = [p for p in found if low <= p["chance"] < high]
        if chosen:
            claim = statistics.mean(p["chance"] for p in chosen)
            seen = statistics.mean(p["second_faster"] for p in chosen)
            sources = len({p["source"] for p in chosen})
            print(f"{low:>7.0%}-{high:<7.0%} {len(chosen):>6} {sources:>8} {claim:>11.1%} {seen:>9.1%}")
    print()
    print(f"layout_pairs: {len(found)}")
    print(f"mean_claimed_second_faster_pct: {100 * statistics.mean(p['chance'] for p in found):.1f}")
    print(f"observed_second_faster_pct: {100 * statistics.mean(p['second_faster'] for p in found):.1f}")


if __name__ == "__main__":
    main()
