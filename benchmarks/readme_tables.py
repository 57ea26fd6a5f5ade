"""Write the docs' accuracy figures from benchmarks/results/*.json (never by hand): the README's step-time table
and its limitations' worst figures, and docs/accuracy.md whole (step time, memory, MoE, serving, training on ranks
against one process), each result marked with the toolkit commits made since it was measured (stale past 20).

    .venv/bin/python benchmarks/readme_tables.py          # rewrite the README's block and docs/accuracy.md
    .venv/bin/python benchmarks/readme_tables.py --check  # exit 1 when either differs from the results

tests/test_readme_tables.py runs --check, so the figures the docs quote cannot drift from the results files.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "steptime_accuracy.json"
ACCURACY = ROOT / "docs" / "accuracy.md"
BEGIN, END = "<!-- steptime-accuracy:begin -->", "<!-- steptime-accuracy:end -->"
LIMITS_BEGIN, LIMITS_END = "<!-- worst-figures:begin -->", "<!-- worst-figures:end -->"
STALE_COMMITS = 20
"""Commits to toolkit/ after a result's own commit past which docs/accuracy.md calls it stale (rerun its benchmark)."""
AGE = re.compile(r" · \d+ toolkit commits? since( — stale, rerun the benchmark)?")
"""The age mark _measured writes: it moves with every commit, so --check compares the docs without it."""


def table(results: dict) -> str:
    """Each visible source's mean |error| in sample and held out (its own rows left out of the one fitted figure)."""
    lines = [
        f"Step time against {results['held_out']['rows']} measured runs from "
        f"{len(results['held_out']['by_source'])} sources (`benchmarks/steptime_accuracy.py`, "
        f"{results['date']}, {results['commit']}); held out = the one figure fitted on training runs "
        f"(sustained_fraction {results['fitted']['sustained_fraction']}) refitted without that source:",
        "",
        "| source | rows | in-sample mean \\|error\\| | held-out mean \\|error\\| | held-out max |",
        "|---|---:|---:|---:|---:|",
    ]
    for source, held in results["held_out"]["by_source"].items():
        inside = results["in_sample"]["by_source"][source]
        lines.append(
            f"| {source} | {held['rows']} | {100 * inside['mean_abs_error']:.1f} % | "
            f"{100 * held['mean_abs_error']:.1f} % | {100 * held['max_abs_error']:.1f} % |"
        )
    lines.append(
        f"| **all** | {results['held_out']['rows']} | {100 * results['in_sample']['mean_abs_error']:.1f} % | "
        f"{100 * results['held_out']['mean_abs_error']:.1f} % | "
        f"{100 * results['held_out']['max_abs_error']:.1f} % |"
    )
    return "\n".join(lines)


def rewritten(readme: str, results: dict) -> str:
    head, rest = readme.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(results)}\n{END}{tail}"


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _measured(results: dict) -> str:
    if "date" not in results:
        return "(measured before results carried a date and commit: rerun the benchmark to date it)"
    return f"({results['date']}, commit {results['commit'][:7]}, {results['machine']}{_age(results['commit'])})"


def _age(commit: str) -> str:
    """How many commits to toolkit/ the result is behind (the code it measured has moved since), stale past
    STALE_COMMITS."""
    run = subprocess.run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", "toolkit/"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode != 0:
        return ""
    n = int(run.stdout.strip() or 0)
    stale = " — stale, rerun the benchmark" if n > STALE_COMMITS else ""
    return f" · {n} toolkit commit{'s' if n != 1 else ''} since{stale}"


def moe_section(results: dict) -> list[str]:
    s = results["summary"]
    lines = [
        "## Mixture-of-Experts step time against published runs",
        "",
        f"Megatron-Core's published MoE runs and DeepSeek-V3's report (`benchmarks/moe_accuracy.py` on "
        f"`{results['reference']}`) {_measured(results)}; {results['definition']}.",
        "",
        "| source | rows | mean \\|error\\| | max \\|error\\| |",
        "|---|---:|---:|---:|",
    ]
    for group, g in s["by_source_group"].items():
        lines.append(
            f"| {group} | {g['rows']} | {100 * g['mean_abs_error']:.1f} % | {100 * g['max_abs_error']:.1f} % |"
        )
    lines += [
        f"| **all** | {s['rows']} | {100 * s['mean_abs_error']:.1f} % | {100 * s['max_abs_error']:.1f} % |",
        "",
        f"The memory model calls {s['modelled_not_fitting']} of these {s['rows']} runs too large for their devices, "
        "though each ran: its figure for Megatron's MoE recipes reads high.",
    ]
    return lines


