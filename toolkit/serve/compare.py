"""A `toolkit generate` run beside its estimate: the KV cache's bytes, the peak, time to first token, time per output
token and output tokens/s, each with its error.

    compare_generate("runs/gen", ["cpu.yaml"])     # the run's catalogs, then a `toolkit calibrate` profile

Time needs the device's figures: a catalog accelerator, or on a CPU the profile `toolkit calibrate` writes (its row
replaces the job's accelerator, as for a training run's comparison).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..estimate.kv_cache import cache_bytes
from ..estimate.serving_memory import runner_peak_bytes, weight_bytes
from ..estimate.serving_time import ServingClock, serving_hardware
from ..runs.folder import run_catalog_files
from ..specs import Job, SpecError, load_catalog
from ..specs.serving import KV_BYTES
from .worker import GENERATE_FILE, prefill_chunk

__all__ = ["compare_generate", "render_generate", "is_generate_run"]


def is_generate_run(out: str | Path) -> bool:
    return (Path(out) / GENERATE_FILE).is_file()


def _job(out: Path, catalog_files) -> tuple[Job, object]:
    catalog = load_catalog(*run_catalog_files(out), *catalog_files)
    job = Job.from_yaml(out / "job.yaml", catalog)
    profiled = [row["name"] for f in catalog_files for row in (_rows(f))]
    if profiled:  # a profile of this machine: its row is the device the run ran on
        job = job.replace(cluster=dataclasses.replace(job.cluster, accelerator=profiled[0], count=job.parallel.tp))
    resolved, _notes = job.resolve(catalog)
    return resolved, catalog


def _rows(path) -> list[dict]:
    from ..specs.yamlio import read_yaml

    data = read_yaml(path, what="catalog file") or {}
    return list(data.get("accelerators") or [])


def _error(estimated, measured):
    if estimated is None or not measured:
        return None
    return (estimated - measured) / measured


def compare_generate(out: str | Path, catalog_files=()) -> dict:
    """{"rows": [{quantity, estimated, measured, error}], "notes": [...]} for a generate run folder."""
    out = Path(out)
    if not is_generate_run(out):
        raise SpecError("--run", str(out), f"has no {GENERATE_FILE}: run `toolkit generate --out {out}` first")
    record = json.loads((out / GENERATE_FILE).read_text())
    job, catalog = _job(out, catalog_files)
    s, tp = job.serving, job.parallel.tp
    kv = s.concurrency * cache_bytes(job.model, s.context, KV_BYTES[s.kv_dtype], tp)
    step_tokens = s.concurrency * prefill_chunk(job)
    matrices, other = weight_bytes(job)
    rows = [
        ("weights_bytes", matrices + other, record.get("categories", {}).get("PARAM")),
        ("kv_cache_bytes", kv, record["kv_cache_bytes"]),
        ("peak_bytes", runner_peak_bytes(job, step_tokens), record["peak_bytes"]),
    ]
    notes = []
    if tp > 1:
        notes.append(
            "peak under tensor parallelism: the buffers of DTensor's collectives on gloo (the row-parallel outputs' "
            "partial sums and their reduced copies) are not modelled; weights and cache are"
        )
    hw = serving_hardware(job, catalog) if job.cluster.accelerator else None
    if hw is None:
        notes.append(
            "time: no device figures for this machine; measure them with `toolkit calibrate --config "
            f"{out / 'job.yaml'} --out cpu.yaml` and add `--catalog cpu.yaml`"
        )
    else:
        clock = ServingClock(job, hw)
        decode = clock.token_s(clock.step_s(s.concurrency, s.input_tokens + s.output_tokens / 2))
        ttft = clock.prefill_s(s.input_tokens, batch=s.concurrency)
        rows += [
            ("ttft_s", ttft, record["ttft_s"]),
            ("tpot_s", decode, record["tpot_s"]),
            (
                "output_tokens_per_s",
                s.concurrency * s.output_tokens / (ttft + (s.output_tokens - 1) * decode),
                record["output_tokens_per_s"],
            ),
        ]
    return {
        "run": str(out),
        "rows": [{"quantity": q, "estimated": e, "measured": m, "error": _error(e, m)} for q, e, m in rows],
        "matches_plain_forward": record.get("matches_plain_forward"),
        "notes": notes,
    }


def render_generate(record: dict, out) -> str:
    lines = [
        f"{out}: {record['serving'].get('concurrency')} request(s), {record['serving'].get('input_tokens')} prompt + "
        f"{record['serving'].get('output_tokens')} new tokens on {record['world']} rank(s)",
        f"  time to first token   {record['ttft_s'] * 1e3:9.1f} ms",
        "  time per output token         - (one token: no decode step)"
        if record["tpot_s"] is None
        else f"  time per output token {record['tpot_s'] * 1e3:9.2f} ms (median step)",
        f"  output tokens/s       {record['output_tokens_per_s']:9.1f}",
        f"  KV cache              {record['kv_cache_bytes'] / 2**20:9.2f} MiB a rank",
        f"  peak                  {record['peak_bytes'] / 2**20:9.2f} MiB a rank ({record['instrument']})",
    ]
    if "matches_plain_forward" in record:
        lines.append(f"  greedy equals a forward without cache: {record['matches_plain_forward']}")
        if not record["matches_plain_forward"] and record.get("compute_dtype") in ("bf16", "fp16"):
            lines.append(
                f"    expected in {record['compute_dtype']}: the cached and uncached programs add in a different "
                f"order, so near-equal logits can pick another token (first at new token "
                f"{record.get('first_difference')}) and the two continuations part there; in fp32 they match "
                "token for token (`--precision fp32 --verify` checks the cache itself)"
            )
    lines.append(f"compare: toolkit compare --run {out}")
    return "\n".join(lines)


def render_generate_comparison(result: dict) -> str:
    lines = [f"{result['run']}: estimate beside the run", f"  {'':22}{'estimated':>14}{'measured':>14}{'error':>9}"]
    for row in result["rows"]:
        e, m, err = row["estimated"], row["measured"], row["error"]
        q = row["quantity"]
        unit = 2**20 if q.endswith("bytes") else 1e-3 if q.endswith("_s") and not q.endswith("per_s") else 1
        fmt = lambda v: "-" if v is None else f"{v / unit:14.3f}"  # noqa: E731, B023
        lines.append(f"  {row['quantity']:22}{fmt(e)}{fmt(m)}{'' if err is None else f'{err:+9.1%}'}")
    lines += [f"  note: {n}" for n in result["notes"]]
    return "\n".join(lines)
