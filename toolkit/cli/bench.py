"""`toolkit bench`: measure a live OpenAI-compatible endpoint under load (toolkit.serve.bench) into a run folder,
and `toolkit compare --run DIR` sets the load simulation beside it (toolkit.serve.bench_compare).

    toolkit bench --url http://127.0.0.1:8000/v1 --model toolkit-gpt --concurrency 4 --requests 40 --out runs/b
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..specs import SpecError

__all__ = ["add_bench_parser", "cmd_bench"]


def add_bench_parser(sub) -> argparse.ArgumentParser:
    bench = sub.add_parser(
        "bench",
        help="benchmark a live OpenAI-compatible endpoint (vLLM, SGLang, TensorRT-LLM or `toolkit generate "
        "--serve`): time to first token, inter-token latency, throughput",
        description="Send streamed /v1/completions requests (prompts as token ids, exact lengths, as vLLM's "
        "benchmark_serving does) at a Poisson --rate or --concurrency in flight; write bench.json with the "
        "percentiles into --out. Then `toolkit compare --run DIR` sets the simulated engine beside it.",
    )
    bench.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8000/v1")
    bench.add_argument("--model", required=True, help="the model name the server serves (its /v1/models id)")
    load = bench.add_mutually_exclusive_group()
    load.add_argument("--rate", "--request-rate", type=float, metavar="R", help="requests a second, Poisson")
    load.add_argument("--concurrency", "--max-concurrency", type=int, metavar="C", help="requests kept in flight")
    bench.add_argument("--input-tokens", type=int, default=128, metavar="N", help="prompt tokens a request")
    bench.add_argument("--output-tokens", type=int, default=64, metavar="M", help="tokens generated a request")
    bench.add_argument("--dataset", metavar="FILE", help="JSONL rows of input_tokens, output_tokens (arrival_s)")
    bench.add_argument("--requests", "--num-prompts", type=int, default=40, metavar="K", help="requests sent")
    bench.add_argument("--vocab", type=int, default=256, metavar="V", help="token ids drawn below this")
    bench.add_argument("--seed", type=int, default=0, help="seed of the prompts and the arrivals")
    bench.add_argument("--job", metavar="JOB.yaml", help="the served job, for `compare --run` (copied into --out)")
    bench.add_argument("--out", metavar="DIR", required=True, help="run folder: bench.json (and job.yaml)")
    bench.add_argument("--json", action="store_true", help="print the result as JSON")
    return bench


def cmd_bench(args) -> int:
    import json

    from ..serve.bench import BenchError, bench_text, run_bench, write_bench

    for name in ("input_tokens", "output_tokens", "requests"):
        if getattr(args, name) <= 0:
            raise SpecError(f"--{name.replace('_', '-')}", getattr(args, name), "must be positive")
    if args.job and not Path(args.job).is_file():
        raise SpecError("--job", args.job, "file not found; `toolkit generate --serve --out DIR` writes DIR/job.yaml")
    try:
        result = run_bench(
            args.url,
            args.model,
            rate=args.rate,
            concurrency=args.concurrency,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            requests=args.requests,
            dataset=args.dataset,
            vocab=args.vocab,
            seed=args.seed,
        )
    except BenchError as err:
        raise SpecError("--url", args.url, str(err)) from None
    path = write_bench(result, args.out)
    if args.job:
        shutil.copyfile(args.job, Path(args.out) / "job.yaml")
    print(json.dumps(result, indent=1) if args.json else f"{bench_text(result)}\nwrote {path}")
    return 0
