"""Write the README's step-time accuracy table from benchmarks/results/steptime_accuracy.json (never by hand).

    .venv/bin/python benchmarks/readme_tables.py          # rewrite the block between its markers
    .venv/bin/python benchmarks/readme_tables.py --check  # exit 1 when the README differs from the results

tests/test_readme_tables.py runs --check, so the figures the README quotes cannot drift from the results file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "steptime_accuracy.json"
BEGIN, END = "<!-- steptime-accuracy:begin -->", "<!-- steptime-accuracy:end -->"


def table(results: dict) -> str:
    """Each visible source's mean |error| in sample and held out (its own rows left out of the one fitted figure)."""
    lines = [f"Step time against {results['held_out']['rows']} measured runs from "
             f"{len(results['held_out']['by_source'])} sources (`benchmarks/steptime_accuracy.py`, "
             f"{results['date']}, {results['commit']}); held out = the one figure fitted on training runs "
             f"(sustained_fraction {results['fitted']['sustained_fraction']}) refitted without that source:", "",
             "| source | rows | in-sample mean \\|error\\| | held-out mean \\|error\\| | held-out max |",
             "|---|---:|---:|---:|---:|"]
    for source, held in results["held_out"]["by_source"].items():
        inside = results["in_sample"]["by_source"][source]
        lines.append(f"| {source} | {held['rows']} | {100 * inside['mean_abs_error']:.1f} % | "
                     f"{100 * held['mean_abs_error']:.1f} % | {100 * held['max_abs_error']:.1f} % |")
    lines.append(f"| **all** | {results['held_out']['rows']} | {100 * results['in_sample']['mean_abs_error']:.1f} % | "
                 f"{100 * results['held_out']['mean_abs_error']:.1f} % | "
                 f"{100 * results['held_out']['max_abs_error']:.1f} % |")
    return "\n".join(lines)


def rewritten(readme: str, results: dict) -> str:
    head, rest = readme.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(results)}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = (ROOT / "README.md").read_text()
    new = rewritten(readme, json.loads(RESULTS.read_text()))
    if args.check:
        if new != readme:
            sys.exit("README's step-time table differs from benchmarks/results/steptime_accuracy.json: "
                     "run benchmarks/readme_tables.py")
        return
    (ROOT / "README.md").write_text(new)


if __name__ == "__main__":
    main()
