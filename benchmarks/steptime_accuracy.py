"""The step-time model against measured training runs: predicted iteration time beside the measured one.

    .venv/bin/python benchmarks/steptime_accuracy.py [--json results.json]

Replays ../shared/reference/measured-throughput.json (published runs with their layouts and sources). Like is
compared with like: a published TFLOP/s per GPU is turned into the iteration time it implies under the
source's own FLOP convention (Megatron 2021's hardware count, PaLM's 6N + 12·L·s·d per token), a published
step time is taken as it is; the model's `step_s` is compared with that time, error = (model − measured) /
measured. Also: the share of same-model layout pairs the model orders as measured. A row the model cannot
express (context parallelism, say) is listed as refused with the reason, not dropped silently.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.estimate.params import count_params  # noqa: E402
from toolkit.estimate.steptime import hardware_for, step_time  # noqa: E402
from toolkit.specs import Job, SpecError, load_catalog  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured-throughput.json"


def job_of(row: dict) -> Job:
    """The row's run as a Job (every field the source leaves out is in the row's `assumed`)."""
    cluster = dict(row["cluster"])
    gbps = cluster.pop("inter_node_gbps_per_gpu", None)
    if gbps is not None:
        cluster["inter_node_bw_bytes_per_s"] = gbps * 1e9 / 8 * cluster.get("gpus_per_node", 8)
    parallel = {k: v for k, v in row["parallel"].items() if k != "cp" or v not in (None, 1)}
    model = dict(row["model"])
    model.setdefault("tie_embeddings", row.get("assumed", {}).get("model.tie_embeddings", "").startswith("true"))
    batch = dict(row["batch"])
    replicas = batch["micro_batch"] * parallel.get("dp", 1)
    if batch["global_batch"] % replicas:     # OPT: 2M tokens on 124 replicas; the nearest whole batch, said below
        batch["global_batch"] = round(batch["global_batch"] / replicas) * replicas
    return Job.from_dict({"model": model, "batch": batch, "parallel": parallel, "memory": row["memory"],
                          "precision": row["precision"], "optimizer": {"name": row["optimizer"]}, "cluster": cluster})


def measured_step_s(row: dict, job: Job) -> float:
    """The iteration time the published figure implies, under the source's own convention."""
    measured = row["measured"]
    if measured["kind"] == "step_s":
        return float(measured["value"])
    m, b = job.model, row["batch"]["global_batch"]                   # the published batch
    s, L, h, V = m.seq_len, m.layers, m.hidden, m.vocab
    convention = measured["convention"]
    if convention == "narayanan2021":
        flops = 96 * b * s * L * h ** 2 * (1 + s / (6 * h) + V / (16 * L * h))
    elif convention == "palm_noncausal":
        n = count_params(m).total
        flops = b * s * (6 * n + 12 * L * s * m.heads * m.head_dim_)
    else:
        raise ValueError(f"unknown convention {convention}")
    return flops / (measured["value"] * 1e12 * job.cluster.count)


def evaluate(rows: list[dict]) -> list[dict]:
    catalog = load_catalog()
    out = []
    for row in rows:
        entry = {"id": row["id"], "group": row["source_group"]}
        try:
            job, _ = job_of(row).resolve(catalog)
        except SpecError as err:
            out.append(dict(entry, refused=str(err)))
            continue
        st = step_time(job, hardware_for(job, catalog))
        measured = measured_step_s(row, job)
        predicted = float(st.step_s)
        if job.batch.global_batch != row["batch"]["global_batch"]:       # compare per sequence, like with like
            predicted *= row["batch"]["global_batch"] / job.batch.global_batch
            entry["note"] = f"global batch {row['batch']['global_batch']} -> {job.batch.global_batch} (whole replicas)"
        out.append(dict(entry, measured_s=measured, predicted_s=predicted, error=(predicted - measured) / measured,
                        model=f"{job.model.layers}x{job.model.hidden}", breakdown={k: float(v) for k, v in
                                                                                  st.breakdown().items()}))
    return out


def ordered_pairs(results: list[dict]) -> tuple[int, int]:
    """Same-model pairs (same source group and model shape) whose measured order the model keeps."""
    kept = total = 0
    done = [r for r in results if "error" in r]
    for a, b in itertools.combinations(done, 2):
        if a["group"] != b["group"] or a["model"] != b["model"] or a["measured_s"] == b["measured_s"]:
            continue
        total += 1
        kept += (a["measured_s"] < b["measured_s"]) == (a["predicted_s"] < b["predicted_s"])
    return kept, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--reference", default=str(REFERENCE))
    args = parser.parse_args()
    rows = json.loads(Path(args.reference).read_text())["rows"]
    results = evaluate(rows)
    print(f"{'run':40} {'measured s':>11} {'model s':>9} {'error':>8}")
    for r in results:
        if "refused" in r:
            print(f"{r['id']:40} refused: {r['refused']}")
        else:
            print(f"{r['id']:40} {r['measured_s']:11.3f} {r['predicted_s']:9.3f} {r['error']:+8.1%}  {r.get('note', '')}")
    errors = [abs(r["error"]) for r in results if "error" in r]
    kept, total = ordered_pairs(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print()
    print(f"rows: {len(errors)} of {len(results)} (refused: {len(results) - len(errors)})")
    print(f"mean |error|: {100 * statistics.mean(errors):.1f} %")
    print(f"median signed error: {100 * statistics.median(r['error'] for r in results if 'error' in r):+.1f} %")
    print(f"max |error|: {100 * max(errors):.1f} %")
    print(f"same-model pairs in measured order: {kept} of {total}")


if __name__ == "__main__":
    main()