def fitted_section(results: dict) -> list[str]:
    """Every figure fitted to data, in one place: its value (read from the code or the results), what it was fitted
    on, and whether the leave-one-source-out loop refits it."""
    from toolkit.estimate.hardware import Assumptions
    from toolkit.estimate.moe import GROUPED_GEMM_HALF_ROWS
    from toolkit.estimate.serving_time import DECODE_ATTENTION_BW_FRACTION, ROOFLINE_SMOOTHING

    fitted = results["fitted"]
    left_out = ", ".join(f"{k} {v:g}" for k, v in fitted["left_out"].items())
    rows = [
        ("`sustained_fraction`", f"{fitted['sustained_fraction']:g}", "the visible measured training runs "
         "(`benchmarks/reference/measured-throughput.json` and the other step-time rows)",
         f"refitted leaving each source out ({left_out})"),
        ("`Assumptions.gemm_fraction`", f"{Assumptions().gemm_fraction:g}", "Megatron's 1T run (Narayanan et al. "
         "2021), once; prices only devices without a kernel profile", "not refitted"),
        ("`ROOFLINE_SMOOTHING`", f"{ROOFLINE_SMOOTHING:g}", "17 published kernel timings "
         "(`benchmarks/reference/gemm_kernels.json`; `benchmarks/kernel_roofline.py`)", "kernel-level: no run"),
        ("`DECODE_ATTENTION_BW_FRACTION`", f"{DECODE_ATTENTION_BW_FRACTION:g}", "the slopes of two paged "
         "decode-attention kernel tables (`benchmarks/reference/decode_kernels.md` A7-A15)", "kernel-level: no run"),
        ("`GROUPED_GEMM_HALF_ROWS`", f"{GROUPED_GEMM_HALF_ROWS:g}", "DeepGEMM's grouped GEMM table (its README)",
         "kernel-level: no run"),
        ("step-time likely ranges", "`toolkit/data/steptime_band.yaml`", "the visible runs' errors, between and "
         "within sources (`benchmarks/band_math.py`)", "coverage measured leaving each source out"),
        ("serving likely ranges", "`toolkit/data/serving_band.yaml`", "the visible published serving rows' "
         "10th-90th percentiles of error", "not left out"),
    ]  # fmt: skip
    lines = [
        "## Fitted figures",
        "",
        "Every figure fitted to data rather than read from a measurement of its own, with what it was fitted on "
        "(values read from the code and `benchmarks/results/steptime_accuracy.json`).",
        "",
        "| figure | value | fitted on | judged |",
        "|---|---|---|---|",
    ]
    return lines + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]


def worst_figures(results_dir: Path) -> str:
    """The README's limitations: the worst figures of each validation, generated from the results files."""

    def read(name):
        return json.loads((results_dir / name).read_text())

    step, moe, serving = read("steptime_accuracy.json"), read("moe_accuracy.json"), read("serving_accuracy.json")
    errors = {}
    for row in serving["rows"]:
        for key, f in row.get("figures", {}).items():
            metric = "ttft" if key.startswith("ttft") else "tpot" if key[:4] in ("tpot", "itl_") else key
            errors.setdefault(metric, []).append(f["error"])
    su = serving["summary"]
    return "\n".join(
        [
            f"- Step time held out: mean {100 * step['held_out']['mean_abs_error']:.1f} %, worst "
            f"{100 * step['held_out']['max_abs_error']:.1f} % (`benchmarks/steptime_accuracy.py`).",
            f"- Mixture-of-Experts step time: mean {100 * moe['summary']['mean_abs_error']:.1f} %, worst "
            f"{100 * moe['summary']['max_abs_error']:.1f} % on {moe['summary']['rows']} published runs; the memory "
            f"model calls {moe['summary']['modelled_not_fitting']} of them too large, though they ran.",
            f"- Serving against {len(serving['rows'])} published GPU rows: time to first token mean "
            f"{100 * su['ttft']['mean_abs_error']:.0f} % (rows {100 * min(errors['ttft']):+.0f} % to "
            f"{100 * max(errors['ttft']):+.0f} %), time per output token {100 * su['tpot']['mean_abs_error']:.0f} % "
            f"(to {100 * max(errors['tpot'], key=abs):+.0f} %), offline throughput "
            f"{100 * su['offline_throughput']['mean_abs_error']:.0f} % (`benchmarks/serving_accuracy.py`).",
        ]
    )


