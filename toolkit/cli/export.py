"""`toolkit export`: the job as one launch file for a cluster (--to), or a training run as a Hugging Face folder
(--hf RUN OUT)."""

from __future__ import annotations

import sys

from ..specs import SpecError, load_catalog
from .job_flags import TRAIN_OVERRIDES, add_job_args, training_job

__all__ = ["add_export_parser", "cmd_export"]


def add_export_parser(sub) -> None:
    """`export`: the job as one launch file for a cluster, or (--hf) a training run as a Hugging Face folder."""
    export = sub.add_parser(
        "export",
        help="write the job as one file a cluster launches: an accelerate config, a "
        "torchrun or SLURM script, or DeepSpeed's JSON; or, with --hf RUN, a run as a Hugging Face folder",
    )
    add_job_args(export, TRAIN_OVERRIDES)
    export.add_argument("--to", metavar="{accelerate,torchrun,slurm,deepspeed}")
    export.add_argument(
        "--hf",
        metavar="RUN",
        help="a `toolkit train --out` folder: write its newest weights, config and tokenizer as a Hugging Face "
        "model folder (toolkit export --hf RUN OUT)",
    )
    export.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="machines (default: the job's devices / per node; --gpus-per-node G sets the machines' size)",
    )
    export.add_argument("--out", metavar="DIR", help="folder to write the one file (or the Hugging Face folder) into")
    export.add_argument("folder", nargs="?", metavar="OUT", help="with --hf: the folder to write, as --out")


def cmd_export(args) -> int:
    from ..export.cluster import export_job

    if args.hf:
        return _export_hf(args)
    if not args.to:
        raise SpecError(
            "",
            None,
            "give --to accelerate|torchrun|slurm|deepspeed (a launch file), or --hf RUN (a Hugging Face folder)",
        )
    if args.folder:
        raise SpecError("", None, f"a folder as a word ({args.folder!r}) goes with --hf RUN; with --to give --out DIR")
    if not args.out:
        raise SpecError("", None, "give the folder to write the file into: --out DIR")
    catalog = load_catalog(*args.catalog)
    done = export_job(training_job(args, catalog), args.to.lower(), args.out, args.nodes, catalog=catalog)
    for warning in done.warnings:
        print(f"toolkit export: warning: {warning}", file=sys.stderr)
    print(f"wrote {done.path}\n{done.command}")
    return 0


def _export_hf(args) -> int:
    """`export --hf RUN OUT`: the run checked (toolkit.export.hf), its weights read as generate reads them
    (toolkit.serve.run), then written as a Hugging Face folder."""
    from ..export.hf import check_run, write_hf_folder
    from ..serve.run import run_weights

    if args.to:
        raise SpecError("--to", args.to, "give --to (a launch file) or --hf (a Hugging Face folder), not both")
    if args.out and args.folder and args.out != args.folder:
        raise SpecError("--out", args.out, f"and OUT {args.folder!r} differ; give the folder once")
    out = args.out or args.folder
    if not out:
        raise SpecError("", None, "give the folder to write: toolkit export --hf RUN OUT (or --out OUT)")
    job = check_run(args.hf)
    done = write_hf_folder(args.hf, job, run_weights(args.hf, job), out)
    print(f"wrote {done.path}: {', '.join(done.files)}")
    for note in done.notes:
        print(f"  note: {note}")
    print(f'load: transformers.AutoModelForCausalLM.from_pretrained("{done.path}")')
    return 0
