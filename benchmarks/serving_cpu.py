"""`toolkit generate` on this CPU against the serving estimate calibrated here: `python benchmarks/serving_cpu.py`

For each job, three times: a `toolkit generate` run, then `toolkit calibrate` on the job right after it (kernel-level
figures: the matmul rate, the streaming rate of a decode step's products, the fixed cost of one decode operation; this
shared machine's rates drift by a third over minutes, so each run is set beside its own calibration); the medians
of the estimates and of the measured times per output token and to first token (target: decode within 15 %), the KV cache's
bytes (target: equal) and the peak MemTracker measures (target: within 3 % on one process; under tensor parallelism
the collectives' buffers are not modelled). Results: benchmarks/results/serving_cpu.json (notebook 09 and
docs/serving.md quote it). Headline figures last. About 7 minutes on 2 cores.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import provenance

RUNS = 3
RESULTS = Path(__file__).parent / "results" / "serving_cpu.json"
BASE = "--vocab 256 --seq 1024 --precision fp32 --input-tokens 128 --output-tokens 64".split()
JOBS = [  # (name, flags, ranks)
    ("GPT-2 style, 4 x 256, 4 requests", ["--layers", "4", "--hidden", "256", "--heads", "4", "--concurrency", "4"], 1),
    (
        "Llama style (GQA, SwiGLU, RoPE), 4 x 384, 8 requests",
        "--layers 4 --hidden 384 --heads 6 --kv-heads 2 --mlp swiglu --norm rmsnorm --concurrency 8".split(),
        1,
    ),
    ("GPT-2 style, 6 x 512, 1 request", ["--layers", "6", "--hidden", "512", "--heads", "8", "--concurrency", "1"], 1),
    (
        "GPT-2 style, 4 x 256, 4 requests, tp 2",
        ["--layers", "4", "--hidden", "256", "--heads", "4", "--concurrency", "4"],
        2,
    ),
]


def toolkit(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", *argv], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"toolkit {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def measure(work: Path, name: str, flags: list[str], ranks: int) -> dict:
    out = work / name.split(",")[0].replace(" ", "_") / f"tp{ranks}"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for _ in range(RUNS):  # each run beside a calibration taken right after it: this shared machine's rates drift
        toolkit("generate", *BASE, *flags, "--out", str(out), "--nproc", str(ranks))
        profile = work / "cpu.yaml"
        toolkit("calibrate", "--config", str(out / "job.yaml"), "--nproc", str(ranks), "--out", str(profile))
        runs.append(json.loads(toolkit("compare", "--run", str(out), "--catalog", str(profile), "--json")))
    rows = {}
    for quantity in ("weights_bytes", "kv_cache_bytes", "peak_bytes", "ttft_s", "tpot_s", "output_tokens_per_s"):
        pairs = [r for run in runs for r in run["rows"] if r["quantity"] == quantity]
        rows[quantity] = summary([r["estimated"] for r in pairs], [r["measured"] for r in pairs])
    return {"job": name, "ranks": ranks, "flags": BASE + flags, "rows": rows}


def summary(estimated: list, measured: list) -> dict:
    """The runs' medians, and the error of the estimate's median against the measured median."""
    est = statistics.median(estimated) if None not in estimated else None
    meas = statistics.median(measured)
    return {
        "estimated_runs": estimated,
        "measured_runs": measured,
        "estimated": est,
        "measured_median": meas,
        "error": None if est is None or not meas else (est - meas) / meas,
    }


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="serving-cpu-"))
    results = []
    print(f"{'job':56s} {'tpot est':>9s} {'measured':>9s} {'error':>7s} {'ttft err':>9s} {'peak err':>9s} {'kv':>6s}")
    for name, flags, ranks in JOBS:
        r = measure(work, name, flags, ranks)
        results.append(r)
        rows = r["rows"]
        kv_equal = rows["kv_cache_bytes"]["estimated"] == rows["kv_cache_bytes"]["measured_median"]
        print(
            f"{name:56s} {rows['tpot_s']['estimated'] * 1e3:8.2f}m {rows['tpot_s']['measured_median'] * 1e3:8.2f}m "
            f"{rows['tpot_s']['error']:+7.1%} {rows['ttft_s']['error']:+9.1%} {rows['peak_bytes']['error']:+9.1%} "
            f"{'equal' if kv_equal else 'DIFF':>6s}",
            flush=True,
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**provenance(), "runs_per_job": RUNS, "jobs": results}, indent=1) + "\n")
    one = [r for r in results if r["ranks"] == 1]
    tpot = [abs(r["rows"]["tpot_s"]["error"]) for r in results]
    print(f"serving_cpu_tpot_mean_abs_error_pct: {100 * statistics.fmean(tpot):.1f}")
    print(f"serving_cpu_tpot_max_abs_error_pct: {100 * max(tpot):.1f}")
    print(
        f"serving_cpu_ttft_mean_abs_error_pct: {100 * statistics.fmean(abs(r['rows']['ttft_s']['error']) for r in results):.1f}"
    )
    print(
        f"serving_cpu_peak_max_abs_error_pct_one_process: {100 * max(abs(r['rows']['peak_bytes']['error']) for r in one):.2f}"
    )
    kv = all(
        r["rows"]["kv_cache_bytes"]["estimated"] == r["rows"]["kv_cache_bytes"]["measured_median"] for r in results
    )
    print(f"serving_cpu_kv_cache_bytes_equal: {kv}")


if __name__ == "__main__":
    main()
