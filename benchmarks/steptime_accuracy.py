"""The step-time model against measured training runs: predicted iteration time beside the measured one.

    .venv/bin/python benchmarks/steptime_accuracy.py [--json results.json]

Replays benchmarks/reference/ (published runs with their layouts and sources, each row's source inside it). Like is
compared with like: a published TFLOP/s per GPU is turned into the iteration time it implies under the
source's own FLOP convention (Megatron 2021's hardware count, PaLM's 6N + 12·L·s·d per token), a published
step time is taken as it is; the model's `step_s` is compared with that time, error = (model − measured) /
measured. Also: the share of same-model layout pairs the model orders as measured. A row the model cannot
express is listed as refused with the reason, not dropped silently. Then the self-calibration loop on this
machine (skip it with --no-runs): the README's small GPT trained on 1 and 2 ranks in several layouts, `toolkit
calibrate` with each run's job on as many ranks, and `toolkit compare --run --catalog` of modelled against
measured median step.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.estimate.hardware import hardware_for  # noqa: E402
from toolkit.estimate.params import count_params  # noqa: E402
from toolkit.estimate.steptime import step_time  # noqa: E402
from toolkit.specs import Job, SpecError, load_catalog  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from band_math import loso_coverage, new_source_band, one_row_calibrated
from provenance import provenance  # noqa: E402

REFERENCE = Path(__file__).resolve().parent / "reference" / "measured-throughput.json"
"""The project's reference runs, kept in the repository (their sources are in each row), so a clone reproduces
every figure."""
SOURCES = {"fms-fsdp-compile": "fms-fsdp", "fms-fsdp-eager": "fms-fsdp"}
"""Source groups that are one publication (a table published twice): left out together."""


def source_of(row: dict) -> str:
    group = row.get("source_group") or row.get("group")
    return "torchtune" if group.startswith("torchtune") else SOURCES.get(group, group)


THROUGHPUT_KINDS = ("step_s", "tflops_per_gpu", "tokens_per_s_per_gpu")


def load_rows(reference: Path) -> list[dict]:
    """The throughput rows of the reference file and of every file in measured/ beside it (memory rows skipped).
    A row whose recompute the source leaves out takes its `fallback`, said in its note."""
    rows = json.loads(reference.read_text())["rows"]
    for extra in sorted((reference.parent / "measured").glob("*.json")):
        rows += json.loads(extra.read_text())["rows"]
    out = []
    for row in rows:
        if row["measured"]["kind"] not in THROUGHPUT_KINDS:
            continue
        if row["memory"].get("recompute") is None and "fallback" in row:
            row = {**row, "memory": {**row["memory"], "recompute": row["fallback"]["memory.recompute"]}}
        out.append(row)
    return out


CORRECTIONS = {
    "opt175b-s2.4-992": (
        {"batch": {"micro_batch": 8}, "model": {"dropout": 0.1}},
        "micro-batch 1 -> 8, dropout 0.1: metaseq's OPT launcher (metaseq/launcher/opt_baselines.py) "
        "trains with --update-freq 1 and --batch-size the replica's whole share of the batch, "
        "--dropout 0.1",
    ),
}
"""Fields a row's own source contradicts, with that source: applied over the row, and said beside its result."""


def job_of(row: dict) -> Job:
    """The row's run as a Job (every field the source leaves out is in the row's `assumed`)."""
    fixes = CORRECTIONS.get(row["id"], ({}, ""))[0]
    row = {**row, **{part: {**row[part], **fields} for part, fields in fixes.items()}}
    cluster = dict(row["cluster"])
    gbps = cluster.pop("inter_node_gbps_per_gpu", None)
    if gbps is not None:
        cluster["inter_node_bw_bytes_per_s"] = gbps * 1e9 / 8 * cluster.get("gpus_per_node", 8)
    parallel = {k: v for k, v in row["parallel"].items() if k != "cp" or v not in (None, 1)}
    if "-hsdp-" in row["id"]:  # fms-fsdp's HSDP: shard within the 8-GPU node, replicate across nodes
        parallel["dp_replicate"] = row["cluster"]["count"] // row["cluster"].get("gpus_per_node", 8)
    model = dict(row["model"])
    model.setdefault("tie_embeddings", row.get("assumed", {}).get("model.tie_embeddings", "").startswith("true"))
    batch = dict(row["batch"])
    replicas = batch["micro_batch"] * parallel.get("dp", 1)
    if batch["global_batch"] % replicas:  # OPT: 2M tokens on 124 replicas; the nearest whole batch, said below
        batch["global_batch"] = round(batch["global_batch"] / replicas) * replicas
    finetune = {k: v for k, v in row.get("finetune", {}).items() if k in ("method", "rank", "targets")}
    # torchtune's rows say whether they compiled; fms-fsdp's README table of 2024-05-09 is "updated with compile"
    compiled = bool(row.get("framework", {}).get("torch_compile")) or row["source_group"] == "fms-fsdp-compile"
    return Job.from_dict(
        {
            "model": model,
            "batch": batch,
            "parallel": parallel,
            "memory": row["memory"],
            "precision": row["precision"],
            "optimizer": {"name": row["optimizer"]},
            "cluster": cluster,
            "finetune": finetune,
            "training": {"compile": compiled},
        }
    )


