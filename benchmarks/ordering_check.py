"""Do the planner's ordering claims hold on measured layout pairs? `python benchmarks/ordering_check.py`

Pairs two measured runs of one source, one model and one cluster that differ in layout or settings
(benchmarks/reference/measured-throughput.json), predicts each leaving its source out (the held-out rows of
benchmarks/results/steptime_accuracy.json), and sets the chance the planner gives the slower-modelled one of being
the faster (toolkit.plan.search.beats_probability, from the run-calibrated band) beside what was measured. The
claims should come true as often as they say: P(claims that held) against the mean claimed chance.
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
REFERENCE = ROOT / "benchmarks" / "reference" / "measured-throughput.json"


def pairs() -> list[dict]:
    """(a, b) of one source, model and cluster: modelled and measured seconds a sequence, b over a."""
    ref = {r["id"]: r for r in json.loads(REFERENCE.read_text())["rows"]}
    rows = [r for r in json.loads(RESULTS.read_text())["held_out_rows"] if r["id"] in ref]

    def key(r):
        x = ref[r["id"]]
        return (
            x["source_group"],
            x["model"]["layers"],
            x["model"]["hidden"],
            x["cluster"]["accelerator"],
            x["cluster"]["count"],
        )

    def per_sequence(r, field):
        return r[field] / ref[r["id"]]["batch"]["global_batch"]

    out = []
    for _key, group in itertools.groupby(sorted(rows, key=key), key=key):
        for a, b in itertools.combinations(list(group), 2):
            if per_sequence(b, "predicted_s") < per_sequence(a, "predicted_s"):
                a, b = b, a  # a: the one modelled faster (the planner's #1)
            out.append({
                "first": a["id"], "second": b["id"],
                "modelled_ratio": per_sequence(b, "predicted_s") / per_sequence(a, "predicted_s"),
                "measured_ratio": per_sequence(b, "measured_s") / per_sequence(a, "measured_s"),
            })  # fmt: skip
    return out


def main() -> None:
    shared = band("run_calibrated")
    found = pairs()
    for p in found:
        p["second_better_chance"] = beats_probability(p["modelled_ratio"], shared)
        p["second_was_better"] = p["measured_ratio"] < 1
        print(f"{p['first']:44s} vs {p['second']:44s} modelled x{p['modelled_ratio']:.3f} measured "
              f"x{p['measured_ratio']:.3f}  P(second better) {p['second_better_chance']:.1%}")  # fmt: skip
    claimed = statistics.mean(p["second_better_chance"] for p in found) if found else float("nan")
    happened = statistics.mean(p["second_was_better"] for p in found) if found else float("nan")
    print()
    print(f"layout_pairs: {len(found)}")
    print(f"mean_claimed_second_better_pct: {100 * claimed:.1f}")
    print(f"observed_second_better_pct: {100 * happened:.1f}")


if __name__ == "__main__":
    main()