def memory_section(results: dict) -> list[str]:
    lines = [
        "## Memory",
        "",
        f"The analytic model against the traced program, {results['configurations']} jobs "
        f"(`{results['benchmark']}`) {_measured(results)}: |modelled − traced| / traced of each device's peak.",
        "",
        "| family | jobs | median | max |",
        "|---|---:|---:|---:|",
    ]
    for family, s in results["peak"].items():
        lines.append(f"| {family} | {s['rows']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} |")
    for family, s in results["int8_peak"].items():
        lines.append(
            f"| int8 activations, {family} | {s['rows']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} |"
        )
    lines += [
        "",
        f"Saved activations: max {_pct(results['activations']['max_abs_error'])} over "
        f"{results['activations']['rows']} jobs.",
    ]
    if results.get("offload_host_bytes"):
        lines.append(f"Host bytes under offload: max {_pct(results['offload_host_bytes']['max_abs_error'])}.")
    return lines


def layouts_section(results: dict) -> list[str]:
    rows = results["rows"]
    lines = [
        "## Training on ranks against one process",
        "",
        f"Every layout the runner trains, on gloo ranks, against the same job in one process (`benchmarks/"
        f"layouts.py`) {_measured(results)}: the largest relative loss difference over 10 steps, and each "
        "rank's measured peak against the estimate.",
        "",
        "| layout | ranks | precision | max loss difference | peak error |",
        "|---|---:|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['layout']} | {row['ranks']} | {row['precision']} | {row['max_loss_difference']:.1e} | "
            f"{_pct(row['peak_error'])} |"
        )
    lines += [
        "",
        "A ZeRO-3 run on 4 ranks resumed on 2 differs from the uninterrupted run by "
        f"{results['resume_dp4_to_dp2_difference']:.1e} (relative loss).",
    ]
    return lines


def moe_layouts_section(results: dict) -> list[str]:
    lines = [
        "## A Mixture of Experts on ranks against one process",
        "",
        f"Expert parallelism on gloo ranks against the same MoE job in one process (`benchmarks/moe_layouts.py`) "
        f"{_measured(results)}: the largest relative loss difference over 20 steps (before a routing flip, where "
        "one departs: top-k routing picks another expert where two scores tie within rounding), and each rank's "
        "measured peak against the estimate at the load its experts took.",
        "",
        "| layout | ranks | precision | max loss difference | departs at step | peak error |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['layout']} | {row['ranks']} | {row['precision']} | {row['max_loss_difference']:.1e} | "
            f"{row.get('departs_at') or '-'} | {_pct(row['peak_error'])} |"
        )
    lines += [
        "",
        "The ep-2 run's checkpoint resumed in one process differs from the one-process run by "
        f"{results['resume_ep2_to_one_process_difference']:.1e} (relative loss).",
    ]
    return lines