def measured_step_s(row: dict, job: Job) -> float:
    """The iteration time the published figure implies, under the source's own convention."""
    measured = row["measured"]
    if measured["kind"] == "step_s":
        return float(measured["value"])
    if measured["kind"] == "tokens_per_s_per_gpu":
        return row["batch"]["global_batch"] * job.model.seq_len / (measured["value"] * job.cluster.count)
    m, b = job.model, row["batch"]["global_batch"]  # the published batch
    s, L, h, V = m.seq_len, m.layers, m.hidden, m.vocab
    convention = measured["convention"]
    if convention == "narayanan2021":
        flops = 96 * b * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    elif convention == "palm_noncausal":
        n = count_params(m).total
        flops = b * s * (6 * n + 12 * L * s * m.heads * m.head_dim_)
    else:
        raise ValueError(f"unknown convention {convention}")
    return flops / (measured["value"] * 1e12 * job.cluster.count)


def evaluate(rows: list[dict], sustained: float | None = None) -> list[dict]:
    """Each row modelled against its measurement; `sustained` replaces the kernel profiles' sustained_fraction
    (the one figure fitted on training runs) where given."""
    catalog = load_catalog()
    out = []
    for row in rows:
        entry = {"id": row["id"], "group": row["source_group"], "source": source_of(row)}
        try:
            job, _ = job_of(row).resolve(catalog)
        except SpecError as err:
            out.append(dict(entry, refused=str(err)))
            continue
        hw = hardware_for(job, catalog)
        entry["fitted"] = hw.kernels is not None  # its step depends on the fitted figure
        if sustained is not None and hw.kernels is not None:
            hw = dataclasses.replace(hw, kernels=dataclasses.replace(hw.kernels, sustained_fraction=sustained))
        st = step_time(job, hw)
        measured = measured_step_s(row, job)
        predicted = float(st.step_s)
        notes = [CORRECTIONS[row["id"]][1]] if row["id"] in CORRECTIONS else []
        if job.batch.global_batch != row["batch"]["global_batch"]:  # compare per sequence, like with like
            predicted *= row["batch"]["global_batch"] / job.batch.global_batch
            notes.append(f"global batch {row['batch']['global_batch']} -> {job.batch.global_batch} (whole replicas)")
        if notes:
            entry["note"] = "; ".join(notes)
        out.append(
            dict(
                entry,
                measured_s=measured,
                predicted_s=predicted,
                error=(predicted - measured) / measured,
                model=f"{job.model.layers}x{job.model.hidden}",
                breakdown={k: float(v) for k, v in st.breakdown().items()},
            )
        )
    return out


def source_score(results: list[dict]) -> float:
    """Mean over sources of each source's mean |log(modelled / measured)|: every source weighs alike, however
    many rows it has."""
    by_source: dict[str, list[float]] = {}
    for r in results:
        if "error" in r and r["fitted"]:
            by_source.setdefault(r["source"], []).append(abs(math.log1p(r["error"])))
    return statistics.mean(statistics.mean(v) for v in by_source.values()) if by_source else 0.0


FIT_GRID = [round(0.5 + 0.005 * i, 3) for i in range(101)]
"""sustained_fraction's candidates, 0.50 to 1.00."""


def fit_sustained(rows: list[dict]) -> float:
    """The sustained_fraction that scores `rows` best (source_score), over FIT_GRID."""
    return min(FIT_GRID, key=lambda x: source_score(evaluate(rows, x)))


