"""Planner panel latency: a control's value set -> Job rebuilt, estimated, both figures and the text updated.

    .venv/bin/python benchmarks/widget_latency.py [--changes 400]

Headless (no browser): the observers run synchronously in the setter, so the wall time of the
assignment is the panel's whole reaction. Changes cycle through controls of every kind (sliders,
dropdowns, toggles) on Llama-2-70B on 64 H100 with an offer and spot, the heaviest path.
"""

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from widgets.planner import PlannerPanel  # noqa: E402

CHANGES = [
    ("micro_batch", [1, 2, 4]),
    ("recompute", ["none", "selective", "full"]),
    ("zero", [1, 2, 3]),
    ("tp", [8, 4]),
    ("precision", ["mixed-bf16", "mixed-fp16"]),
    ("sp", [True, False]),
    ("spot", [True, False]),
    ("seq_len", [4096, 2048]),
    ("offload", ["none", "optimizer"]),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=400)
    args = parser.parse_args()
    panel = PlannerPanel(
        preset="llama2-70b",
        accelerator="H100-SXM",
        count=64,
        precision="mixed-bf16",
        tp=8,
        pp=2,
        zero=1,
        offer="p5.48xlarge",
    )
    cycle = itertools.cycle([(name, value) for name, values in CHANGES for value in values])
    times, refused = [], 0
    for name, value in itertools.islice(cycle, args.changes):
        control = panel.controls[name]
        if control.value == value:
            continue
        start = time.perf_counter()
        control.value = value
        elapsed = time.perf_counter() - start
        if panel.error.value:  # an invalid combination: the message path, not the figures' path
            refused += 1
            continue
        times.append(elapsed)
    times.sort()
    print(f"changes measured: {len(times)} redrawn ({refused} refused with a message, not counted)")
    print(f"median ms: {statistics.median(times) * 1e3:.1f}")
    print(f"p95 ms: {times[int(0.95 * (len(times) - 1))] * 1e3:.1f}")


if __name__ == "__main__":
    main()
