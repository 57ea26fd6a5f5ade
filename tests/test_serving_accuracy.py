"""The visible serving validation set (benchmarks/reference/serving_runs.json) and its results
(benchmarks/serving_accuracy.py): every row sourced with its figures quoted, none from the tables kept aside to judge
the model, every row in the results file, and the time-per-token error held to the bound that file records."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = json.loads((ROOT / "benchmarks" / "reference" / "serving_runs.json").read_text())["rows"]
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "serving_accuracy.json").read_text())

TPOT_BOUND = 0.30
"""benchmarks/results/serving_accuracy.json records a mean |error| of 29.4 % on time per output token over 26 online
rows (nothing fitted); rounded up to the next 5 %. Raise it only with a new results file that says why."""
TTFT_BOUND = 0.50
"""The same file: 50.0 % on time to first token over 32 rows, rounded up to the next 5 % (was 42.7 %: vLLM's own
defaults for an A100, 256 requests and 2,048 tokens a step, now apply, and LMDeploy's 2023 TurboMind rows, with no
engine of their own here, are modelled as vLLM on their A100: their 64 prompts then prefill in 2,048-token steps)."""
OFFLINE_BOUND = 0.30
"""The same file: 23.5 % on offline throughput over 13 rows, rounded up to the next 5 %."""
HELD_OUT = ("perf-overview", "perf_overview", "inferencemax", "aiconfigurator", "nim", "megatron-bridge", "nemo")


def test_every_row_is_sourced_and_quoted():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    for r in ROWS:
        assert r["source"]["url"].startswith("https://") and r["source"]["read"], r["id"]
        assert r["measured"] and all(v > 0 for v in r["measured"].values()), r["id"]


def test_no_row_comes_from_the_tables_kept_aside():
    for r in ROWS:
        text = json.dumps(r["source"]).lower()
        assert not any(word in text for word in HELD_OUT), r["id"]


def test_the_results_cover_every_row_and_hold_the_bound():
    assert {"date", "commit", "machine"} <= set(RESULTS)
    assert {r["id"] for r in RESULTS["rows"]} == {r["id"] for r in ROWS}, "rerun benchmarks/serving_accuracy.py"
    assert RESULTS["summary"]["tpot"]["mean_abs_error"] <= TPOT_BOUND
    assert RESULTS["summary"]["ttft"]["mean_abs_error"] <= TTFT_BOUND
    assert RESULTS["summary"]["offline_throughput"]["mean_abs_error"] <= OFFLINE_BOUND
