"""Measure this machine's figures and write them as a catalog row the step-time model can use.

    toolkit calibrate --nproc 2 --config job.yaml --out profile.yaml
    toolkit compare --run runs/demo --catalog profile.yaml     # the model with these figures against the run

Every rank measures at once (as in training, every rank busy, each with the runner's thread count): matmuls at
the job's shapes and dtype (or a sweep of square shapes without a job), the memory bandwidth of a large
element-wise op, the fixed cost of one operation (a tiny op's forward and backward through autograd), and
collectives on the process group (all-reduces from 4 KiB to 16 MiB, fitted as latency + bytes / bandwidth;
reduce-scatter and all-gather bandwidth; for tensor-parallel jobs the fixed cost of one collective as the
runner's DTensor layers issue it, at the job's shapes).
The row's peak is the job's matmuls' rate (forward and backward products at its shapes, their FLOPs over their
time), so the profile sets the model's `gemm_fraction` to 1 (the roofline still slows thin shapes) and `link_efficiency` to 1 (the bandwidth is the one achieved).
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import importlib
import os
import platform
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import yaml

from .specs.catalog import DTYPES as DTYPE_NAMES
from .specs.job import Job, compute_dtype
from .train.precision import TORCH_DTYPES

__all__ = ["calibrate", "measure_rank", "profile_row"]

SWEEP = (256, 512, 1024)
"""Square matmul sizes measured without a job."""
COLLECTIVE_BYTES = tuple(4096 * 4 ** k for k in range(7))          # 4 KiB ... 16 MiB
COLLECTIVE_REPEATS = 9
COLD_BYTES = 64 * 2**20
"""Matmul operands are cycled through this much memory, more than a CPU's last-level cache."""


