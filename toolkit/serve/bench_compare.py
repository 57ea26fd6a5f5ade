"""A `toolkit bench` folder beside the load simulation: the served job (DIR/job.yaml) run through the engine's
simulation (toolkit.estimate.serving_load) at the bench's own load, its time to first token and per output token
(p50, p99) and throughput set beside what the endpoint measured.

    compare_bench("runs/bench", ["cpu.yaml"])     # the catalogs; on a CPU, the profile `toolkit calibrate` writes
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..estimate.serving_load import serving_load
from ..estimate.serving_memory import serving_memory
from ..estimate.serving_time import ServingClock, serving_hardware
from ..specs import SpecError
from .bench import BENCH_FILE
from .compare import _error, _job

__all__ = ["compare_bench", "is_bench_run"]

QUANTITIES = (("ttft_s", "p50"), ("ttft_s", "p99"), ("tpot_s", "p50"), ("tpot_s", "p99"))


def is_bench_run(out: str | Path) -> bool:
    return (Path(out) / BENCH_FILE).is_file()


def compare_bench(out: str | Path, catalog_files=()) -> dict:
    """{"run", "rows": [{quantity, estimated, measured, error}], "notes"} for a bench folder."""
    out = Path(out)
    bench = json.loads((out / BENCH_FILE).read_text())
    if not (out / "job.yaml").is_file():
        raise SpecError("--run", str(out), "has no job.yaml: bench again with --job (the served job's job.yaml)")
    job, catalog = _job(out, catalog_files)
    serving = dataclasses.replace(
        job.serving,
        input_tokens=bench["input_tokens"],
        output_tokens=bench["output_tokens"],
        requests=bench["completed"],
        rate=bench["rate"],
        concurrency=bench["concurrency"] or job.serving.concurrency,
    )
    job = job.replace(serving=serving)
    measured = {f"{q}_{p}": bench[q][p] for q, p in QUANTITIES} | {"output_tokens_per_s": bench["output_tokens_per_s"]}
    hw = serving_hardware(job, catalog)
    notes, estimated = [], dict.fromkeys(measured)
    if hw is None:
        notes.append(
            "time: no device figures for this machine; measure them with `toolkit calibrate --config "
            f"{out / 'job.yaml'} --out cpu.yaml` and add `--catalog cpu.yaml`"
        )
    else:
        mem = serving_memory(job, catalog.accelerator(job.cluster.accelerator))
        load = serving_load(job, ServingClock(job, hw), mem.kv_blocks * job.serving.block_size, serving.concurrency)
        estimated = {f"{q}_{p}": load[q][p] for q, p in QUANTITIES}
        estimated["output_tokens_per_s"] = load["output_tokens_per_s"]
        notes.append(f"simulated: {load['mode']} load, {load['requests']} requests, engine {load['engine']}")
    rows = [{"quantity": k, "estimated": estimated[k], "measured": m, "error": _error(estimated[k], m)}
            for k, m in measured.items()]  # fmt: skip
    return {"run": str(out), "rows": rows, "notes": notes, "bench": {k: bench[k] for k in ("url", "model", "mode")}}
