"""A gate on every change of a prediction: a fixed grid of jobs (dense, MoE and serving; every accelerator family
of the catalog; every layout axis) whose estimates are kept in benchmarks/results/predictions.json.

    .venv/bin/python benchmarks/predictions.py           # regenerate, printing what moved (largest first)
    .venv/bin/python benchmarks/predictions.py --check   # exit 1 and list the moves when the file is stale

`make test` runs the check (tests/test_predictions.py): a change that moves a prediction regenerates the file and
says why in CHANGELOG.md. Headline figures last, one per line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.estimate import estimate  # noqa: E402
from toolkit.specs import Job, SpecError, load_catalog  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "predictions.json"
FIGURES = ("time.step_s", "memory.device_peak_bytes", "serving.ttft_s", "serving.tpot_s", "serving.max_concurrency")
"""The figures kept per job (those a job has)."""

DENSE = ("llama3-8b", "llama2-70b", "gpt3-175b")
MOE = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
LAYOUTS = (
    {},
    {"zero": 3},
    {"tp": 8, "sp": True},
    {"tp": 4, "pp": 4, "vpp": 2},
    {"tp": 2, "cp": 2, "zero": 1},
    {"zero": 3, "dp_replicate": 2},
    {"zero": 3, "offload": "optimizer"},
)
MOE_LAYOUTS = ({"ep": 8}, {"tp": 2, "ep": 8}, {"tp": 2, "pp": 4, "ep": 8, "etp": 2})
RECIPES = ({}, {"memory": {"recompute": "full"}, "batch": {"micro_batch": 2}})


def accelerators(catalog) -> list[str]:
    """One accelerator of each family the catalog holds (vendor and generation), in catalog order."""
    seen, out = set(), []
    for acc in catalog.accelerators.values():
        family = (acc.vendor, acc.name.split("-")[0][:2])
        if family not in seen:
            seen.add(family)
            out.append(acc.name)
    return out


def jobs(catalog) -> list[tuple[str, dict]]:
    """(id, job dict) of the grid: training on 64 devices, precision mixed-bf16 for Megatron's program and
    amp-bf16 for torch's, and serving on 8."""
    out = []
    for acc in accelerators(catalog):
        cluster = {"accelerator": acc, "count": 64}
        for model in DENSE + MOE:
            layouts = LAYOUTS if model in DENSE else MOE_LAYOUTS
            for i, layout in enumerate(layouts):
                for mode in ("amp-bf16", "mixed-bf16"):
                    for r, recipe in enumerate(RECIPES):
                        data = {
                            "model": {"preset": model, **({"seq_len": 4096} if model in MOE else {})},
                            "cluster": cluster,
                            "batch": {"global_batch": 512, **recipe.get("batch", {})},
                            "precision": {"mode": mode},
                            "parallel": layout,
                            "memory": recipe.get("memory", {}),
                            "tokens": 1e11,
                        }
                        out.append((f"{acc}/{model}/layout{i}/{mode}/recipe{r}", data))
        for model in ("llama3-8b", "llama2-70b", "mixtral-8x7b"):
            for concurrency in (1, 32):
                data = {
                    "workload": "inference",
                    "model": {"preset": model},
                    "cluster": {"accelerator": acc, "count": 8},
                    "parallel": {"tp": 8},
                    "serving": {"concurrency": concurrency, "input_tokens": 1024, "output_tokens": 256},
                }
                out.append((f"{acc}/{model}/serve/c{concurrency}", data))
    return out


def _figure(result: dict, dotted: str):
    value = result
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def predict(catalog) -> dict:
    """{job id: {figure: value} or {"refused": reason}} over the grid."""
    rows = {}
    for name, data in jobs(catalog):
        try:
            result = estimate(Job.from_dict(data, catalog), catalog)
        except SpecError as refused:
            rows[name] = {"refused": str(refused)}
            continue
        rows[name] = {f: v for f in FIGURES if (v := _figure(result, f)) is not None}
    return rows


def moves(old: dict, new: dict) -> list[tuple[float, str]]:
    """(relative change, line) of every prediction that moved, appeared or went, largest first."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None or b is None or "refused" in a or "refused" in b:
            out.append((float("inf"), f"{name}: {a} -> {b}"))
            continue
        for figure in sorted(set(a) | set(b)):
            x, y = a.get(figure), b.get(figure)
            if x != y:
                signed = y / x - 1 if x and y is not None else float("inf")
                out.append((abs(signed), f"{name} {figure}: {x} -> {y} ({signed:+.2%})"))
    return sorted(out, key=lambda m: -m[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the stored predictions are stale")
    args = parser.parse_args(argv)
    rows = predict(load_catalog())
    stored = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else {}
    moved = moves(stored, rows)
    for _change, line in moved[:40]:
        print(line)
    if args.check:
        if moved:
            print(f"{len(moved)} prediction(s) moved: run benchmarks/predictions.py and say why in CHANGELOG.md")
        print(f"predictions: {len(rows)}")
        print(f"predictions_moved: {len(moved)}")
        return 1 if moved else 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    RESULTS.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "commit": commit.stdout.strip() or None,
                "machine": f"{platform.machine()}, {platform.system()}, Python {platform.python_version()}",
                "figures": list(FIGURES),
                "rows": rows,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"predictions: {len(rows)}")
    print(f"predictions_refused: {sum('refused' in r for r in rows.values())}")
    print(f"predictions_moved: {len(moved)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
