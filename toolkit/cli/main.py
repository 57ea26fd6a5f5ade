"""`toolkit`: estimate a training job, trace it on fake tensors, compare both, browse the catalogs.

    toolkit estimate --model gpt3-175b --tokens 300e9 --gpus 1024xA100-80GB --mfu 0.45 --json
    toolkit trace --model llama2-7b --micro-batch 1 --recompute full --json
    toolkit compare --model gpt2 --micro-batch 4
    toolkit plan --model llama2-70b --offers p5.48xlarge,p4de.24xlarge --objective cost --max-gpus 512
    toolkit doctor --model llama2-7b --gpus 1xA100-80GB
    toolkit pipeline --stages 4 --microbatches 8 --schedule interleaved --vpp 2 --html gantt.html
    toolkit train --layers 4 --hidden 128 --heads 4 --vocab 256 --seq 128 --steps 50 --out runs/demo --nproc 2
    toolkit estimate --workload inference --model llama2-7b --gpus 1xA100-80GB --concurrency 32 --json
    toolkit generate --layers 4 --hidden 256 --heads 4 --vocab 256 --concurrency 4 --out runs/gen --nproc 2
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

from ..estimate import estimate
from ..specs import Job, SpecError, load_catalog
from ..specs.errors import MeasurementFailed
from ..specs.yamlio import check_output_folder
from ..views.text import render_comparison, render_doctor, render_estimate, render_plan
from .bench import add_bench_parser, cmd_bench
from .calibrate import add_calibrate_parser, cmd_calibrate
from .catalog import cmd_catalog
from .export import add_export_parser, cmd_export
from .generate import add_generate_parser, cmd_generate
from .job_flags import (
    TRAIN_OVERRIDES,
    add_job_args,
    cpu_precision,
    fixed_axes,
    flag_hint,
    job_from_args,
    parse_gpus,
    training_job,
)
from .pipeline import add_pipeline_parser, cmd_pipeline

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line (exit 2) instead of the usage block. A negative number in
    any notation (-1e9 too, which argparse takes for an option) is a value: the Job's checks refuse it with the
    field's own reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `toolkit` command line: one helper per subcommand adds its flags, in the order `--help` lists them."""
    parser = _Parser(prog="toolkit", description="Plan large-model training: memory, FLOPs, time and cost.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_estimate_parser(sub)
    _add_trace_parser(sub)
    _add_compare_parser(sub)
    _add_plan_parser(sub)
    _add_doctor_parser(sub)
    add_pipeline_parser(sub)
    add_calibrate_parser(sub)
    _add_train_parser(sub)
    add_generate_parser(sub)
    add_bench_parser(sub)
    _add_data_parser(sub)
    add_export_parser(sub)
    _add_claims_parser(sub)
    _add_catalog_parser(sub)
    return parser


def _add_estimate_parser(sub) -> None:
    """`estimate`: the analytic report of one job; --check makes it a test for scripts."""
    est = sub.add_parser(
        "estimate",
        help="estimate one training job (analytic, instant)",
        description="Estimate parameters, memory, FLOPs, time and cost of a job.",
    )
    add_job_args(est)
    _add_html(est)
    est.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the job does not fit its devices (for scripts); the report is printed anyway",
    )


def _add_trace_parser(sub) -> None:
    """`trace`: the same report with memory measured on fake tensors."""
    trace = sub.add_parser(
        "trace",
        help="measure the job's memory by running its real step on fake tensors",
        description="Run the real PyTorch training step on fake tensors (no memory allocated) "
        "and report the same keys as `estimate`, with memory measured.",
    )
    add_job_args(trace)
    _add_html(trace)


def _add_compare_parser(sub) -> None:
    """`compare`: estimate beside trace, and beside a real run with --run."""
    compare = sub.add_parser(
        "compare",
        help="analytic estimate beside the trace, with the error per category; "
        "--run DIR adds a real run's measured memory per rank",
    )
    add_job_args(compare)
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


