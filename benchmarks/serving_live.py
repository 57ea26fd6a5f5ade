"""`toolkit generate --serve` under load on this CPU against the load simulation calibrated here:
`python benchmarks/serving_live.py`

For each case: `toolkit calibrate` on the served job (the model's kernel figures, and the server's own host work
with the model taken out: toolkit.calibrate.serve_host), then the server started, `toolkit bench` against it at
the case's load, and `toolkit compare --run` on the bench folder. Targets (issue 51): p50 time to first token and
p50 time per output token within 15 %. Nothing is fitted on these runs: the simulation sees only the calibration.
Results: benchmarks/results/serving_live.json. Headline figures last. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance

RESULTS = Path(__file__).parent / "results" / "serving_live.json"
GPT2 = "--layers 4 --hidden 256 --heads 4 --vocab 256 --seq 512 --precision fp32".split()
LLAMA = "--layers 4 --hidden 384 --heads 6 --kv-heads 2 --mlp swiglu --norm rmsnorm --position rope --vocab 256".split()
LLAMA += "--seq 512 --precision fp32".split()
CASES = [  # (name, model flags, bench load flags)
    ("GPT-2 style 4 x 256, 1 in flight", GPT2, ["--concurrency", "1", "--requests", "16"]),
    ("GPT-2 style 4 x 256, 4 in flight", GPT2, ["--concurrency", "4", "--requests", "32"]),
    ("Llama style 4 x 384, 8 in flight", LLAMA, ["--concurrency", "8", "--requests", "48"]),
    ("GPT-2 style 4 x 256, Poisson 4 req/s", GPT2, ["--rate", "4", "--requests", "40"]),
]
LENGTHS = ["--input-tokens", "128", "--output-tokens", "32"]
SERVER = ["--max-num-seqs", "8", "--max-batched-tokens", "256"]


def toolkit(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", *argv], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"toolkit {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def serve(flags: list[str], out: Path) -> tuple[subprocess.Popen, str]:
    """Start the server on a free port; its URL once it says it is serving."""
    argv = [sys.executable, "-m", "toolkit.cli", "generate", "--serve", "--port", "0", *flags, "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if " at http://" in line:
            return proc, line.split(" at ")[1].split()[0]
    proc.kill()
    raise SystemExit("the server did not start")


def case(work: Path, name: str, model: list[str], load: list[str]) -> dict:
    folder = work / name.split(",")[0].replace(" ", "_")
    flags = [*model, *LENGTHS, *SERVER, "--workload", "inference"]
    proc, url = serve(flags, folder / "server")
    try:  # calibrated beside the idle server, as the bench will find the machine
        profile = folder / "cpu.yaml"
        toolkit("calibrate", "--config", str(folder / "server" / "job.yaml"), "--out", str(profile))
        bench = folder / "bench"
        toolkit("bench", "--url", url, "--model", "toolkit-gpt", *LENGTHS, *load, "--out", str(bench),
                "--job", str(folder / "server" / "job.yaml"))  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    compared = json.loads(toolkit("compare", "--run", str(bench), "--catalog", str(profile), "--json"))
    return {"case": name, "flags": flags + load, "rows": compared["rows"], "notes": compared["notes"]}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="serving-live-"))
    results = []
    print(
        f"{'case':40s} {'TTFT p50 est':>12s} {'measured':>9s} {'error':>7s} {'TPOT p50 est':>12s} {'measured':>9s} {'error':>7s}"
    )
    for name, model, load in CASES:
        r = case(work, name, model, load)
        results.append(r)
        rows = {row["quantity"]: row for row in r["rows"]}
        t, p = rows["ttft_s_p50"], rows["tpot_s_p50"]
        print(
            f"{name:40s} {t['estimated'] * 1e3:10.2f}ms {t['measured'] * 1e3:7.2f}ms {t['error']:+7.1%} "
            f"{p['estimated'] * 1e3:10.2f}ms {p['measured'] * 1e3:7.2f}ms {p['error']:+7.1%}",
            flush=True,
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**provenance(), "cases": results}, indent=1) + "\n")

    def errors(q):
        return [abs(next(x for x in r["rows"] if x["quantity"] == q)["error"]) for r in results]

    print(f"serving_live_ttft_p50_mean_abs_error_pct: {100 * statistics.fmean(errors('ttft_s_p50')):.1f}")
    print(f"serving_live_ttft_p50_max_abs_error_pct: {100 * max(errors('ttft_s_p50')):.1f}")
    print(f"serving_live_tpot_p50_mean_abs_error_pct: {100 * statistics.fmean(errors('tpot_s_p50')):.1f}")
    print(f"serving_live_tpot_p50_max_abs_error_pct: {100 * max(errors('tpot_s_p50')):.1f}")


if __name__ == "__main__":
    main()