def leave_one_source_out(rows: list[dict]) -> tuple[list[dict], dict[str, float]]:
    """Each source's rows modelled with sustained_fraction fitted on the other sources only: what a source the
    model never saw would read. Returns the results and the figure each source was scored with."""
    out, fitted = [], {}
    for source in sorted({source_of(r) for r in rows}):
        held = [r for r in rows if source_of(r) == source]
        fitted[source] = fit_sustained([r for r in rows if source_of(r) != source])
        out += evaluate(held, fitted[source])
    return out, fitted


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


SMALL_GPT = [
    "--layers",
    "4",
    "--hidden",
    "256",
    "--heads",
    "8",
    "--vocab",
    "256",
    "--seq",
    "128",
    "--micro-batch",
    "2",
    "--precision",
    "fp32",
    "--global-batch",
    "16",
    "--steps",
    "12",
    "--warmup",
    "2",
    "--no-progress",
    "--num-workers",
    "0",
    "--checkpoint-every",
    "0",
]
SELF_CALIBRATION = [
    ("1 rank", [], 1),
    ("1 rank, full recompute", ["--recompute", "full"], 1),
    ("1 rank, micro-batch 4", ["--micro-batch", "4"], 1),
    ("1 rank, ZeRO-3 (FSDP2 over one rank)", ["--zero", "3"], 1),
    ("2 ranks, dp (DDP)", [], 2),
    ("2 ranks, pp 2 (1F1B)", ["--pp", "2"], 2),
    ("2 ranks, ZeRO-2 (FSDP2)", ["--zero", "2"], 2),
    ("2 ranks, tp 2", ["--tp", "2"], 2),
]
"""The loop on this machine: train the README's small GPT, calibrate with its job on as many ranks, compare."""


def self_calibration(work: Path, repeats: int) -> list[tuple[str, int, float, float]]:
    """(layout, ranks, median error, measured spread) of each SELF_CALIBRATION layout over `repeats` loops of
    train, calibrate, compare. One loop is one sample of a shared machine: its measured step and its calibrated
    rates each move by several per cent from one minute to the next, so each layout's error is the median of
    its loops, and the spread of its measured steps ((max − min) / median) says how much of the error is the
    machine's own noise. The loops go round the layouts (every layout once, then again), so a slow spell of the
    machine lands on several layouts' single loops, not on one layout's every loop."""
    import subprocess

    from toolkit.trace.report import compare_run

    toolkit = [sys.executable, "-m", "toolkit.cli"]
    errors = {i: [] for i in range(len(SELF_CALIBRATION))}
    measured = {i: [] for i in range(len(SELF_CALIBRATION))}
    for k, (i, (name, flags, ranks)) in itertools.product(range(repeats), enumerate(SELF_CALIBRATION)):
        run, profile = work / f"run{i}-{k}", work / f"profile{i}-{k}.yaml"
        subprocess.run(
            [*toolkit, "train", *SMALL_GPT, *flags, "--nproc", str(ranks), "--out", str(run)],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*toolkit, "calibrate", "--nproc", str(ranks), "--config", str(run / "job.yaml"), "--out", str(profile)],
            check=True,
            capture_output=True,
        )
        step = compare_run(run, [profile], trace=False)["time"]["step_s"]
        errors[i].append(step["error"])
        measured[i].append(step["measured"])
        row = yaml.safe_load(profile.read_text())["accelerators"][0]
        matmul_gflops = 1e3 * max(v for v in row["peak_tflops"].values() if isinstance(v, float))
        print(
            f"  {name:28} measured {step['measured']:.3f} s, modelled {step['estimate']:.3f} s, "
            f"{step['error']:+.1%}  (matmuls {matmul_gflops:.0f} GFLOP/s a rank)",
            flush=True,
        )
    out = []
    for i, (name, _flags, ranks) in enumerate(SELF_CALIBRATION):
        spread = (max(measured[i]) - min(measured[i])) / statistics.median(measured[i])
        out.append((name, ranks, statistics.median(errors[i]), spread))
        if repeats > 1:
            print(
                f"  {name:28} median {statistics.median(errors[i]):+.1%}, measured steps spread {spread:.1%}",
                flush=True,
            )
    return out


ONE_CALIBRATION = [
    ("2 ranks, dp (DDP)", []),
    ("2 ranks, ZeRO-2 (FSDP2)", ["--zero", "2"]),
    ("2 ranks, ZeRO-3 (FSDP2)", ["--zero", "3"]),
    ("2 ranks, tp 2", ["--tp", "2"]),
]
"""Layouts trained on 2 ranks and modelled with ONE profile, calibrated once on the DDP job: what the planner does
when it ranks layouts it has not run (calibrate measures every layout's collectives, not only its job's)."""


