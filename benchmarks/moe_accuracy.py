"""The step-time model against published Mixture-of-Experts training runs: modelled step beside the measured one.

    .venv/bin/python benchmarks/moe_accuracy.py [--reference PATH] [--json PATH]

Replays benchmarks/reference/moe_runs.json (each row's source, layout and measured figure inside it) through
toolkit.estimate.estimate with the catalog as shipped: nothing is fitted here and no figure of the model is tuned.
Like is compared with like: a published step time is taken as it is; a published TFLOP/s per GPU is turned into the
step time it implies under the source's own FLOP count (Megatron-Core's num_floating_point_operations, causal
attention: `megatron_flops`); a published tokens/s per GPU into the step its batch takes. error = modelled /
measured - 1. A row the toolkit refuses is listed as refused with its one-line reason; a row marked `skip` in the
reference (an accelerator the catalog lacks) is listed as skipped. Results: benchmarks/results/moe_accuracy.json.
Headline figures last, one per line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.estimate import estimate  # noqa: E402
from toolkit.specs import Job, compute_dtype, load_catalog  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "reference" / "moe_runs.json"
RESULTS = ROOT / "benchmarks" / "results" / "moe_accuracy.json"
JOB_SECTIONS = ("model", "batch", "parallel", "memory", "overlap", "moe", "precision", "optimizer", "cluster")


def job_of(row: dict) -> Job:
    """The row's run as a Job: its sections as written, the model's hf_config path taken from the repository root."""
    data = {part: dict(row[part]) for part in JOB_SECTIONS if part in row}
    model = data["model"]
    if "hf_config" in model:
        model["hf_config"] = str(ROOT / model["hf_config"])
    return Job.from_dict(data)


def megatron_flops(model, global_batch: int) -> float:
    """FLOPs of one step as Megatron-Core counts them for its TFLOP/s log (megatron/training/training.py,
    num_floating_point_operations, transformer_flops): 3 passes x 2 FLOPs a multiply-add over every GEMM, causal
    attention (half the score matrix), the logits once, routers and norms not counted."""
    if model.attention_kind != "standard":
        raise ValueError("megatron_flops covers multi-head / grouped-query attention only")
    h, layers, s, vocab = model.hidden, model.layers, model.seq_len, model.vocab
    query = model.head_dim_ * model.heads
    key = model.head_dim_ * model.kv_heads_
    gemms = 3 if model.mlp == "swiglu" else 2
    moe_layers = model.moe_layers
    dense_layers = layers - moe_layers
    mlp = (
        6
        * h
        * (
            model.ffn_ * gemms * dense_layers
            + model.expert_ffn_ * model.experts_per_token * gemms * moe_layers
            + model.shared_experts * model.shared_expert_ffn_ * gemms * moe_layers
        )
    )
    attention = 6 * (h * (query + 2 * key) + query * s / 2 * 2 + query * h) * layers
    logits = 6 * h * vocab
    return global_batch * s * (mlp + attention + logits)


def measured_step_s(row: dict, job: Job) -> tuple[float, str]:
    """The step time the published figure implies, and how it was had."""
    measured, count = row["measured"], job.cluster.count
    tokens = row["batch"]["global_batch"] * job.model.seq_len
    if "step_s" in measured:
        return float(measured["step_s"]), "published step time"
    if "tokens_per_s_per_gpu" in measured:
        return tokens / (measured["tokens_per_s_per_gpu"] * count), "global batch tokens / (tokens/s per GPU x GPUs)"
    if "tokens_per_s" in measured:
        return tokens / measured["tokens_per_s"], "global batch tokens / tokens/s"
    if "tflops_per_gpu" in measured:
        if measured.get("convention") != "megatron-core":
            raise ValueError(f"unknown FLOP convention {measured.get('convention')!r}")
        flops = megatron_flops(job.model, row["batch"]["global_batch"])
        return flops / (measured["tflops_per_gpu"] * 1e12 * count), "Megatron-Core FLOPs of a step / (TFLOP/s x GPUs)"
    raise ValueError("the row's measured figure is none of step_s, tokens_per_s(_per_gpu), tflops_per_gpu")


def first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def evaluate(rows: list[dict]) -> list[dict]:
    catalog = load_catalog()
    out = []
    for row in rows:
        entry = {"id": row["id"], "source_group": row["source_group"], "source": row["source"]["url"]}
        if row.get("skip"):
            out.append({**entry, "skipped": row["skip"], "measured": row["measured"]})
            continue
        try:
            job, _notes = job_of(row).resolve(catalog)
            result = estimate(job, catalog)
        except Exception as err:  # a refusal (SpecError) or a failure: reported in one line, never a crash
            out.append({**entry, "refused": f"{type(err).__name__}: {first_line(err)}"})
            continue
        if result["time"]["step_s"] is None:
            out.append({**entry, "refused": f"no modelled step time: {unknown_figures(job, catalog)}"})
            continue
        measured, how = measured_step_s(row, job)
        modelled = float(result["time"]["step_s"])
        record = {
            **entry,
            "layout": layout_of(job),
            "measured_step_s": measured,
            "measured_from": how,
            "modelled_step_s": modelled,
            "error": modelled / measured - 1,
            "modelled_range_s": result["time"].get("step_s_range"),
            "fits": result["memory"].get("fits"),
            "breakdown": {k: float(v) for k, v in (result["time"].get("breakdown") or {}).items()},
        }
        check = convention_check(row, job, measured)
        if check is not None:
            record["megatron_flops_check"] = check
        out.append(record)
    return out


def unknown_figures(job: Job, catalog) -> str:
    """Which of the figures the step-time model needs the accelerator's catalog row leaves unknown."""
    acc = catalog.accelerator(job.cluster.accelerator)
    figures = {
        f"{compute_dtype(job.precision.mode)} peak": acc.peak_flops(compute_dtype(job.precision.mode)),
        "memory_bw_bytes_per_s": acc.memory_bw_bytes_per_s,
        "link_bw_bytes_per_s": job.cluster.intra_node_bw_bytes_per_s or acc.link_bw_bytes_per_s,
    }
    missing = [name for name, value in figures.items() if value is None]
    return f"the catalog row of {acc.name} has {', '.join(missing) or 'no figure missing'} unknown"


