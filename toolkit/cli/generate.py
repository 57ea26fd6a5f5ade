"""`toolkit generate`: serve the job's requests for real with a KV cache (a run folder for `compare --run`), as an
OpenAI-compatible endpoint (--serve), or one completion as text (--prompt)."""

from __future__ import annotations

import json
from pathlib import Path

from ..specs import SpecError, load_catalog
from .job_flags import TRAIN_OVERRIDES, add_job_args, cpu_precision, job_from_args

__all__ = ["add_generate_parser", "cmd_generate"]


def add_generate_parser(sub) -> None:
    """`generate`: real serving with a KV cache, for `compare --run`."""
    gen = sub.add_parser(
        "generate",
        help="serve the job's requests for real with a KV cache: time to first token, per output token, memory",
        description="Generate greedily for --concurrency requests of --input-tokens prompt tokens and "
        "--output-tokens new ones with the runner's GPT (weights from --init-from), on one process or --nproc "
        "tensor-parallel ranks; writes job.yaml and generate.json under --out for `toolkit compare --run`.",
    )
    add_job_args(gen, TRAIN_OVERRIDES)
    gen.add_argument("--out", metavar="DIR", help="run folder: job.yaml, generate.json (with --serve: job.yaml)")
    gen.add_argument("--serve", action="store_true", help="serve an OpenAI-compatible API (/v1) until stopped")
    gen.add_argument("--port", type=int, default=8000, help="with --serve: the port (0 picks a free one)")
    gen.add_argument("--host", default="127.0.0.1", help="with --serve: the address to listen on")
    gen.add_argument("--nproc", metavar="N", type=int, default=1, help="tensor-parallel ranks (gloo on CPU)")
    gen.add_argument(
        "--verify", action="store_true", help="also generate without a cache and record whether the tokens match"
    )
    gen.add_argument(
        "--prompt",
        metavar="TEXT",
        help="print the greedy completion of TEXT (--output-tokens new tokens, in this process; no --out)",
    )
    gen.add_argument(
        "--tokenizer",
        metavar="T",
        help="with --prompt: a tokenizer.json, a model folder holding one, a hub name, or bytes (default: the "
        "tokenizer of the --init-from run or folder, else of --data)",
    )


def cmd_generate(args) -> int:
    from ..serve.compare import render_generate
    from ..serve.run import generate

    catalog = load_catalog(*args.catalog)
    if args.workload is None:
        args.workload = "inference"
    if args.prompt is not None:
        return _complete(args, catalog)
    if args.serve:
        return _serve(args, catalog)
    if not args.out:
        raise SpecError(
            "--out", None, "give the run folder (or --serve to serve an API, or --prompt TEXT for one completion)"
        )
    out = generate(cpu_precision(args, job_from_args(args, catalog)), args.out, args.nproc, args.catalog, args.verify)
    record = json.loads((out / "generate.json").read_text())
    print(json.dumps(record, indent=2) if args.json else render_generate(record, out))
    return 0


def _complete(args, catalog) -> int:
    """`generate --prompt TEXT`: the completion printed, in the tokenizer of the weights (toolkit.export.hf)."""
    from ..export.hf import weights_tokenizer
    from ..serve.run import complete

    for flag, given in (("--serve", args.serve), ("--out", args.out), ("--verify", args.verify)):
        if given:
            raise SpecError("", None, f"--prompt prints one completion and keeps no run folder: leave out {flag}")
    if args.nproc != 1:
        raise SpecError("--nproc", args.nproc, "--prompt runs in one process: leave out --nproc")
    job = cpu_precision(args, job_from_args(args, catalog))
    tokenizer = weights_tokenizer(job, args.tokenizer)
    result = complete(job, args.prompt, tokenizer.source, tokenizer.eos_id, args.catalog)
    print(json.dumps(result, indent=2) if args.json else result["text"])
    return 0


def _serve(args, catalog) -> int:
    from ..serve.http import serve

    job = cpu_precision(args, job_from_args(args, catalog))
    resolved, _notes = job.resolve(catalog)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        job.to_yaml(Path(args.out) / "job.yaml")
        print(f"wrote {Path(args.out) / 'job.yaml'} (for `toolkit bench --job`)", flush=True)
    return serve(resolved, args.port, args.host)