def one_calibration(work: Path, repeats: int) -> list[tuple[str, float]]:
    """(layout, median error) of each ONE_CALIBRATION run against the model with the DDP job's profile."""
    toolkit = [sys.executable, "-m", "toolkit.cli"]
    from toolkit.trace.report import compare_run

    subprocess.run(
        [*toolkit, "train", *SMALL_GPT, "--steps", "3", "--nproc", "2", "--out", str(work / "base")],
        check=True,
        capture_output=True,
    )
    profile = work / "one-profile.yaml"
    subprocess.run(
        [*toolkit, "calibrate", "--nproc", "2", "--config", str(work / "base" / "job.yaml"), "--out", str(profile)],
        check=True,
        capture_output=True,
    )
    errors: dict[str, list[float]] = {name: [] for name, _f in ONE_CALIBRATION}
    for k, (name, flags) in itertools.product(range(repeats), ONE_CALIBRATION):
        run = work / f"one-{len(errors[name])}-{name.split(',')[1].strip().replace(' ', '_')}-{k}"
        subprocess.run(
            [*toolkit, "train", *SMALL_GPT, *flags, "--nproc", "2", "--out", str(run)], check=True, capture_output=True
        )
        step = compare_run(run, [profile], trace=False)["time"]["step_s"]
        errors[name].append(step["error"])
        print(
            f"  {name:28} measured {step['measured']:.3f} s, modelled {step['estimate']:.3f} s, {step['error']:+.1%}",
            flush=True,
        )
    return [(name, statistics.median(v)) for name, v in errors.items()]


VARIANTS = [
    ("full recompute", {"memory": {"recompute": "full"}}),
    ("per-op recompute (selective-op)", {"memory": {"recompute": "selective-op"}}),
    ("micro-batch 4", {"batch": {"micro_batch": 4}}),
    ("micro-batch 1", {"batch": {"micro_batch": 1}}),
    ("eager attention", {"memory": {"attention": "eager"}}),
]
"""One-rank variants of the small GPT that the planner weighs against each other with one profile."""


def variant_ratios(work: Path, rounds: int = 16) -> list[tuple[str, float, float]]:
    """(variant, measured, modelled) step of each VARIANTS job over the small GPT's, with one profile calibrated
    on the small GPT's job: what the planner does when it ranks layouts on this machine. Each variant trains in
    this process beside the base job, a step of one then a step of the other, `rounds` times (the first three
    dropped), and each side's median is taken: both see the same moments of a shared machine, so their ratio
    keeps little of its noise (a loop of separate runs, above, keeps all of it)."""
    import dataclasses
    import subprocess
    import time

    from toolkit.estimate.report import estimate
    from toolkit.launch.determinism import pinned, rank_threads
    from toolkit.train.loop import Trainer

    toolkit = [sys.executable, "-m", "toolkit.cli"]
    subprocess.run(
        [*toolkit, "train", *SMALL_GPT, "--steps", "3", "--out", str(work / "base")], check=True, capture_output=True
    )
    profile = work / "variant-profile.yaml"
    subprocess.run(
        [*toolkit, "calibrate", "--config", str(work / "base" / "job.yaml"), "--out", str(profile)],
        check=True,
        capture_output=True,
    )
    catalog = load_catalog(profile)
    name = yaml.safe_load(profile.read_text())["accelerators"][0]["name"]
    base = Job.from_yaml(work / "base" / "job.yaml")
    base = dataclasses.replace(base, training=dataclasses.replace(base.training, steps=rounds + 8))

    def modelled_s(job):
        job = job.replace(cluster=dataclasses.replace(job.cluster, accelerator=name))
        return estimate(job.resolve(catalog)[0], catalog)["time"]["step_s"]

    out = []
    threads = rank_threads(1)
    with pinned(threads, "cpu"):
        for label, fields in VARIANTS:
            variant = base
            for section, values in fields.items():
                variant = dataclasses.replace(
                    variant, **{section: dataclasses.replace(getattr(variant, section), **values)}
                )
            pair = [
                Trainer(job, work / f"{label.replace(' ', '_')}-{side}", threads, progress=False)
                for side, job in (("base", base), ("variant", variant))
            ]
            times = [[], []]
            for trainer in pair:
                trainer.loop_began = time.perf_counter()  # (fit() sets it; the steps here are driven one by one)
                trainer.prog.model.train()
            for step in range(3, 3 + rounds):  # (after the steps whose memory a run records)
                for side, trainer in enumerate(pair):
                    began = time.perf_counter()
                    trainer.train_step(step)
                    times[side].append(time.perf_counter() - began)
            for trainer in pair:
                trainer.close()
            measured = statistics.median(times[1][3:]) / statistics.median(times[0][3:])
            predicted = modelled_s(variant) / modelled_s(base)
            print(
                f"  {label:32} measured x{measured:.3f}, modelled x{predicted:.3f}, {predicted / measured - 1:+.1%}",
                flush=True,
            )
            out.append((label, measured, predicted))
    return out


