"""Do the planner's ordering claims hold on measured pairs? `python benchmarks/ordering_check.py`

Pairs two measured runs of one source and one model shape (the same-model pairs benchmarks/steptime_accuracy.py
counts), each predicted leaving its source out (the held-out rows of benchmarks/results/steptime_accuracy.json). The
one modelled faster plays the planner's #1; the other gets the chance the planner gives a lower plan of being in
fact the faster (toolkit.plan.search.beats_probability, from the run-calibrated band). Claims should come true as
often as they say: by bands of the claimed chance, the mean claim against how often the second was faster, and
how many sources the band's pairs come from (pairs of one source's sweep are one observation, not many).

The planner ranks layouts, precisions and recomputation, all of which the model prices; its claims are judged on
pairs that differ only in what the model prices. Pairs the model prices alike (a ratio of 1: it makes no claim)
and pairs that differ in recipe flags it does not price (torchtune's chunked cross-entropy, optimizer step in
backward, activation offloading) are counted apart: there the model's miss is a missing term, not the error two
plans of one stack do not share.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

from provenance import provenance  # noqa: E402

from toolkit.estimate.band import band
from toolkit.plan.search import beats_probability

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "steptime_accuracy.json"
OUT = ROOT / "benchmarks" / "results" / "ordering_check.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
BANDS = ((0.0, 0.05), (0.05, 0.2), (0.2, 0.5))
"""Bands of the claimed chance that the second is faster."""


UNPRICED_FLAGS = ("chunked_ce", "optimizer_in_bwd", "activation_offloading")
"""Recipe flags of the reference rows (`framework`) the step-time model does not price."""


def unpriced_flags() -> dict[str, tuple]:
    """Each reference row's settings of the flags the model does not price, by id."""
    from steptime_accuracy import REFERENCE, load_rows

    return {r["id"]: tuple(r.get("framework", {}).get(f) for f in UNPRICED_FLAGS) for r in load_rows(REFERENCE)}


def pairs() -> list[dict]:
    """Same source, same model shape, different measured steps: the modelled-faster one first, with what kind of
    pair it is (`kind`: priced, tie or unpriced)."""
    rows = [r for r in json.loads(RESULTS.read_text())["held_out_rows"] if "error" in r]
    flags = unpriced_flags()
    shared = band("run_calibrated")
    out = []
    for a, b in itertools.combinations(rows, 2):
        if a["group"] != b["group"] or a["model"] != b["model"] or a["measured_s"] == b["measured_s"]:
            continue
        if b["predicted_s"] < a["predicted_s"]:
            a, b = b, a
        ratio = b["predicted_s"] / a["predicted_s"]
        kind = "tie" if ratio < 1 + 1e-9 else "unpriced" if flags.get(a["id"]) != flags.get(b["id"]) else "priced"
        out.append({
            "first": a["id"], "second": b["id"], "source": a["group"], "kind": kind,
            "chance": beats_probability(ratio, shared),
            "second_faster": b["measured_s"] < a["measured_s"],
        })  # fmt: skip
    return out


def table(found: list[dict]) -> list[dict]:
    """Claimed chance against how often the second was faster, by band of the claim: printed, and returned."""
    print(f"{'claimed chance':>16} {'pairs':>6} {'sources':>8} {'mean claim':>11} {'observed':>9}")
    out = []
    for low, high in BANDS:
        chosen = [p for p in found if low <= p["chance"] < high]
        if chosen:
            claim = statistics.mean(p["chance"] for p in chosen)
            seen = statistics.mean(p["second_faster"] for p in chosen)
            sources = len({p["source"] for p in chosen})
            print(f"{low:>7.0%}-{high:<7.0%} {len(chosen):>6} {sources:>8} {claim:>11.1%} {seen:>9.1%}")
            out.append(
                {"band": [low, high], "pairs": len(chosen), "sources": sources, "mean_claim": claim, "observed": seen}
            )
    return out


def main() -> None:
    found = pairs()
    priced = [p for p in found if p["kind"] == "priced"]
    print("pairs that differ only in what the model prices (the planner's claims):")
    priced_bands = table(priced)
    unpriced = [p for p in found if p["kind"] == "unpriced"]
    print(f"\npairs that differ in recipe flags the model does not price ({', '.join(UNPRICED_FLAGS)}):")
    unpriced_bands = table(unpriced)
    ties = [p for p in found if p["kind"] == "tie"]
    OUT.write_text(
        json.dumps({**provenance(), "priced": priced_bands, "unpriced": unpriced_bands, "pairs": found}, indent=1)
        + "\n"
    )
    print(f"\npairs the model prices alike (no claim): {len(ties)}")
    print()
    print(f"layout_pairs: {len(found)}")
    print(f"priced_pairs: {len(priced)}")
    print(f"priced_mean_claimed_second_faster_pct: {100 * statistics.mean(p['chance'] for p in priced):.1f}")
    print(f"priced_observed_second_faster_pct: {100 * statistics.mean(p['second_faster'] for p in priced):.1f}")
    print(f"mean_claimed_second_faster_pct: {100 * statistics.mean(p['chance'] for p in found):.1f}")
    print(f"observed_second_faster_pct: {100 * statistics.mean(p['second_faster'] for p in found):.1f}")


if __name__ == "__main__":
    main()
