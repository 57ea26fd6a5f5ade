"""`toolkit generate`: run a serving job's requests for real, in one process or tensor-parallel ranks (gloo on CPU,
NCCL on GPUs), and keep what they measured beside the job.

    generate(job, "runs/gen", nproc=2)     # job.yaml, generate.json (time to first token, per output token, ...)
    complete(job, "def main", "data/tok")  # `--prompt`: the greedy completion of a text, in this process

The folder is what `toolkit compare --run` reads (toolkit.serve.compare). `run_weights` reads a training run's
weights as generate's model takes them, for `toolkit export --hf` (toolkit.export.hf).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..capability import generate_refusal
from ..estimate.host import RANK_BASELINE_BYTES, host_available_bytes
from ..estimate.serving_memory import runner_peak_bytes
from ..launch.ranks import start_ranks, supervise
from ..runs.folder import write_run_catalog
from ..specs import Job, SpecError, load_catalog
from ..specs.errors import MeasurementFailed
from ..specs.yamlio import check_output_folder

__all__ = ["generate", "complete", "run_weights"]


def _check(job: Job, nproc: int) -> Job:
    """The job as the ranks run it: resolved, tp = nproc, one replica, a number of requests."""
    if nproc < 1:
        raise SpecError("--nproc", nproc, "must be 1 or more")
    par = job.parallel
    if (par.tp or 1) not in (1, nproc) or (par.pp or 1) > 1 or (par.dp or 1) > 1:
        raise SpecError(
            "--nproc",
            nproc,
            "generate runs one replica over tensor parallelism: --nproc N is tp N (no --pp, no --dp)",
        )
    job = job.replace(parallel=dataclasses.replace(par, tp=nproc, dp=1), workload="inference")
    if job.serving.concurrency == "max":
        raise SpecError("serving.concurrency", "max", "generate runs a given number of requests: give --concurrency N")
    if job.training.init_from and not Path(job.training.init_from).is_dir():
        raise SpecError("training.init_from", job.training.init_from, "no such folder")
    return job


def _check_runnable(job: Job) -> None:
    """What the runner's generation cannot do, in one line: toolkit.capability's generate rules."""
    refusal = generate_refusal(job)
    if refusal is not None:
        raise SpecError(*refusal)


def generate(job: Job, out_dir: str | Path, nproc: int = 1, catalog_files=(), verify: bool = False) -> Path:
    """Run the job's requests; returns the run folder (generate.json inside)."""
    job = _check(job, nproc)
    catalog = load_catalog(*catalog_files)
    resolved, _notes = job.resolve(catalog)
    _check_runnable(resolved)
    check_generate_fits(resolved, nproc)
    out = Path(out_dir)
    check_output_folder("--out", str(out))
    out.mkdir(parents=True, exist_ok=True)
    write_run_catalog(out, catalog_files)
    job.to_yaml(out / "job.yaml")
    (out / "generate.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "toolkit.serve.worker", str(out)] + (["--verify"] if verify else [])
    if nproc == 1:
        from .worker import main

        main(command[3:])
    else:
        _run_ranks(command, nproc, out)
    return out


def _run_ranks(command: list[str], nproc: int, out: Path) -> None:
    """The ranks through the shared launcher (toolkit.launch.ranks), each logging to OUT/rank{N}.log; the first
    to fail stops the others (they would wait on it forever) and is named with its last line."""
    exits = supervise(start_ranks(command, nproc, logs=out))
    if exits.failed:
        first = exits.failed[0]
        raise MeasurementFailed(
            f"generate: {_failure(first['rank'], first['code'], out)} (the run folder {out} keeps job.yaml)"
        )


def _failure(rank: int, code: int, out: Path) -> str:
    err = (out / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace")
    last = [line for line in err.splitlines() if line.strip()]
    return f"rank {rank} exited with code {code}: {last[-1] if last else 'no message'}"


def complete(job: Job, prompt: str, tokenizer: str, eos_id: int | None = None, catalog_files=()) -> dict:
    """`toolkit generate --prompt TEXT`: TEXT in `tokenizer`'s ids, greedy new tokens from the model the ranks build
    (toolkit.serve.worker), in this process, and their text up to the end-of-document id."""
    encode, decode = _text_codec(tokenizer)
    ids = encode(prompt)
    if not ids:
        raise SpecError("--prompt", prompt, "holds no tokens; give some text")
    job = _check(job, 1)
    job = job.replace(serving=dataclasses.replace(job.serving, concurrency=1, input_tokens=len(ids)))
    resolved, _notes = job.resolve(load_catalog(*catalog_files))
    _check_runnable(resolved)
    check_generate_fits(resolved, 1)
    if max(ids) >= resolved.model.vocab:
        raise SpecError(
            "--tokenizer", tokenizer, f"gives id {max(ids)}, past the model's vocabulary {resolved.model.vocab}"
        )
    tokens = _greedy_here(resolved, ids)
    kept = tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens
    return {"prompt_tokens": ids, "tokens": tokens, "text": decode(kept)}


def _greedy_here(job: Job, ids: list[int]) -> list[int]:
    """One request's greedy tokens by the worker's own model and prefill (so a run's `generate.json` agrees)."""
    import torch

    from ..launch.device import rank_device
    from ..program.generate import KVCache, greedy
    from .worker import _build, prefill_chunk

    device = rank_device(0)
    torch.manual_seed(job.training.seed)
    model = _build(job, device, None)
    cache = KVCache.for_model(model, 1, job.serving.context)
    prompts = torch.tensor([ids], device=device)
    return greedy(model, prompts, job.serving.output_tokens, cache, None, prefill_chunk(job))[0].tolist()


def _text_codec(source: str):
    """(encode, decode) of `bytes` (UTF-8) or of a Hugging Face tokenizer: a tokenizer.json, a folder holding one,
    or a hub name (as `toolkit data prepare --tokenizer` reads it)."""
    if source == "bytes":
        return (lambda text: list(text.encode("utf-8"))), (
            lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError("--tokenizer", source, "needs the `tokenizers` package: pip install tokenizers") from None
    path = Path(source) / "tokenizer.json" if Path(source).is_dir() else Path(source)
    try:
        tok = Tokenizer.from_file(str(path)) if path.is_file() else Tokenizer.from_pretrained(source)
    except Exception as err:  # a damaged file, or a hub name offline
        raise SpecError(
            "--tokenizer",
            source,
            f"could not be read ({type(err).__name__}); give a tokenizer.json, a model folder holding one, or bytes",
        ) from None
    return (lambda text: tok.encode(text).ids), tok.decode


def run_weights(run: str | Path, job: Job) -> dict:
    """A training run's newest valid weights as numpy arrays by the runner's GPT names, read as `toolkit generate
    --init-from RUN` reads them (toolkit.checkpoint.init_weights, into the GPT in fp32: a 16-bit run's weights are
    widened exactly), for `toolkit export --hf`: the exported model then generates what generate does."""
    import torch

    from ..checkpoint.init_weights import load_initial_weights
    from ..program.model import GPT

    with torch.device("meta"):  # (no random initialisation of weights about to be overwritten)
        model = GPT(job.model, dtype=torch.float32)
    model.to_empty(device="cpu")
    try:
        load_initial_weights(model, run)
    except SpecError as err:  # (said as the flag that named the run)
        raise SpecError("--hf", str(run), err.problem) from None
    return {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}


def check_generate_fits(job: Job, nproc: int) -> None:
    """`toolkit generate` on a CPU: each rank's weights, whole static cache and one step's activations
    (toolkit.estimate.serving_memory.runner_peak_bytes, what MemTracker measures) and its interpreter against this
    host's available memory, refused in one line before the model is built."""
    available = host_available_bytes()
    if job.cluster.accelerator is not None or available is None or not job.model.has_shape:
        return
    s = job.serving
    step_tokens = min(s.max_batched_tokens, s.concurrency * s.input_tokens)
    need = nproc * (runner_peak_bytes(job, step_tokens) + RANK_BASELINE_BYTES)
    if need > available:
        raise SpecError(
            "--nproc" if nproc > 1 else "--model",
            nproc if nproc > 1 else job.model.name,
            f"generating needs about {need / 2**30:.1f} GiB of this host's memory (weights in "
            f"{job.precision.plan.compute_bytes * 8:.0f}-bit, the whole KV cache, one step, the interpreter) and "
            f"{available / 2**30:.1f} GiB is available: fewer --concurrency, a shorter --input-tokens/--output-tokens, "
            "or a smaller model (--layers, --hidden)",
        )