def summary(results: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in results if "error" in r]
    kept, total = ordered_pairs(results)
    by_source = {}
    for src in sorted({r["source"] for r in results}):
        errs = [abs(r["error"]) for r in results if r["source"] == src and "error" in r]
        by_source[src] = {
            "rows": len(errs),
            "mean_abs_error": statistics.mean(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None,
        }
    return {
        "rows": len(errors),
        "refused": len(results) - len(errors),
        "mean_abs_error": statistics.mean(errors),
        "median_signed_error": statistics.median(r["error"] for r in results if "error" in r),
        "max_abs_error": max(errors),
        "pairs_in_order": [kept, total],
        "by_source": by_source,
    }


def write_band(held_out: list[dict]) -> None:
    """Each regime's band into the band file: a catalog GPU's, the 80 % prediction interval of a new source's row
    (band_math.new_source_band: the spread between sources and within them); a run-calibrated one's, the 10th and
    90th percentiles of the one-row-calibrated errors; too few rows, at least ±50 % (the calibrated regime, measured
    by the self-calibration loop on this machine, is kept as it stands)."""
    from toolkit.estimate.band import BAND_FILE

    data = yaml.safe_load(BAND_FILE.read_text())
    fitted = [r for r in held_out if "error" in r and r["fitted"]]
    low, high, centre = new_source_band(fitted)
    data["regimes"]["kernel_profile"].update(
        error_low=round(low, 4), error_high=round(high, 4), centre=round(centre, 4), rows=len(fitted),
        what="catalog GPUs priced from kernel measurements (toolkit/data/kernels.yaml): 80 % of a new source's rows",
    )  # fmt: skip
    assumed = sorted(r["error"] for r in held_out if "error" in r and not r["fitted"])
    deciles = statistics.quantiles(assumed, n=10, method="inclusive") if len(assumed) > 1 else [0.0, 0.0]
    data["regimes"]["assumed"].update(
        error_low=round(min(deciles[0], -0.5), 4), error_high=round(max(deciles[-1], 0.5), 4), rows=len(assumed)
    )
    calibrated = one_row_calibrated(fitted)
    deciles = statistics.quantiles(calibrated, n=10, method="inclusive")
    data["regimes"]["run_calibrated"] = {
        "what": "scaled to one measured step of the same stack (toolkit calibrate --step-s): the visible sources' "
        "rows predicted from another row of their source",
        "error_low": round(deciles[0], 4),
        "error_high": round(deciles[-1], 4),
        "rows": len(calibrated),
    }
    data.update(provenance())
    BAND_FILE.write_text(BAND_HEADER + yaml.safe_dump(data, sort_keys=False, width=120))


BAND_HEADER = """# The step-time model's error band (toolkit/estimate/band.py), WRITTEN BY benchmarks/steptime_accuracy.py
# --write-band from the signed errors (modelled - measured) / measured on the visible sources, each scored leaving
# its own source out: kernel_profile, the 80 % prediction interval of a new source's row (the spread between
# sources and within them, benchmarks/band_math.py); run_calibrated, the 10th and 90th percentiles of rows predicted
# from another row of their source. Do not edit by hand.
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", metavar="PATH", help="write the figures and every row here")
    parser.add_argument("--reference", default=str(REFERENCE))
    parser.add_argument(
        "--no-runs", action="store_true", help="skip the self-calibration runs (about 2 minutes a repeat)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="loops of train, calibrate, compare per layout")
    parser.add_argument("--variants-only", action="store_true", help="of the runs, only the one-profile variants")
    parser.add_argument(
        "--one-calibration-only",
        action="store_true",
        help="of the runs, only the layouts modelled with one profile calibrated on the DDP job",
    )
    parser.add_argument(
        "--write-band",
        action="store_true",
        help="write the held-out error band of each regime "
        "to toolkit/data/steptime_band.yaml (what `toolkit estimate` shows as step_s_range)",
    )
    args = parser.parse_args()
    rows = load_rows(Path(args.reference))
    sustained = fit_sustained(rows)
    results = evaluate(rows, sustained)
    held_out, per_source = leave_one_source_out(rows)
    held = {r["id"]: r for r in held_out}
    print(
        f"sustained_fraction fitted on all visible sources: {sustained}; left out one at a time: "
        + ", ".join(f"{k} {v}" for k, v in per_source.items())
    )
    print(f"{'run':52} {'measured s':>10} {'model s':>9} {'in-sample':>9} {'held-out':>9}")
    for r in results:
        if "refused" in r:
            print(f"{r['id']:52} refused: {r['refused']}")
        else:
            print(
                f"{r['id']:52} {r['measured_s']:10.3f} {r['predicted_s']:9.3f} {r['error']:+9.1%} "
                f"{held[r['id']]['error']:+9.1%}  {r.get('note', '')}"
            )
    looped, ratios, once = [], [], []
    if not args.no_runs:
        import tempfile

        print("\none calibration (the 2-rank DDP job's profile) for every 2-rank layout:")
        with tempfile.TemporaryDirectory() as work:
            once = one_calibration(Path(work), args.repeats)
        if not args.one_calibration_only:
            print("\nself-calibration on this machine (toolkit train, toolkit calibrate, toolkit compare --catalog):")
            with tempfile.TemporaryDirectory() as work:
                looped = [] if args.variants_only else self_calibration(Path(work), args.repeats)
            print("\none profile, 1-rank variants against the small GPT (steps interleaved in one process):")
            with tempfile.TemporaryDirectory() as work:
                ratios = variant_ratios(Path(work))
    inside, outside = summary(results), summary(held_out)
    print("\nby source (held out: the fitted figure refitted without it):")
    for src, fig in outside["by_source"].items():
        ins = inside["by_source"][src]
        print(
            f"  {src:32} rows {fig['rows']:3}  in-sample {100 * ins['mean_abs_error']:5.1f} %  "
            f"held-out {100 * fig['mean_abs_error']:5.1f} % (max {100 * fig['max_abs_error']:.1f} %)"
        )
    if args.write_band:
        write_band(held_out)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    **provenance(),
                    "fitted": {"sustained_fraction": sustained, "left_out": per_source},
                    "in_sample": inside,
                    "held_out": outside,
                    "one_calibration": dict(once) or None,
                    "rows": results,
                    "held_out_rows": held_out,
                },
                indent=1,
            )
            + "\n"
        )
    print()
    print(f"rows: {outside['rows']} of {outside['rows'] + outside['refused']} (refused: {outside['refused']})")
    print(f"median signed error (held-out): {100 * outside['median_signed_error']:+.1f} %")
    print(f"max |error| (held-out): {100 * outside['max_abs_error']:.1f} %")
    print(
        f"same-model pairs in measured order (held-out): {outside['pairs_in_order'][0]} of "
        f"{outside['pairs_in_order'][1]}"
    )
    for ranks in sorted({r for _n, r, _e, _s in looped}):
        worst = max(abs(e) for _n, r, e, _s in looped if r == ranks)
        print(f"self-calibrated max |error|, {ranks} rank(s): {100 * worst:.1f} %")
    if looped:
        print(f"self-calibrated measured-step spread, max: {100 * max(s for *_x, s in looped):.1f} %")
    for name, error in once:
        print(f"one calibration, {name}: {100 * error:+.1f} %")
    if once:
        print(f"one calibration max |error|, 2 ranks: {100 * max(abs(e) for _n, e in once):.1f} %")
    if ratios:
        ratio_errors = [abs(p / m - 1) for _n, m, p in ratios]
        print(f"self-calibrated variant ratio mean |error|: {100 * statistics.mean(ratio_errors):.1f} %")
        print(f"self-calibrated variant ratio max |error|: {100 * max(ratio_errors):.1f} %")
    fitted_rows = [r for r in held_out if "error" in r and r["fitted"]]
    coverage, half_width = loso_coverage(fitted_rows)
    calibrated = one_row_calibrated(fitted_rows)
    print(f"held-out band coverage: {100 * coverage:.0f} %")
    print(f"median band half-width: {100 * half_width:.0f} %")
    print(f"calibrated-on-one-row mean |error|: {100 * statistics.fmean(abs(e) for e in calibrated):.1f} %")
    print(f"in-sample mean |error|: {100 * inside['mean_abs_error']:.1f} %")
    print(f"held-out mean |error|: {100 * outside['mean_abs_error']:.1f} %")


if __name__ == "__main__":
    main()