def _timed_s(fn, seconds: float = 0.3, least: int = 3) -> float:
    """Median seconds of one call of fn, repeated for about `seconds` after a warm-up call."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < least or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def job_shapes(job: Job) -> list[tuple[int, int, int]]:
    """The (m, k, n) of the job's matmuls on one rank: q, k, v, o, the MLP and the output projection."""
    from .estimate.steptime import block_matmul_shapes
    tokens, vocab = job.batch.micro_batch * job.model.seq_len, -(-job.model.vocab // job.parallel.tp)
    shapes = {tuple(int(x) for x in shape) for shape in block_matmul_shapes(job)}
    return sorted(shapes | {(tokens, job.model.hidden, vocab)})


def matmul_flops(shapes, dtype: torch.dtype, rounds: int = 3) -> list[float]:
    """FLOP/s of each (m, k, n) linear layer as training runs it: the forward x·Wᵀ and the backward's two
    products, gy·W and gyᵀ·x, each with its operands laid out as autograd passes them. The shapes take turns
    over `rounds` rounds and each keeps its median round, so a burst of load on a shared machine spoils one
    round of every shape rather than every round of one."""
    runs = []
    for m, k, n in shapes:
        # operands cycled through more memory than the caches hold: in a training step they arrive cold
        copies = max(2, int(COLD_BYTES // ((m * k + n * k + m * n) * torch.finfo(dtype).bits // 8)))
        sets = [(torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype), torch.randn(m, n, dtype=dtype))
                for _ in range(copies)]
        turn = iter(range(10**9))

        def linear(sets=sets, turn=turn, copies=copies):
            x, w, gy = sets[next(turn) % copies]
            x @ w.t(), gy @ w, gy.t() @ x
        runs.append((3 * 2.0 * m * k * n, linear))
    rates = [[] for _ in shapes]
    for _ in range(rounds):
        for i, (flops, linear) in enumerate(runs):
            rates[i].append(flops / _timed_s(linear, seconds=0.3 / rounds))
    return [statistics.median(r) for r in rates]


def memory_bw_bytes_per_s(numel: int = 16 * 2**20) -> float:
    """Bytes an out-of-place add moves per second (two reads, one write), on arrays far larger than the caches."""
    x, y, out = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    return 3 * 4 * numel / _timed_s(lambda: torch.add(x, y, out=out))


def attention_flops(job: Job, dtype: torch.dtype) -> float:
    """FLOP/s of the job's fused attention (torch's SDPA, causal) forward and backward at its shape on one rank."""
    import torch.nn.functional as F
    m = job.model
    heads = max(1, m.heads // job.parallel.tp)
    q, k, v = (torch.randn(job.batch.micro_batch, heads, m.seq_len, m.head_dim_, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    flops = 3 * 2 * 2.0 * job.batch.micro_batch * heads * m.seq_len * m.seq_len * m.head_dim_ / 2   # causal half
    return flops / _timed_s(run)


def elementwise_bw_bytes_per_s(job: Job, dtype: torch.dtype) -> float:
    """Bytes per second of one block's element-wise kernels (two norms, two residual adds, the MLP activation)
    forward and backward at the job's shape, counting the bytes as the step-time model does
    (toolkit.estimate.steptime); on a GPU they are bound by memory, on a CPU often by their arithmetic."""
    import torch.nn.functional as F
    from .estimate.steptime import _memory_bound_bytes_per_token
    m = job.model
    tokens = job.batch.micro_batch * m.seq_len
    x = torch.randn(tokens, m.hidden, dtype=dtype, requires_grad=True)
    up = torch.randn(tokens, m.ffn_ // job.parallel.tp, dtype=dtype, requires_grad=True)
    gate = torch.randn_like(up, requires_grad=True)
    norm = torch.nn.LayerNorm(m.hidden, dtype=dtype) if m.norm == "layernorm" else torch.nn.RMSNorm(m.hidden, dtype=dtype)

    def run():
        act = F.silu(gate) * up if m.mlp == "swiglu" else F.gelu(up, approximate="tanh")
        y = norm(x) + norm(x) + x + x
        (y.sum() + act.sum()).backward()
    plain = job.replace(memory=dataclasses.replace(job.memory, attention="flash", recompute="none"),
                        model=dataclasses.replace(m, dropout=0.0, position="learned"),
                        parallel=dataclasses.replace(job.parallel, sp=False))
    return float(_memory_bound_bytes_per_token(plain)) * tokens / _timed_s(run)


def optimizer_params_per_s(job: Job) -> float:
    """Parameters per second the job's optimizer (AdamW, its implementation) steps, over the model's tensors."""
    from .estimate.phases import optimizer_impl
    from .train.model import GPT
    model = GPT(job.model) if job.model.has_shape else torch.nn.Sequential(*[torch.nn.Linear(512, 512)] * 16)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    impl = optimizer_impl(job)
    opt = torch.optim.AdamW(model.parameters(), foreach=impl == "foreach", fused=impl == "fused" or None)
    return sum(p.numel() for p in model.parameters()) / _timed_s(opt.step)


def op_overhead_s(chain: int = 200) -> float:
    """Seconds of one operation's fixed cost: a chain of tiny ops forward and backward through autograd, per
    op unit (a forward op is one, its backward two)."""
    x = torch.ones(1, requires_grad=True)

    def run():
        y = x
        for _ in range(chain):
            y = y * 1.0001
        y.backward()
    return _timed_s(run) / (3 * chain)


def collective_fit(world: int) -> tuple[float | None, float | None]:
    """(bus bandwidth bytes/s, latency s per ring step) of all-reduce over the group: t = 2(n−1)·latency +
    2(n−1)/n·bytes / bandwidth, fitted over sizes from 4 KiB to 16 MiB to each size's mean time (a step pays the
    mean: on a busy CPU a collective now and then waits a scheduler tick for its peer's thread) with every
    size weighed by its relative error, so that the small sizes fix the latency and the large the bandwidth."""
    if world == 1:
        return None, None
    sizes, times = [], []
    for nbytes in COLLECTIVE_BYTES:              # a fixed count: every rank must call as often as the others
        buffer = torch.zeros(nbytes // 4)
        dist.all_reduce(buffer)
        repeats = COLLECTIVE_REPEATS * max(1, 2**20 // nbytes) if nbytes < 2**20 else COLLECTIVE_REPEATS
        start = time.perf_counter()
        for _ in range(min(repeats, 200)):
            dist.all_reduce(buffer)
        times.append((time.perf_counter() - start) / min(repeats, 200))
        sizes.append(2 * (world - 1) / world * nbytes)
    t = np.array(times)
    slope, intercept = np.polyfit(np.array(sizes), t, 1, w=1 / t)
    times_all = torch.tensor([1 / slope if slope > 0 else 0.0, max(intercept, 0.0) / (2 * (world - 1))])
    dist.all_reduce(times_all, op=dist.ReduceOp.MIN)         # every rank reports the group's figure
    return float(times_all[0]) or None, float(times_all[1])


def sharded_bw_bytes_per_s(world: int, nbytes: int = 16 * 2**20, repeats: int = 9) -> tuple[float | None, float | None]:
    """(reduce-scatter, all-gather) bus bandwidth over the group, bytes/s: (n−1)/n·bytes over each one's mean time at
    16 MiB, where latency no longer counts. ZeRO-2/3 run these; gloo's reduce-scatter is far slower than its
    all-reduce's bandwidth suggests (it copies its whole input, then reduces), NCCL's is not."""
    if world == 1:
        return None, None
    whole, shard = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // world)
    rates = []
    for run in (lambda: dist.reduce_scatter_tensor(shard, whole), lambda: dist.all_gather_into_tensor(whole, shard)):
        run()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        rates.append((world - 1) / world * nbytes / ((time.perf_counter() - start) / repeats))
    agreed = torch.tensor(rates)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return float(agreed[0]), float(agreed[1])


def tp_collective_s(job: Job, world: int, dtype: torch.dtype, bus_bw_bytes_per_s: float | None,
                    seconds: float = 1.0) -> float | None:
    """Seconds of one tensor-parallel collective's fixed cost as the runner's program issues it, beyond moving its
    bytes: the job's MLP as a column- and a row-parallel linear layer (DTensor, the job's tp group, its tokens),
    forward and backward, against the same two layers' local shards without parallelism, in turns; the
    difference is two collectives of the block activation and the layers' dispatch around them. Measured at the
    job's shapes because on a shared CPU the wait for the peer grows with the work between collectives. Means
    over about `seconds` (a step pays the mean); None without tensor parallelism."""
    tp = job.parallel.tp
    if tp <= 1 or world % tp:
        return None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    m = job.model
    tokens, h, f = job.batch.micro_batch * m.seq_len // job.parallel.cp, m.hidden, m.ffn_
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("rest", "tp"))["tp"]
    pair = torch.nn.Sequential(torch.nn.Linear(h, f, dtype=dtype), torch.nn.Linear(f, h, dtype=dtype))
    parallelize_module(pair, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    local = torch.nn.Sequential(torch.nn.Linear(h, f // tp, dtype=dtype), torch.nn.Linear(f // tp, h, dtype=dtype))
    x = torch.randn(tokens, h, dtype=dtype)
    spent = {pair: 0.0, local: 0.0}
    for layers in spent:
        layers(x).sum().backward()
    runs, start = 0, time.perf_counter()
    while True:                                          # the ranks agree when to stop, so all call as often
        for layers in spent:
            began = time.perf_counter()
            for _ in range(3):
                layers(x).sum().backward()
            spent[layers] += time.perf_counter() - began
        runs += 3
        done = torch.tensor([float(time.perf_counter() - start > seconds)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
    extra = torch.tensor([(spent[pair] - spent[local]) / runs])
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    activation_bytes = tokens * h * torch.finfo(dtype).bits // 8
    moving_s = 2 * (tp - 1) / tp * activation_bytes / bus_bw_bytes_per_s if bus_bw_bytes_per_s else 0.0
    return max(float(extra) / 2 - moving_s, 0.0)


def measure_rank(job: Job, rank: int, world: int) -> dict:
    """One rank's figures, measured while every other rank measures the same."""
    importlib.import_module("toolkit.train.loop")     # what a training rank loads (accelerate, the runner)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))      # as the launcher gives a training rank
    mode = job.precision.mode or "fp32"
    dtype = TORCH_DTYPES[compute_dtype(mode)]
    shaped = job.model.has_shape
    shapes = job_shapes(job) if shaped else [(n, n, n) for n in SWEEP]
    bandwidth, latency = collective_fit(world)
    reduce_scatter_bw, gather_bw = sharded_bw_bytes_per_s(world)
    figures = {"rank": rank, "dtype": compute_dtype(mode), "shapes": [list(s) for s in shapes],
               "matmul_flops": matmul_flops(shapes, dtype),
               "attention_flops": attention_flops(job, dtype) if shaped else None,
               "memory_bw_bytes_per_s": elementwise_bw_bytes_per_s(job, dtype) if shaped else memory_bw_bytes_per_s(),
               "optimizer_params_per_s": optimizer_params_per_s(job), "op_overhead_s": op_overhead_s(),
               "bus_bw_bytes_per_s": bandwidth, "latency_s": latency, "tp_collective_s": tp_collective_s(job, world, dtype, bandwidth) if shaped else None,
               "reduce_scatter_bw_bytes_per_s": reduce_scatter_bw, "gather_bw_bytes_per_s": gather_bw}
    gc.collect()
    figures["baseline_bytes"] = _resident_bytes()   # the rank with its code, threads and gloo buffers, tensors freed
    return figures


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def profile_row(ranks: list[dict], world: int) -> dict:
    """The catalog row (accelerators: [row]) of what the ranks measured: the slowest rank's figures."""
    host, today = platform.node() or "this-host", datetime.date.today().isoformat()
    dtype = ranks[0]["dtype"]
    # the job's matmuls together: their FLOPs over their time (the roofline only slows thin shapes further)
    peak = min(len(r["matmul_flops"]) / sum(1 / x for x in r["matmul_flops"]) for r in ranks)
    bus = ranks[0]["bus_bw_bytes_per_s"]
    assumptions = {"gemm_fraction": 1.0, "link_efficiency": 1.0,
                   "comm_overlaps_compute": torch.cuda.is_available(),     # a CPU's cores do both in turn
                   "op_overhead_s": max(r["op_overhead_s"] for r in ranks),
                   "optimizer_params_per_s": min(r["optimizer_params_per_s"] for r in ranks)}
    if ranks[0]["attention_flops"]:
        assumptions["attention_fraction"] = min(r["attention_flops"] for r in ranks) / peak
    if ranks[0]["latency_s"] is not None:
        assumptions["latency_intra_s"] = ranks[0]["latency_s"]
    for key in ("reduce_scatter_bw_bytes_per_s", "gather_bw_bytes_per_s"):
        if ranks[0].get(key) is not None:
            assumptions[key] = ranks[0][key]
    if ranks[0].get("tp_collective_s") is not None:
        assumptions["tp_collective_s"] = ranks[0]["tp_collective_s"]
    baselines = [r["baseline_bytes"] for r in ranks if r.get("baseline_bytes")]
    row = {"name": f"measured-{host}", "vendor": "measured", "memory_bytes": _memory_bytes(world),
           "memory_bw_bytes_per_s": min(r["memory_bw_bytes_per_s"] for r in ranks),
           "link_bw_bytes_per_s": 2 * bus if bus else "unknown", "tdp_w": "unknown",
           "peak_tflops": {**{d: "unknown" for d in DTYPE_NAMES}, dtype: peak / 1e12}, "assumptions": assumptions,
           # what a CPU rank holds beyond its tensors: the process itself (interpreter, torch's code and data, the
           # gloo group), measured; no CUDA context, cuBLAS workspace, caching allocator or NCCL buffers
           **({"device_memory": {"context_bytes": max(baselines), "workspace_bytes": 0, "fragmentation": 0.0,
                                 "fragmentation_expandable": 0.0, "communicator_bytes": 0}}
              if baselines and not torch.cuda.is_available() else {}),
           "source": f"measured on {host}, {today} by toolkit calibrate ({world} rank(s) busy at once, "
                     f"{len(ranks[0]['shapes'])} matmul shapes in {dtype}, forward and backward)",
           "as_of": today}
    return {"accelerators": [row]}


def _memory_bytes(world: int) -> int | str:
    """What one CPU 'device' holds: this machine's memory shared by the ranks that train on it at once (the planner
    fits each rank's tensors in it), or unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // world
    except (ValueError, OSError, AttributeError):
        return "unknown"


def calibrate(job: Job | None, nproc: int, out_path) -> dict:
    """Measure on nproc gloo ranks at once and write the profile YAML; returns the profile."""
    from .trace.ranks import trace_on_ranks
    job = job or Job()
    measured = trace_on_ranks(measure_rank, job, nproc, "calibration", "rank", "measure on fewer ranks",
                              result=dict) if nproc > 1 else [measure_rank(job, 0, 1)]
    profile = profile_row(measured, nproc)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(f"# {profile['accelerators'][0]['source']}\n")
        yaml.safe_dump(profile, f, sort_keys=False)
    return profile