def layout_of(job: Job) -> str:
    p = job.parallel
    parts = [f"{job.cluster.count}x{job.cluster.accelerator}", f"tp{p.tp}", f"pp{p.pp}"]
    parts += [f"vpp{p.vpp}"] if p.vpp > 1 else []
    parts += [f"cp{p.cp}"] if p.cp > 1 else []
    parts += [f"ep{p.ep}", f"dp{p.dp}", f"zero{p.zero}", f"gbs{job.batch.global_batch}", f"mbs{job.batch.micro_batch}"]
    parts += [f"seq{job.model.seq_len}", job.moe.dispatcher]
    parts += ["fp8"] if job.precision.fp8 else []
    return " ".join(parts)


def convention_check(row: dict, job: Job, measured_s: float) -> dict | None:
    """Where a source publishes a step time and a TFLOP/s beside it, the TFLOP/s Megatron-Core's count implies from
    that step: how far it lies from the published one says whether `megatron_flops` is the source's count."""
    published = row["measured"].get("also", {}).get("tflops_per_gpu")
    if published is None or "step_s" not in row["measured"] or job.model.attention_kind != "standard":
        return None
    implied = megatron_flops(job.model, row["batch"]["global_batch"]) / (measured_s * job.cluster.count) / 1e12
    return {"published_tflops": published, "implied_tflops": implied, "deviation": implied / published - 1}


def summary(results: list[dict]) -> dict:
    done = [r for r in results if "error" in r]
    errors = [abs(r["error"]) for r in done]
    groups = {}
    for group in sorted({r["source_group"] for r in done}):
        errs = [abs(r["error"]) for r in done if r["source_group"] == group]
        groups[group] = {"rows": len(errs), "mean_abs_error": statistics.mean(errs), "max_abs_error": max(errs)}
    checks = [abs(r["megatron_flops_check"]["deviation"]) for r in done if "megatron_flops_check" in r]
    return {
        "rows": len(done),
        "refused": sum("refused" in r for r in results),
        "skipped": sum("skipped" in r for r in results),
        "mean_abs_error": statistics.mean(errors) if errors else None,
        "median_signed_error": statistics.median(r["error"] for r in done) if done else None,
        "max_abs_error": max(errors) if errors else None,
        "by_source_group": groups,
        "megatron_flops_check_max_abs_deviation": max(checks) if checks else None,
        "modelled_not_fitting": sum(r.get("fits") is False for r in done),
    }


def git_commit() -> str:
    run = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return run.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default=str(REFERENCE))
    parser.add_argument("--json", default=str(RESULTS), help="where the results go (default: %(default)s)")
    args = parser.parse_args()
    rows = json.loads(Path(args.reference).read_text())["rows"]
    results = evaluate(rows)
    for r in results:
        if "skipped" in r:
            print(f"{r['id']:58} skipped: {r['skipped']}")
        elif "refused" in r:
            print(f"{r['id']:58} refused: {r['refused']}")
        else:
            print(
                f"{r['id']:58} measured {r['measured_step_s']:7.2f} s  modelled {r['modelled_step_s']:7.2f} s  "
                f"{r['error']:+7.1%}  [{r['layout']}]"
            )
    figures = summary(results)
    prov = provenance()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "date": prov["date"],
                "commit": git_commit(),
                "machine": platform.node(),
                "platform": prov["machine"],
                "reference": str(Path(args.reference).resolve().relative_to(ROOT)),
                "fitted": None,
                "definition": "error = modelled step_s / measured step_s - 1, the catalog as shipped, nothing fitted",
                "summary": figures,
                "rows": results,
            },
            indent=1,
        )
        + "\n"
    )
    print()
    for group, fig in figures["by_source_group"].items():
        print(
            f"  {group:28} rows {fig['rows']:2}  mean |error| {100 * fig['mean_abs_error']:5.1f} %  "
            f"max {100 * fig['max_abs_error']:5.1f} %"
        )
    if figures["megatron_flops_check_max_abs_deviation"] is not None:
        print(
            f"  Megatron-Core FLOP count against the step-time table's TFLOP/s: max deviation "
            f"{100 * figures['megatron_flops_check_max_abs_deviation']:.1f} %"
        )
    print(f"  estimated rows whose memory estimate says they do not fit (they ran): {figures['modelled_not_fitting']}")
    print(f"  skipped (not estimable): {figures['skipped']}")
    print()
    mean = figures["mean_abs_error"]
    worst = figures["max_abs_error"]
    print(f"moe_rows: {figures['rows']}")
    print(f"moe_mean_abs_error_pct: {100 * mean:.1f}" if mean is not None else "moe_mean_abs_error_pct: nan")
    print(f"moe_max_abs_error_pct: {100 * worst:.1f}" if worst is not None else "moe_max_abs_error_pct: nan")
    print(f"moe_refused: {figures['refused']}")


if __name__ == "__main__":
    main()