def _add_plan_parser(sub) -> None:
    """`plan`: the layout (and offer) search and what it ranks by."""
    plan = sub.add_parser(
        "plan",
        help="search layouts (and offers) for the fastest or cheapest run that fits",
        description="Evaluate every layout on the given cluster, or on whole instances of each "
        "offer, keep those that fit, rank by time or cost, and give the Pareto front. "
        "Any estimate flag given (e.g. --tp, --precision) fixes that choice.",
    )
    add_job_args(plan)
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


def _add_doctor_parser(sub) -> None:
    """`doctor`: fixes for a job, or a diagnosis of a run folder."""
    doctor = sub.add_parser(
        "doctor",
        help="what to change when a job does not fit or is slow; or read a run",
        description="Diagnose a job (fixes with the memory and step time each gives, "
        "cheapest first) or, with --run DIR, a run's metrics.",
    )
    add_job_args(doctor)
    doctor.add_argument("--run", metavar="DIR", help="diagnose the metrics of this run folder instead")


def _add_train_parser(sub) -> None:
    """`train`: a real run, its folder, its processes and how they start."""
    train = sub.add_parser(
        "train",
        help="train the job for real (CPU processes or GPUs), streaming metrics",
        description="Train the job with accelerate: checkpoints and metrics.jsonl under --out; "
        "a rerun with the same --out resumes from the newest valid checkpoint.",
    )
    add_job_args(train, TRAIN_OVERRIDES)
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


def _add_data_parser(sub) -> None:
    """`data prepare`: text to token shards the runner reads."""
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
    prep.add_argument(
        "--tokenizer",
        metavar="T",
        help="a tokenizer.json, a local Hugging Face model folder, or a hub name (default: bytes)",
    )
    prep.add_argument("--field", metavar="NAME", default="text", help="jsonl key, parquet or dataset column")
    prep.add_argument("--mix", metavar="W1,W2,...", help="the sources' shares of the training tokens, in order")


def _add_claims_parser(sub) -> None:
    """`claims`: the seed article's claims, recomputed."""
    claims = sub.add_parser(
        "claims", help="the seed article's numeric claims, recomputed, each with a verdict and a source"
    )
    claims.add_argument("--catalog", metavar="FILE", action="append", default=[])
    claims.add_argument(
        "--json", action="store_true", help='print {"claims": [{"claim", "computed", "verdict", "source", ...}]}'
    )


def _add_catalog_parser(sub) -> None:
    """`catalog`: list or show the catalog's rows."""
    cat = sub.add_parser("catalog", help="list or show accelerators, offers, presets")
    cat.add_argument("kind", metavar="{accelerators,offers,presets}")
    cat.add_argument("name", nargs="?", help="show one row in full")
    cat.add_argument("--catalog", metavar="FILE", action="append", default=[])
    cat.add_argument("--json", action="store_true")


def _add_html(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="PATH", help="also write the figures as an HTML page")


def cmd_estimate(args) -> int:
    catalog = load_catalog(*args.catalog)
    job = job_from_args(args, catalog)
    result = estimate(job, catalog)
    if args.html and result.get("workload") == "inference":
        from ..views.figures import write_html
        from ..views.figures_serving import serving_curve_figure, serving_memory_figure

        write_html(args.html, [serving_memory_figure(result), serving_curve_figure(result)])
    elif args.html:
        from ..views.figures import memory_figure, step_figure, write_html

        write_html(args.html, [memory_figure(result), step_figure(result)])
    if args.write_job:
        Job.from_dict(result["job"], catalog).to_yaml(args.write_job)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_estimate(result))
    if args.check and result["memory"].get("fits") is False:
        if result.get("workload") == "inference":
            print(f"toolkit estimate: the job {result['memory']['why_not']}", file=sys.stderr)
            return 1
        peak = result["memory"]["device_peak_bytes"]
        print(
            f"toolkit estimate: the job does not fit: {peak / 2**30:.1f} GiB a "
            "device at its peak; see `toolkit doctor` for fixes",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_trace(args) -> int:
    from ..trace.report import traced_estimate  # imports torch: only when asked

    catalog = load_catalog(*args.catalog)
    result = traced_estimate(training_job(args, catalog), catalog)
    if args.html:
        from ..views.figures import memory_figure, write_html

        write_html(args.html, [memory_figure(result)])
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_estimate(result))
    return 0


