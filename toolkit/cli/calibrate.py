"""`toolkit calibrate`: measure this machine and write a catalog profile (toolkit.calibrate), kept apart from
cli.py's job commands. `toolkit compare --run DIR --catalog profile.yaml` then models a run with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..specs import Job, SpecError, load_catalog
from ..specs.yamlio import check_output_folder
from .job_flags import add_job_args, job_from_args

__all__ = ["add_calibrate_parser", "cmd_calibrate"]


def add_calibrate_parser(sub) -> argparse.ArgumentParser:
    cal = sub.add_parser(
        "calibrate",
        help="measure matmuls, memory bandwidth, per-op cost and collectives here; "
        "write a catalog row the step-time model can use",
        description="Measure on N gloo ranks at once (matmuls at the job's shapes and dtype, or a "
        "sweep without a job), and write an accelerator row with the figures and "
        "their source. Then: toolkit compare --run DIR --catalog PROFILE.",
    )
    cal.add_argument("--nproc", metavar="N", type=int, default=1, help="ranks measuring at once (as in training)")
    cal.add_argument("--out", metavar="PROFILE.yaml", required=True, help="where to write the profile")
    cal.add_argument(
        "--step-s",
        metavar="S",
        type=float,
        help="a step you measured (seconds) of the job given by --config or its flags, on a catalog accelerator: "
        "the profile scales every step modelled on that accelerator to your stack (no measuring here)",
    )
    cal.add_argument(
        "--measured",
        metavar="RUN_OR_LOG",
        action="append",
        help="as --step-s, from a `toolkit train` run folder (its job and median step), or a Megatron, torchtitan or "
        "llm-foundry training log (its median timed step; the job from --config or its flags); repeat it with runs "
        "of two or more layouts to scale compute and collectives apart",
    )
    add_job_args(cal)
    cal.add_argument(
        "--gpu-only",
        action="store_true",
        help="on a GPU host, measure only its GPU, not the CPU cores: the job's kernels' rates, and "
        "what the GPU holds beyond the tensors (CUDA context, cuBLAS workspaces, allocator "
        "fragmentation) from a few steps of the job's blocks",
    )
    return cal


def cmd_calibrate(args) -> int:
    from ..calibrate import calibrate

    if args.nproc < 1:
        raise SpecError("--nproc", args.nproc, "must be 1 or more")
    check_output_folder("--out", args.out)
    out = Path(args.out)
    import torch

    if torch.cuda.is_available() and not args.gpu_only:  # (not silently: CPU figures applied to GPUs mislead)
        print(
            "calibrate times this host's CPU cores over gloo for its first row; the GPU gets a row of its own, "
            "measured on the device (--gpu-only: that row alone); NCCL collectives are not calibrated yet",
            file=sys.stderr,
        )
    if args.step_s is not None or args.measured:
        return _from_a_measured_step(args, out)
    job = None
    if args.config:
        job, _notes = Job.from_yaml(args.config).resolve(load_catalog())
    profile = calibrate(job, args.nproc, out, gpu_only=args.gpu_only)
    for row in profile["accelerators"]:
        print(_row_line(row))
    print(
        f"written to {out}; use it with: toolkit compare --run DIR --catalog {out}, or toolkit estimate --catalog {out}"
    )
    return 0


def _from_layouts(args, catalog, out: Path) -> int:
    """`--measured RUN --measured RUN ...`: toolkit run folders of several layouts of one accelerator."""
    import yaml

    from ..calibrate.run_scale import layouts_calibration_row, measured_step_of_run

    runs = []
    for folder in args.measured:
        job, step_s = measured_step_of_run(folder)
        runs.append((job.resolve(catalog)[0], step_s))
    row = layouts_calibration_row(runs, catalog)
    out.write_text(f"# {row['source']}\n" + yaml.safe_dump({"accelerators": [row]}, sort_keys=False, width=120))
    print(f"{row['name']}: {row['source']}; every step modelled on it with --catalog {out} is scaled so")
    return 0


def _from_a_log(args, catalog):
    """The job from --config or its flags and the median step of the log at --measured."""
    from ..calibrate.log_step import step_s_of_log

    job = job_from_args(args, catalog)
    resolved, _notes = job.resolve(catalog)
    tokens = resolved.batch.global_batch * resolved.model.seq_len
    step_s, framework, lines = step_s_of_log(Path(args.measured[0]).read_text(errors="replace"), tokens,
                                             resolved.cluster.count)  # fmt: skip
    print(
        f"{args.measured[0]}: {framework} log, median of {lines} timed lines after the warm-up: {step_s:.4g} s a step"
    )
    return job, step_s


def _from_a_measured_step(args, out: Path) -> int:
    """`--step-s` / `--measured`: a profile row that scales the accelerator's modelled steps to the user's stack."""
    import yaml

    from ..calibrate.run_scale import measured_step_of_run, step_calibration_row

    catalog = load_catalog(*args.catalog)
    if args.measured and len(args.measured) > 1:  # several layouts: compute and collectives apart
        return _from_layouts(args, catalog, out)
    if args.measured and Path(args.measured[0]).is_file():  # another framework's log
        job, step_s = _from_a_log(args, catalog)
    elif args.measured:
        job, step_s = measured_step_of_run(args.measured[0])
    else:
        job, step_s = job_from_args(args, catalog), args.step_s
    resolved, _notes = job.resolve(catalog)
    row = step_calibration_row(resolved, catalog, step_s)
    out.write_text(f"# {row['source']}\n" + yaml.safe_dump({"accelerators": [row]}, sort_keys=False, width=120))
    cal = row["step_calibration"]
    print(
        f"{row['name']}: your step {cal['measured_step_s']:.4g} s, modelled {cal['modelled_step_s']:.4g} s: every step "
        f"modelled on {row['name']} with --catalog {out} is x{cal['scale']:.3f}, and its likely range is that of "
        "runs calibrated on one step (docs/check.md)"
    )
    return 0


def _row_line(row: dict) -> str:
    """One line of what a profile row measured: the CPU's rates, or a GPU's rates and memory beyond the tensors."""
    if row.get("vendor") != "measured":  # a GPU's row (toolkit.calibrate.device)
        terms, a, gib = row["device_memory"], row["assumptions"], 2**30
        return (
            f"{row['name']}: matmuls at {a['gemm_fraction']:.0%} of peak (half rate at {a['gemm_half_size']:.0f}), "
            f"attention {a['attention_fraction']:.0%}, element-wise {row['memory_bw_bytes_per_s'] / 1e9:.0f} GB/s; "
            f"CUDA context {terms['context_bytes'] / gib:.2f} GiB, cuBLAS workspaces "
            f"{terms['workspace_bytes'] / 2**20:.0f} MiB, cached blocks {terms['fragmentation']:.1%} of the pool "
            f"({terms['fragmentation_expandable']:.1%} with expandable segments)"
        )
    rate = max(v for v in row["peak_tflops"].values() if not isinstance(v, str))
    link = row["link_bw_bytes_per_s"]
    return (
        f"{row['name']}: matmuls {rate * 1e3:.1f} GFLOP/s, memory {row['memory_bw_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"per-op {row['assumptions']['op_overhead_s'] * 1e6:.1f} µs"
        + (
            f", all-reduce {link / 2 / 1e9:.2f} GB/s and {row['assumptions']['latency_intra_s'] * 1e6:.0f} µs a step"
            if not isinstance(link, str)
            else ""
        )
    )
