"""One rank of `toolkit generate`: build the job's GPT (its weights from training.init_from where given), shard it
over tp, and generate greedily for `concurrency` requests with a KV cache, timing the prefill (time to first
token) and each decode step, then measuring the same program's peak memory with torch's MemTracker (CPU) or the
allocator (GPU). Rank 0 writes generate.json into the run folder.

    python -m toolkit.serve.worker RUN_DIR        # (started by toolkit.serve.run, once per rank)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from ..launch.device import device_type, rank_device
from ..program.generate import KVCache, greedy, plain_greedy
from ..program.instrument import StageTracker, snapshot
from ..program.mesh import build_mesh
from ..program.precision import TORCH_DTYPES
from ..runs.folder import run_catalog_files
from ..specs import Job, load_catalog
from ..specs.dims import ParallelDims
from ..specs.job import compute_dtype

__all__ = ["generate_rank", "main"]

GENERATE_FILE = "generate.json"
MEMORY_DECODE_STEPS = 2
"""Decode steps the memory pass runs after its prefill: the cache is whole from the start, so the peak is reached by
then (the prefill's activations or a decode step's)."""


def _build(job: Job, device: torch.device, mesh):
    from ..program.build import build_model
    from ..program.parallel import tensor_parallel

    dtype = TORCH_DTYPES[compute_dtype(job.precision.mode)]
    load = None
    if job.training.init_from:
        from ..checkpoint.init_weights import load_initial_weights

        def load(model):
            load_initial_weights(model, job.training.init_from)

    model = build_model(job, dtype, load).to(device).eval()
    if mesh is not None:
        tensor_parallel(model, mesh["tp"])
    return model


def _prompts(job: Job, device: torch.device) -> torch.Tensor:
    """`concurrency` prompts of input_tokens tokens, the same on every rank (seeded)."""
    s = job.serving
    gen = torch.Generator().manual_seed(job.training.seed)
    return torch.randint(0, job.model.vocab, (s.concurrency, s.input_tokens), generator=gen).to(device)


def prefill_chunk(job: Job) -> int:
    """Prompt tokens per sequence in one prefill step: the batch's step stays within max_batched_tokens."""
    s = job.serving
    return max(min(s.max_batched_tokens // s.concurrency, s.input_tokens), 1)


def _timed(model, job: Job, prompts: torch.Tensor, device: torch.device) -> dict:
    s = job.serving
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    stamps: list[float] = []

    def on_token(_i: int) -> None:
        sync()
        stamps.append(time.perf_counter())

    cache = KVCache.for_model(model, s.concurrency, s.context)
    sync()
    start = time.perf_counter()
    tokens = greedy(model, prompts, s.output_tokens, cache, on_token, prefill_chunk(job))
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    total = stamps[-1] - start
    return {
        "ttft_s": stamps[0] - start,
        "tpot_s": statistics.median(steps) if steps else None,
        "tpot_mean_s": statistics.fmean(steps) if steps else None,
        "output_tokens_per_s": s.concurrency * s.output_tokens / total,
        "kv_cache_bytes": cache.nbytes,
        "tokens": tokens.tolist(),
    }


def _peak(model, job: Job, prompts: torch.Tensor, device: torch.device) -> dict:
    """The generation's peak bytes on this rank: MemTracker's on a CPU (tensors only), the allocator's on a GPU."""
    s = job.serving
    steps = min(MEMORY_DECODE_STEPS + 1, s.output_tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        greedy(model, prompts, steps, KVCache.for_model(model, s.concurrency, s.context), None, prefill_chunk(job))
        return {
            "instrument": "torch.cuda",
            "peak_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_bytes": torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0],
        }
    tracker = StageTracker()  # (its modules run once a step: MemTracker alone takes that for new iterations)
    tracker.track_external(model)
    with tracker:
        cache = KVCache.for_model(model, s.concurrency, s.context)
        greedy(model, prompts, steps, cache, None, prefill_chunk(job))
    peak = snapshot(tracker, "peak")
    return {"instrument": "MemTracker", "peak_bytes": peak.get("Total", 0), "categories": peak}


def generate_rank(out: Path, verify: bool = False) -> dict:
    """Run this rank's generation with a training rank's thread settings (those `toolkit calibrate` measures
    under); returns its record (rank 0 writes the run's)."""
    from ..launch.determinism import pinned, rank_threads

    with pinned(rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))), device_type()):
        return _generate_rank(out, verify)


def _first_difference(plain: list, cached: list) -> int | None:
    """The first new-token position where a request's cached and uncached greedy tokens differ (None: none)."""
    positions = [next((i for i, (a, b) in enumerate(zip(p, c)) if a != b), None) for p, c in zip(plain, cached)]
    found = [i for i in positions if i is not None]
    return min(found) if found else None


def _generate_rank(out: Path, verify: bool) -> dict:
    catalog = load_catalog(*run_catalog_files(out))
    job, _notes = Job.from_yaml(out / "job.yaml", catalog).resolve(catalog)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = rank_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(job.training.seed)
    mesh = build_mesh(ParallelDims(tp=world), device.type) if world > 1 else None
    model = _build(job, device, mesh)
    prompts = _prompts(job, device)
    greedy(model, prompts[:, :8], 2, KVCache.for_model(model, job.serving.concurrency, 16))  # warm-up
    record = {"rank": rank, "world": world, **_timed(model, job, prompts, device)}
    record.update(_peak(model, job, prompts, device))
    if verify:
        plain = plain_greedy(model, prompts, job.serving.output_tokens).tolist()
        record["matches_plain_forward"] = plain == record["tokens"]
        record["compute_dtype"] = compute_dtype(job.precision.mode)
        record["first_difference"] = _first_difference(plain, record["tokens"])
    if mesh is not None:
        import torch.distributed as dist

        gathered = [None] * world
        dist.all_gather_object(gathered, {k: record[k] for k in ("rank", "peak_bytes", "kv_cache_bytes")})
        record["ranks"] = gathered
        dist.barrier()  # (no rank closes its connections while another still uses them)
        dist.destroy_process_group()
    return record


def write_record(out: Path, record: dict, job_dict: dict) -> None:
    s = job_dict.get("serving", {})
    text = json.dumps({"kind": "generate", "serving": s, **record}, indent=1)
    (out / GENERATE_FILE).write_text(text + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, verify = Path(argv[0]), "--verify" in argv
    record = generate_rank(out, verify)
    if record["rank"] == 0:
        import yaml

        write_record(out, record, yaml.safe_load((out / "job.yaml").read_text()))
    return 0


if __name__ == "__main__":
    code = main()
    # leave without C++ static destructors: a gloo group's threads torn down at interpreter exit can abort a process
    # after a good run ("terminate called without an active exception"; toolkit.train.worker does the same)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