def serving_cpu_section(results: dict) -> list[str]:
    lines = [
        "## Serving on this CPU against its calibrated estimate",
        "",
        f"`toolkit generate` runs, {results['runs_per_job']} a job, against the serving estimate with this machine "
        f"calibrated by `toolkit calibrate` (`benchmarks/serving_cpu.py`) {_measured(results)}: time per output token "
        "and to first token (the runs' median), the KV cache's bytes and the peak MemTracker measured.",
        "",
        "| job | ranks | TPOT estimated | TPOT measured | TPOT error | TTFT error | KV cache | peak error |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for job in results["jobs"]:
        r = job["rows"]
        kv = "equal" if r["kv_cache_bytes"]["estimated"] == r["kv_cache_bytes"]["measured_median"] else "differs"
        lines.append(
            f"| {job['job']} | {job['ranks']} | {r['tpot_s']['estimated'] * 1e3:.2f} ms | "
            f"{r['tpot_s']['measured_median'] * 1e3:.2f} ms | {100 * r['tpot_s']['error']:+.1f} % | "
            f"{100 * r['ttft_s']['error']:+.1f} % | {kv} | {100 * r['peak_bytes']['error']:+.1f} % |"
        )
    lines += [
        "",
        "Under tensor parallelism the peak leaves out the buffers of DTensor's collectives on gloo (the row-parallel "
        "outputs' partial sums and their reduced copies); its weights and cache are exact.",
    ]
    return lines


def serving_accuracy_section(results: dict) -> list[str]:
    lines = [
        "## Serving under load against published measurements",
        "",
        "The load simulation (`toolkit estimate --workload inference` at each row's rate, concurrency or offline "
        f"batch) against the visible published rows of `benchmarks/reference/serving_runs.json` "
        f"(`benchmarks/serving_accuracy.py`) {_measured(results)}. No model figure is fitted on them (each source "
        "is left out by construction); the serving ranges (toolkit/data/serving_band.yaml) are these rows' own 10th-90th "
        "percentiles, not left out. Mean |estimated / measured − 1| by metric and source.",
        "",
        "| metric | rows | mean error | by source |",
        "|---|---:|---:|---|",
    ]
    for name, s in results["summary"].items():
        by = ", ".join(f"{g} {100 * e:.0f} %" for g, e in s["by_source"].items())
        mean = "—" if s["mean_abs_error"] is None else f"{100 * s['mean_abs_error']:.1f} %"
        lines.append(f"| {name.replace('_', ' ')} | {s['rows']} | {mean} | {by} |")
    return lines


def serving_live_section(results: dict) -> list[str]:
    lines = [
        "## A live endpoint on this CPU against its calibrated simulation",
        "",
        "`toolkit generate --serve` benchmarked with `toolkit bench` under each load, beside the simulation "
        f"calibrated here (`benchmarks/serving_live.py`) {_measured(results)}.",
        "",
        "| case | TTFT p50 estimated | measured | error | TPOT p50 estimated | measured | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in results["cases"]:
        rows = {r["quantity"]: r for r in case["rows"]}
        t, p = rows["ttft_s_p50"], rows["tpot_s_p50"]
        lines.append(
            f"| {case['case']} | {t['estimated'] * 1e3:.2f} ms | {t['measured'] * 1e3:.2f} ms | "
            f"{100 * t['error']:+.1f} % | {p['estimated'] * 1e3:.2f} ms | {p['measured'] * 1e3:.2f} ms | "
            f"{100 * p['error']:+.1f} % |"
        )
    return lines


def steptime_section(results: dict) -> list[str]:
    lines = ["## Step time", "", table(results), ""]
    calibrated = results.get("one_calibration")
    if calibrated:
        lines += [
            "On this machine, one calibration (`toolkit calibrate` on the 2-rank DDP job) then every layout "
            "modelled with it against its measured step (`steptime_accuracy.py --one-calibration-only`):",
            "",
            "| layout | modelled − measured |",
            "|---|---:|",
        ]
        lines += [f"| {name} | {100 * error:+.1f} % |" for name, error in calibrated.items()]
        itself = calibrated.get("2 ranks, dp (DDP)")
        if itself is not None:
            lines += [
                "",
                f"The DDP row is the calibrated job itself: its {100 * itself:+.1f} % is how far this shared machine's "
                "rates moved between `toolkit calibrate` timing its kernels and the run; the other rows' distance "
                "from it is the model's.",
            ]
    return lines


def accuracy_doc(results_dir: Path) -> str:
    """docs/accuracy.md from the results files."""

    def read(name):
        path = results_dir / name
        return json.loads(path.read_text()) if path.exists() else None

    lines = [
        "# Accuracy",
        "",
        "Generated by `benchmarks/readme_tables.py` from `benchmarks/results/*.json`; do not "
        "edit by hand. Each section names the benchmark that measured it, when, and where.",
        "",
    ]
    for name, section in (
        ("steptime_accuracy.json", steptime_section),
        ("memory_accuracy.json", memory_section),
        ("layouts.json", layouts_section),
        ("moe_layouts.json", moe_layouts_section),
        ("moe_accuracy.json", moe_section),
        ("serving_cpu.json", serving_cpu_section),
        ("serving_live.json", serving_live_section),
        ("serving_accuracy.json", serving_accuracy_section),
        ("steptime_accuracy.json", fitted_section),
    ):
        results = read(name)
        if results is not None:
            lines += section(results) + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = (ROOT / "README.md").read_text()
    new = rewritten(readme, json.loads(RESULTS.read_text()))
    head, rest = new.split(LIMITS_BEGIN, 1)
    new = f"{head}{LIMITS_BEGIN}\n{worst_figures(RESULTS.parent)}\n{LIMITS_END}{rest.split(LIMITS_END, 1)[1]}"
    doc = accuracy_doc(RESULTS.parent)
    if args.check:
        if AGE.sub("", new) != AGE.sub("", readme):
            sys.exit(
                "README's step-time table differs from benchmarks/results/steptime_accuracy.json: "
                "run benchmarks/readme_tables.py"
            )
        if not ACCURACY.exists() or AGE.sub("", ACCURACY.read_text()) != AGE.sub("", doc):
            sys.exit("docs/accuracy.md differs from benchmarks/results/*.json: run benchmarks/readme_tables.py")
        return
    (ROOT / "README.md").write_text(new)
    ACCURACY.write_text(doc)


if __name__ == "__main__":
    main()
