"""`toolkit`: estimate a training job, trace it on fake tensors, compare both, browse the catalogs.

    toolkit estimate --model gpt3-175b --tokens 300e9 --gpus 1024xA100-80GB --mfu 0.45 --json
    toolkit trace --model llama2-7b --micro-batch 1 --recompute full --json
    toolkit compare --model gpt2 --micro-batch 4
    toolkit plan --model llama2-70b --offers p5.48xlarge,p4de.24xlarge --objective cost --max-gpus 512
    toolkit doctor --model llama2-7b --gpus 1xA100-80GB
    toolkit pipeline --stages 4 --microbatches 8 --schedule interleaved --vpp 2 --html gantt.html
    toolkit train --layers 4 --hidden 128 --heads 4 --vocab 256 --seq 128 --steps 50 --out runs/demo --nproc 2
    toolkit data prepare notes/*.txt --out data/notes
    toolkit catalog accelerators
    toolkit catalog presets llama2-7b

Bad input never shows a traceback: one line on stderr naming the field, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Literal, get_args, get_origin, get_type_hints

from .calibrate import add_calibrate_parser, cmd_calibrate
from .catalog import cmd_catalog
from .pipeline import add_pipeline_parser, cmd_pipeline
from ..estimate import estimate
from ..format import render_comparison, render_doctor, render_estimate, render_plan
from ..specs import Job, SpecError, load_catalog
from ..specs.errors import MeasurementFailed
from ..specs.job import Batch, Cluster, Cost, Finetune, MemoryOptions, Optimizer, Overlap, Parallel, Precision, Training
from ..specs.axes import AXES
from ..specs.model import ModelSpec
from ..specs.yamlio import check_output_folder, read_yaml

__all__ = ["main", "build_parser"]

# flag -> (section, field, spec class): one table drives argparse help, the job overrides and the
# translation of error messages back to flag names.
_SECTIONS = {"parallel": Parallel, "batch": Batch, "memory": MemoryOptions}
OVERRIDES = {
    "seq": ("model", "seq_len", ModelSpec),
    "layers": ("model", "layers", ModelSpec),
    "hidden": ("model", "hidden", ModelSpec),
    "heads": ("model", "heads", ModelSpec),
    "kv_heads": ("model", "kv_heads", ModelSpec),
    "ffn": ("model", "ffn", ModelSpec),
    "vocab": ("model", "vocab", ModelSpec),
    "mlp": ("model", "mlp", ModelSpec),
    "norm": ("model", "norm", ModelSpec),
    "tie_embeddings": ("model", "tie_embeddings", ModelSpec),
    "dropout": ("model", "dropout", ModelSpec),
    "global_batch": ("batch", "global_batch", Batch),
    "precision": ("precision", "mode", Precision),
    "grad_dtype": ("precision", "grad_dtype", Precision),
    "fp8": ("precision", "fp8", Precision),
    "fp8_all_gather": ("precision", "fp8_all_gather", Precision),
    "optimizer": ("optimizer", "name", Optimizer),
    "momentum": ("optimizer", "momentum", Optimizer),
    "optimizer_impl": ("optimizer", "impl", Optimizer),
    "dp": ("parallel", "dp", Parallel),
    **{axis.name: (axis.section, axis.name, _SECTIONS[axis.section]) for axis in AXES},  # the layout axes' flags
    "stage_layers": ("parallel", "stage_layers", Parallel),
    "partition": ("parallel", "partition", Parallel),
    "schedule": ("parallel", "schedule", Parallel),
    "backend": ("parallel", "backend", Parallel),
    "overlap_grad_reduce": ("overlap", "grad_reduce", Overlap),
    "overlap_param_gather": ("overlap", "param_gather", Overlap),
    "overlap_tp_comm": ("overlap", "tp_comm", Overlap),
    "act_compress": ("memory", "act_compress", MemoryOptions),
    "attention": ("memory", "attention", MemoryOptions),
    "attention_kernel": ("memory", "attention_kernel", MemoryOptions),
    "headroom": ("memory", "headroom_fraction", MemoryOptions),
    "expandable_segments": ("memory", "expandable_segments", MemoryOptions),
    "gpus_per_node": ("cluster", "gpus_per_node", Cluster),
    "offer": ("cost", "offer", Cost),
    "spot": ("cost", "spot", Cost),
    "interruptions": ("cost", "interruptions_per_month", Cost),
    "pue": ("cost", "pue", Cost),
    "kwh_price": ("cost", "energy_price_per_kwh", Cost),
    "grid_co2": ("cost", "grid_kg_co2_per_kwh", Cost),
    "finetune": ("finetune", "method", Finetune),
    "lora_rank": ("finetune", "rank", Finetune),
    "lora_targets": ("finetune", "targets", Finetune),
    "dataset_tokens": ("finetune", "dataset_tokens", Finetune),
    "epochs": ("finetune", "epochs", Finetune),
    "workload": ("", "workload", Job),
    "tokens": ("", "tokens", Job),
    "mfu": ("", "mfu", Job),
}
# flags that only `toolkit train` takes: the runner's section of the Job
TRAIN_OVERRIDES = {
    "steps": ("training", "steps", Training),
    "lr": ("training", "lr", Training),
    "warmup": ("training", "warmup_steps", Training),
    "data": ("training", "data", Training),
    "seed": ("training", "seed", Training),
    "grad_clip": ("training", "grad_clip", Training),
    "eval_every": ("training", "eval_every", Training),
    "checkpoint_every": ("training", "checkpoint_every", Training),
    "bucket_cap_mb": ("training", "bucket_cap_mb", Training),
    "num_workers": ("training", "num_workers", Training),
    "fp32_norm": ("training", "fp32_norm", Training),
    "loss_scale": ("training", "loss_scale", Training),
    "init_from": ("training", "init_from", Training),
}
_BOOLEAN = {
    "tie_embeddings",
    "sp",
    "spot",
    "fp32_norm",
    "fp8",
    "fp8_all_gather",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_tp_comm",
    "expandable_segments",
}
_FLAG_OF_FIELD = {
    f"{sec}.{fld}" if sec else fld: "--" + flag.replace("_", "-")
    for flag, (sec, fld, _cls) in {**OVERRIDES, **TRAIN_OVERRIDES}.items()
}
_FLAG_OF_FIELD.update(
    {
        "cluster.count": "--gpus",
        "cluster.accelerator": "--gpus",
        "model.params": "--params",
        "model.preset": "--model",
        "hf_config": "--hf-config",
        "job file": "--config",
        "catalog file": "--catalog",
    }
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line (exit 2) instead of the usage block. A negative number in
    any notation (-1e9 too, which argparse takes for an option) is a value: the Job's checks refuse it with the
    field's own reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _allowed(cls, name) -> str:
    """The choices of a Literal field (also inside `Literal[...] | None`), as argparse shows them."""
    values, hint = [], get_type_hints(cls)[name]
    if get_origin(hint) is tuple:
        return "A,B,..."
    for arg in get_args(hint):
        if get_origin(arg) is Literal:
            values.extend(get_args(arg))
        elif get_origin(arg) is tuple:  # (stage_layers, lora targets: comma-separated)
            return "A,B,..."
        elif arg is not type(None):
            values.append(arg)
    return "{" + ",".join(str(v) for v in values) + "}" if values and not isinstance(values[0], type) else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toolkit", description="Plan large-model training: memory, FLOPs, time and cost.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser(
        "estimate",
        help="estimate one training job (analytic, instant)",
        description="Estimate parameters, memory, FLOPs, time and cost of a job.",
    )
    _add_job_args(est)
    _add_html(est)
    est.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the job does not fit its devices (for scripts); the report is printed anyway",
    )
    trace = sub.add_parser(
        "trace",
        help="measure the job's memory by running its real step on fake tensors",
        description="Run the real PyTorch training step on fake tensors (no memory allocated) "
        "and report the same keys as `estimate`, with memory measured.",
    )
    _add_job_args(trace)
    _add_html(trace)
    compare = sub.add_parser(
        "compare",
        help="analytic estimate beside the trace, with the error per category; "
        "--run DIR adds a real run's measured memory per rank",
    )
    _add_job_args(compare)
    compare.add_argument(
        "--run",
        metavar="DIR",
        help="a `toolkit train` folder: estimate, trace and measured "
        "memory per rank, and modelled against measured step time",
    )
    compare.add_argument(
        "--no-trace",
        action="store_true",
        help="with --run: measured against the estimate only (the trace takes seconds to a minute)",
    )

    plan = sub.add_parser(
        "plan",
        help="search layouts (and offers) for the fastest or cheapest run that fits",
        description="Evaluate every layout on the given cluster, or on whole instances of each "
        "offer, keep those that fit, rank by time or cost, and give the Pareto front. "
        "Any estimate flag given (e.g. --tp, --precision) fixes that choice.",
    )
    _add_job_args(plan)
    _add_html(plan)
    plan.add_argument("--offers", metavar="A,B,...", help="compare these offers (whole instances, powers of two)")
    plan.add_argument("--objective", metavar="{time,cost}", default="time")
    plan.add_argument("--max-gpus", metavar="N", type=int, help="largest cluster to try with --offers")
    plan.add_argument("--deadline-days", metavar="D", type=float, help="only plans that finish within D days")
    plan.add_argument("--top", metavar="K", type=int, default=10)
    plan.add_argument(
        "--runnable",
        action="store_true",
        help="only layouts `toolkit train` can train (--write-job PATH saves the top plan as a job file)",
    )
    doctor = sub.add_parser(
        "doctor",
        help="what to change when a job does not fit or is slow; or read a run",
        description="Diagnose a job (fixes with the memory and step time each gives, "
        "cheapest first) or, with --run DIR, a run's metrics.",
    )
    _add_job_args(doctor)
    doctor.add_argument("--run", metavar="DIR", help="diagnose the metrics of this run folder instead")

    add_pipeline_parser(sub)
    add_calibrate_parser(sub)

    train = sub.add_parser(
        "train",
        help="train the job for real (CPU processes or GPUs), streaming metrics",
        description="Train the job with accelerate: checkpoints and metrics.jsonl under --out; "
        "a rerun with the same --out resumes from the newest valid checkpoint.",
    )
    _add_job_args(train, TRAIN_OVERRIDES)
    train.add_argument("--out", metavar="DIR", required=True, help="run folder: job.yaml, checkpoints/, metrics.jsonl")
    train.add_argument("--nproc", metavar="N", type=int, default=1, help="data-parallel processes (gloo on CPU)")
    train.add_argument(
        "--force", action="store_true", help="start even when the estimate says the machine cannot hold the job"
    )
    train.add_argument(
        "--launcher",
        choices=["auto", "own", "accelerate"],
        default="auto",
        help="how N ranks start: accelerate launch with a config from the job (auto: where CUDA GPUs "
        "are), or the toolkit's own launcher (auto: elsewhere)",
    )
    train.add_argument("--peak-tflops", metavar="X", type=float, help="device peak for MFU where the catalog has none")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    data = sub.add_parser("data", help="prepare token shards for training")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    prep = data_sub.add_parser(
        "prepare",
        help="tokenise text files (bytes) into shards with an index",
        description="Tokenise text files, or folders of .txt/.md files, into uint16 "
        "shards with index.json; the tail of each file is held out.",
    )
    prep.add_argument("files", nargs="*", metavar="FILE")
    prep.add_argument("--demo", action="store_true", help="the demo corpus: the Python reference manual")
    prep.add_argument("--out", metavar="DIR", required=True)
    prep.add_argument("--val-fraction", metavar="F", type=float, default=0.05)

    export = sub.add_parser(
        "export",
        help="write the job as one file a cluster launches: an accelerate config, a "
        "torchrun or SLURM script, or DeepSpeed's JSON",
    )
    _add_job_args(export, TRAIN_OVERRIDES)
    export.add_argument("--to", required=True, metavar="{accelerate,torchrun,slurm,deepspeed}")
    export.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="machines (default: the job's devices / per node; --gpus-per-node G sets the machines' size)",
    )
    export.add_argument("--out", required=True, metavar="DIR", help="folder to write the one file into")

    claims = sub.add_parser(
        "claims", help="the seed article's numeric claims, recomputed, each with a verdict and a source"
    )
    claims.add_argument("--catalog", metavar="FILE", action="append", default=[])
    claims.add_argument(
        "--json", action="store_true", help='print {"claims": [{"claim", "computed", "verdict", "source", ...}]}'
    )

    cat = sub.add_parser("catalog", help="list or show accelerators, offers, presets")
    cat.add_argument("kind", metavar="{accelerators,offers,presets}")
    cat.add_argument("name", nargs="?", help="show one row in full")
    cat.add_argument("--catalog", metavar="FILE", action="append", default=[])
    cat.add_argument("--json", action="store_true")
    return parser


def _add_job_args(est: argparse.ArgumentParser, extra: dict | None = None) -> None:
    src = est.add_argument_group("model (one of)")
    src.add_argument("--model", metavar="PRESET", help="catalog preset, e.g. gpt3-175b, llama2-7b")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its folder) on disk")
    src.add_argument("--params", metavar="N", help="a size-only model of N parameters")
    est.add_argument("--config", metavar="JOB.yaml", help="start from a job file; flags override it")
    for flag, (sec, fld, cls) in {**OVERRIDES, **(extra or {})}.items():
        option = "--" + flag.replace("_", "-")
        where = f"{sec}.{fld}" if sec else fld
        if flag in _BOOLEAN:
            est.add_argument(option, action=argparse.BooleanOptionalAction, default=None, help=where)
        else:
            est.add_argument(option, metavar=_allowed(cls, fld) or "X", default=None, help=where)
    est.add_argument("--gpus", metavar="COUNTxNAME", help="accelerators, e.g. 8xA100-80GB or 1024xH100-SXM")
    est.add_argument(
        "--catalog",
        metavar="FILE",
        action="append",
        default=[],
        help="YAML file with your own accelerator/offer/preset rows (repeatable)",
    )
    est.add_argument("--write-job", metavar="PATH", help="save the resolved job as YAML")
    est.add_argument("--json", action="store_true", help="print one JSON object")


def _add_html(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="PATH", help="also write the figures as an HTML page")


def parse_gpus(text: str) -> tuple[int, str]:
    """'1024xA100-80GB' -> (1024, 'A100-80GB')."""
    match = re.fullmatch(r"\s*(\d+)\s*[x×*]\s*(\S+)\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise SpecError("--gpus", text, "expected COUNTxNAME, e.g. 8xA100-80GB")
    return int(match.group(1)), match.group(2)


def job_from_args(args, catalog) -> Job:
    """Job file (if any), then model source, then every flag given, in that order."""
    data = {}
    if args.config:
        data = read_yaml(args.config, what="job file") or {}
        if not isinstance(data, dict):
            raise SpecError("job file", args.config, "expected a mapping with sections model, batch, ...")
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    sources = [
        (flag, value)
        for flag, value in (("--model", args.model), ("--hf-config", args.hf_config), ("--params", args.params))
        if value is not None
    ]
    if len(sources) > 1:
        raise SpecError(sources[1][0], sources[1][1], f"give one model source; {sources[0][0]} is given too")
    if sources:
        key = {"--model": "preset", "--hf-config": "hf_config", "--params": "params"}[sources[0][0]]
        data["model"] = {key: sources[0][1]}
    for flag, (sec, fld, _cls) in {**OVERRIDES, **TRAIN_OVERRIDES}.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag in ("lora_targets", "stage_layers"):  # comma-separated lists
            value = [t.strip() for t in str(value).split(",") if t.strip()]
        if sec:
            section = data.setdefault(sec, {})
            if not isinstance(section, dict):
                raise SpecError(sec, section, "expected a mapping")
            section[fld] = value
        else:
            data[fld] = value
    if getattr(args, "finetune", None) is not None and getattr(args, "workload", None) is None:
        data.setdefault("workload", "finetune")  # --finetune full is a fine-tune, not pretraining
    if args.gpus:
        count, name = parse_gpus(args.gpus)
        data.setdefault("cluster", {}).update(count=count, accelerator=name)
    if "model" not in data:
        raise SpecError(
            "model",
            None,
            "no model given: use --model PRESET, --hf-config PATH, --params N, "
            "--layers/--hidden/--heads, or --config job.yaml",
        )
    return Job.from_dict(data, catalog)


def _flag_hint(err: SpecError) -> str:
    flag = _FLAG_OF_FIELD.get(err.field)
    return f"{flag}: {err}" if flag and not str(err).startswith(flag) else str(err)


def cmd_estimate(args) -> int:
    catalog = load_catalog(*args.catalog)
    job = job_from_args(args, catalog)
    result = estimate(job, catalog)
    if args.html:
        from ..plots import memory_figure, step_figure, write_html

        write_html(args.html, [memory_figure(result), step_figure(result)])
    if args.write_job:
        Job.from_dict(result["job"], catalog).to_yaml(args.write_job)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_estimate(result))
    if args.check and result["memory"].get("fits") is False:
        print(
            f"toolkit estimate: the job does not fit: {result['memory']['device_peak_bytes'] / 2**30:.1f} GiB a "
            "device at its peak; see `toolkit doctor` for fixes",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_trace(args) -> int:
    from ..trace.report import traced_estimate  # imports torch: only when asked

    catalog = load_catalog(*args.catalog)
    result = traced_estimate(job_from_args(args, catalog), catalog)
    if args.html:
        from ..plots import memory_figure, write_html

        write_html(args.html, [memory_figure(result)])
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_estimate(result))
    return 0


def cmd_compare(args) -> int:
    from ..trace.report import compare_memory, compare_run

    if args.run:
        from ..format import render_run_comparison

        result = compare_run(args.run, args.catalog, trace=not args.no_trace)
        print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_run_comparison(result))
        return 0
    catalog = load_catalog(*args.catalog)
    result = compare_memory(job_from_args(args, catalog), catalog)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_comparison(result))
    return 0


def fixed_axes(args) -> set[str]:
    """Layout axes the user fixed on the command line or in the job file: the search leaves them alone."""
    fixed = {axis.name for axis in AXES if getattr(args, axis.name, None) is not None}
    if args.config:
        data = read_yaml(args.config, what="job file") or {}
        fixed |= {axis.name for axis in AXES if axis.name in (data.get(axis.section) or {})}
    return fixed


def cmd_plan(args) -> int:
    from ..plan import search

    catalog = load_catalog(*args.catalog)
    gpus = parse_gpus(args.gpus) if args.gpus else None
    offers = [o.strip() for o in args.offers.split(",") if o.strip()] if args.offers else None
    if args.gpus:
        args.gpus = None  # the search sets the cluster itself
    job = job_from_args(args, catalog)
    result = search(
        job,
        catalog,
        gpus=gpus,
        offers=offers,
        objective=args.objective,
        max_gpus=args.max_gpus,
        deadline_days=args.deadline_days,
        top=args.top,
        fixed=fixed_axes(args),
        runnable=args.runnable,
    )
    if args.write_job:
        if not result["plans"]:
            raise SpecError("--write-job", args.write_job, "no layout fits, so there is no plan to write")
        from ..plan.search import plan_job

        plan_job(job, result["plans"][0]).to_yaml(args.write_job)
    if args.html:
        from ..plots import pareto_figure, write_html

        write_html(args.html, [pareto_figure(result)])
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_plan(result))
    return 0


def cmd_doctor(args) -> int:
    from ..plan.doctor import diagnose_job, diagnose_run

    if args.run:
        result = diagnose_run(args.run)
    else:
        catalog = load_catalog(*args.catalog)
        result = diagnose_job(job_from_args(args, catalog), catalog)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_doctor(result))
    return 0


def cmd_train(args) -> int:
    from ..train.launch import launch  # imports torch: only when asked
    from ..train.summary import render_run_summary

    catalog = load_catalog(*args.catalog)
    job = job_from_args(args, catalog)
    code = launch(
        job,
        args.out,
        nproc=args.nproc,
        peak_tflops=args.peak_tflops,
        progress=not args.no_progress,
        launcher=args.launcher,
        catalog_files=args.catalog,
        force=args.force,
    )
    if code == 0:
        print(render_run_summary(args.out))
    return code


def cmd_data(args) -> int:
    from ..train.data import demo_sources, prepare, read_sources

    if args.demo and args.files:
        raise SpecError("data prepare", args.files[0], "give files or --demo, not both")
    index = prepare(demo_sources() if args.demo else read_sources(args.files), args.out, args.val_fraction)
    tokens = {split: sum(s["tokens"] for s in shards) for split, shards in index["splits"].items()}
    print(
        f"{args.out}: {len(index['sources'])} sources, {tokens['train']:,} train and {tokens['val']:,} held-out "
        f"tokens (bytes, vocabulary {index['vocab']})"
    )
    return 0


def cmd_export(args) -> int:
    from ..export import export_job

    catalog = load_catalog(*args.catalog)
    done = export_job(job_from_args(args, catalog), args.to.lower(), args.out, args.nodes, catalog=catalog)
    for warning in done.warnings:
        print(f"toolkit export: warning: {warning}", file=sys.stderr)
    print(f"wrote {done.path}\n{done.command}")
    return 0


def cmd_claims(args) -> int:
    from ..claims import claims_json

    result = claims_json(load_catalog(*args.catalog))
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    for c in result["claims"]:
        print(
            f"{c['verdict'].upper():<12} {c['claim']}\n{'':<13}computed: {c['computed'] or 'not modelled'}\n"
            f"{'':<13}source: {c['source']}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage mistake already reported in one line
        return int(stop.code or 0)
    try:
        if getattr(args, "html", None):  # before the work: a plan may take a while to reach its page
            check_output_folder("--html", args.html)
        commands = {
            "estimate": cmd_estimate,
            "trace": cmd_trace,
            "compare": cmd_compare,
            "catalog": cmd_catalog,
            "train": cmd_train,
            "data": cmd_data,
            "plan": cmd_plan,
            "doctor": cmd_doctor,
            "pipeline": cmd_pipeline,
            "calibrate": cmd_calibrate,
            "claims": cmd_claims,
            "export": cmd_export,
        }
        return commands[args.command](args)
    except SpecError as err:
        print(f"toolkit {args.command}: error: {_flag_hint(err)}", file=sys.stderr)
        return 2
    except MeasurementFailed as err:
        print(f"toolkit {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `toolkit ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a folder that cannot be made, a file that cannot be written, a full disk (after
        # BrokenPipeError, which is one of its kind)
        where = f"{err.filename}: " if err.filename else ""
        print(
            f"toolkit {args.command}: error: {where}{err.strerror or err}; check the path, its permissions and the "
            "disk's free space",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