def cmd_compare(args) -> int:
    from ..trace.report import compare_memory, compare_run

    if args.run:
        from ..serve.compare import compare_generate, is_generate_run, render_generate_comparison
        from ..views.text import render_run_comparison

        if is_generate_run(args.run):
            result = compare_generate(args.run, args.catalog)
            print(json.dumps(result, indent=2) if args.json else render_generate_comparison(result))
            return 0
        from ..serve.bench_compare import compare_bench, is_bench_run

        if is_bench_run(args.run):
            result = compare_bench(args.run, args.catalog)
            print(json.dumps(result, indent=2) if args.json else render_generate_comparison(result))
            return 0

        result = compare_run(args.run, args.catalog, trace=not args.no_trace)
        print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_run_comparison(result))
        return 0
    catalog = load_catalog(*args.catalog)
    result = compare_memory(training_job(args, catalog), catalog)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_comparison(result))
    return 0


def cmd_plan(args) -> int:
    from ..plan import search

    catalog = load_catalog(*args.catalog)
    gpus = parse_gpus(args.gpus) if args.gpus else None
    offers = [o.strip() for o in args.offers.split(",") if o.strip()] if args.offers else None
    if args.gpus:
        args.gpus = None  # the search sets the cluster itself
    job = job_from_args(args, catalog)
    if job.workload == "inference":
        from ..plan.serving import plan_serving
        from ..views.text_serving import render_serving_plan

        result = plan_serving(job, catalog, offers, top=args.top)
        print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_serving_plan(result))
        return 0
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
        from ..views.figures import pareto_figure, write_html

        write_html(args.html, [pareto_figure(result)])
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_plan(result))
    return 0


def cmd_doctor(args) -> int:
    from ..plan.doctor import diagnose_job, diagnose_run

    if args.run:
        result = diagnose_run(args.run)
    else:
        catalog = load_catalog(*args.catalog)
        result = diagnose_job(training_job(args, catalog), catalog)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else render_doctor(result))
    return 0


def cmd_train(args) -> int:
    from ..plan.preflight import check_fits
    from ..train.launch import launch  # imports torch: only when asked
    from ..train.summary import render_run_summary

    catalog = load_catalog(*args.catalog)
    job = cpu_precision(args, training_job(args, catalog))
    code = launch(
        job,
        args.out,
        nproc=args.nproc,
        peak_tflops=args.peak_tflops,
        progress=not args.no_progress,
        launcher=args.launcher,
        catalog_files=args.catalog,
        force=args.force,
        preflight=check_fits,
    )
    if code == 0:
        print(render_run_summary(args.out))
    return code


def cmd_data(args) -> int:
    from ..train.data import demo_sources, prepare, read_sources
    from ..train.documents import load_tokenizer

    if args.demo and args.files:
        raise SpecError("data prepare", args.files[0], "give files or --demo, not both")
    weights = None
    if args.mix:
        try:
            weights = [float(w) for w in args.mix.split(",")]
        except ValueError:
            raise SpecError("--mix", args.mix, "expected numbers separated by commas, e.g. 0.7,0.3") from None
    tokenizer = load_tokenizer(args.tokenizer)
    sources = demo_sources() if args.demo else read_sources(args.files, args.field)
    index = prepare(sources, args.out, args.val_fraction, tokenizer, weights)
    tokens = {split: sum(s["tokens"] for s in shards) for split, shards in index["splits"].items()}
    print(
        f"{args.out}: {len(index['sources'])} sources, {tokens['train']:,} train and {tokens['val']:,} held-out "
        f"tokens ({index['tokenizer']}, vocabulary {index['vocab']:,})"
    )
    return 0


def cmd_claims(args) -> int:
    from ..plan.claims import claims_json

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
            "generate": cmd_generate,
            "bench": cmd_bench,
            "plan": cmd_plan,
            "doctor": cmd_doctor,
            "pipeline": cmd_pipeline,
            "calibrate": cmd_calibrate,
            "claims": cmd_claims,
            "export": cmd_export,
        }
        return commands[args.command](args)
    except SpecError as err:
        print(f"toolkit {args.command}: error: {flag_hint(err)}", file=sys.stderr)
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
