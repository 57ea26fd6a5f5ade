"""The serving simulation against published serving measurements: `python benchmarks/serving_accuracy.py`

Replays `benchmarks/reference/serving_runs.json` (each row's source inside it: engines' own benchmark pages and
their raw outputs; validation only, nothing fitted) through `toolkit estimate --workload inference` with the row's
model, GPUs, tensor parallelism, weights, engine, mean lengths and load (a Poisson rate, a concurrency, or an offline
batch: every request at once), and sets each published figure beside the estimate's. Reported by source
(leave-one-source-out: the model has no constant fitted on any) and overall, for offline throughput, time per output
token (the published TPOT, or median inter-token latency) and time to first token. Lengths are the datasets' means
spread as the row's dataset spreads them (lengths_of). Results: benchmarks/results/serving_accuracy.json; headline figures last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml
from provenance import provenance

from toolkit.estimate import estimate
from toolkit.specs import Job, load_catalog

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "reference" / "serving_runs.json"
RESULTS = ROOT / "benchmarks" / "results" / "serving_accuracy.json"
SIMULATED_REQUESTS = 1000
PAIRS = {  # published key -> the estimate's serving key
    "output_tokens_per_s": "output_tokens_per_s",
    "requests_per_s": "requests_per_s",
    "ttft_s_mean": "ttft_s",
    "ttft_s_p50": "ttft_s_p50",
    "ttft_s_p99": "ttft_s_p99",
    "tpot_s_mean": "tpot_s",
    "tpot_s_p50": "tpot_s_p50",
    "itl_s_p50": "tpot_s_p50",
    "e2e_s_p50": "e2e_s_p50",
}


SAME_ARCHITECTURE = {
    "llama3.1-8b": "llama3-8b",
    "llama3.1-70b": "llama3-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama3-405b",
}
"""Llama 3.1 and 3.3 keep Llama 3's blocks (layers, widths, heads, vocabulary; Meta's model cards): only the rotary
scaling for 128K contexts differs, which these prompt lengths do not reach."""


def preset_of(model: dict) -> str | None:
    name = model.get("preset") or model.get("hf_name")
    return SAME_ARCHITECTURE.get(name, model.get("preset"))


def lengths_of(row: dict) -> str:
    """How the row's benchmark drew its lengths, from its note: ShareGPT's conversations, the `random` dataset
    (uniform, range ratio 0 in every visible row) or fixed."""
    note = row["lengths_note"].lower()
    return "sharegpt" if "sharegpt" in note else "uniform" if "random dataset" in note else "fixed"


def job_of(row: dict, catalog) -> Job:
    count, accelerator = row["gpus"].split("x", 1)
    load = row["load"]
    serving = {
        "input_tokens": max(round(row["input_tokens"]), 1),
        "output_tokens": max(round(row["output_tokens"]), 2),
        "weights": row.get("weights"),
        "kv_dtype": row.get("kv_dtype", "auto"),
        "engine": row["engine"] if row["engine"] in ("vllm", "sglang", "trtllm") else "vllm",
        "requests": SIMULATED_REQUESTS,
        "lengths": lengths_of(row),
    }
    if "rate" in load:
        serving["rate"] = load["rate"]
    elif "concurrency" in load:
        serving["concurrency"] = load["concurrency"]
    else:  # offline: every request at once, as a throughput benchmark sends them
        serving |= {"rate": 1e6, "requests": min(load.get("requests", SIMULATED_REQUESTS), 2000)}
    spec = {
        "workload": "inference",
        "model": {"preset": preset_of(row["model"])},
        "cluster": {"accelerator": accelerator, "count": int(count)},
        "parallel": {"tp": row["tp"]},
        "serving": serving,
    }
    return Job.from_dict(spec, catalog)


def evaluate(rows: list[dict]) -> list[dict]:
    catalog = load_catalog()
    out = []
    for row in rows:
        entry = {"id": row["id"], "source_group": row["source_group"], "kind": _kind(row)}
        if preset_of(row["model"]) is None:
            out.append({**entry, "skipped": f"no preset for {row['model'].get('hf_name')}"})
            continue
        try:
            serving = estimate(job_of(row, catalog), catalog)["serving"]
        except Exception as err:  # a refusal: one line
            out.append({**entry, "refused": f"{type(err).__name__}: {str(err).splitlines()[0]}"})
            continue
        figures = {}
        for key, measured in row["measured"].items():
            ours = serving.get(PAIRS.get(key, ""))
            if ours is not None and measured:
                figures[key] = {"measured": measured, "estimated": ours, "error": ours / measured - 1}
        out.append({**entry, "figures": figures})
    return out


def _kind(row: dict) -> str:
    return "offline" if row["load"].get("offline") else "online"


def summary(results: list[dict]) -> dict:
    """Mean |error| by metric, by source and overall."""
    metrics = {
        "offline_throughput": lambda r: r["kind"] == "offline" and "output_tokens_per_s" in r["figures"],
        "tpot": lambda r: r["kind"] == "online" and _tpot(r) is not None,
        "ttft": lambda r: r["kind"] == "online" and _ttft(r) is not None,
    }
    pick = {"offline_throughput": lambda r: r["figures"]["output_tokens_per_s"]["error"], "tpot": _tpot, "ttft": _ttft}
    out = {}
    estimated = [r for r in results if "figures" in r]
    for name, keep in metrics.items():
        errors = [(r["source_group"], abs(pick[name](r))) for r in estimated if keep(r)]
        groups = sorted({g for g, _ in errors})
        out[name] = {
            "rows": len(errors),
            "mean_abs_error": statistics.fmean(e for _, e in errors) if errors else None,
            "by_source": {g: statistics.fmean(e for s, e in errors if s == g) for g in groups},
        }
    return out


def _tpot(r):
    f = r["figures"]
    for key in ("tpot_s_p50", "itl_s_p50", "tpot_s_mean"):
        if key in f:
            return f[key]["error"]
    return None


def _ttft(r):
    f = r["figures"]
    for key in ("ttft_s_p50", "ttft_s_mean"):
        if key in f:
            return f[key]["error"]
    return None


def write_band(results: list[dict]) -> None:
    """Each figure's 10th and 90th percentiles of the signed errors into toolkit/data/serving_band.yaml (what
    `toolkit estimate --workload inference` gives as serving.*_range)."""
    from toolkit.estimate.band import SERVING_BAND_FILE

    estimated = [r for r in results if "figures" in r]
    signed = {
        "tpot_s": [_tpot(r) for r in estimated if r["kind"] == "online" and _tpot(r) is not None],
        "ttft_s": [_ttft(r) for r in estimated if r["kind"] == "online" and _ttft(r) is not None],
        "output_tokens_per_s": [
            r["figures"]["output_tokens_per_s"]["error"] for r in estimated if "output_tokens_per_s" in r["figures"]
        ],
    }
    figures = {}
    for key, errors in signed.items():
        deciles = statistics.quantiles(errors, n=10, method="inclusive")
        figures[key] = {"error_low": round(deciles[0], 4), "error_high": round(deciles[-1], 4), "rows": len(errors)}
    header = (
        "# Serving's error band (toolkit/estimate/band.py), WRITTEN BY benchmarks/serving_accuracy.py --write-band:\n"
        "# per figure, the 10th and 90th percentiles of the signed errors (modelled - measured) / measured on the\n"
        "# visible published serving runs (benchmarks/reference/serving_runs.json). Do not edit by hand.\n"
    )
    SERVING_BAND_FILE.write_text(header + yaml.safe_dump({"figures": figures, **provenance()}, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write-band", action="store_true", help="also rewrite toolkit/data/serving_band.yaml from these errors"
    )
    args = parser.parse_args()
    rows = json.loads(REFERENCE.read_text())["rows"]
    results = evaluate(rows)
    for r in results:
        if "figures" in r:
            shown = ", ".join(f"{k} {v['error']:+.0%}" for k, v in r["figures"].items())
            print(f"{r['id']:44s} {shown}")
        else:
            print(f"{r['id']:44s} {r.get('refused') or r.get('skipped')}")
    figures = summary(results)
    if args.write_band:
        write_band(results)
    RESULTS.write_text(json.dumps({**provenance(), "summary": figures, "rows": results}, indent=1) + "\n")
    print()
    for name, s in figures.items():
        by = ", ".join(f"{g} {e:.0%}" for g, e in s["by_source"].items())
        print(f"  {name:20s} rows {s['rows']:3d}  mean |error| {100 * (s['mean_abs_error'] or 0):5.1f} %   ({by})")
    print()
    refused = sum("refused" in r for r in results)
    for name, s in figures.items():
        print(f"serving_{name}_mean_abs_error_pct: {100 * (s['mean_abs_error'] or 0):.1f}")
    print(f"serving_rows: {len(results)}")
    print(f"serving_refused: {refused}")


if __name__ == "__main__":
    main()
