"""Measure this machine's figures and write them as a catalog row the step-time model can use.

    toolkit calibrate --nproc 2 --config job.yaml --out profile.yaml
    toolkit compare --run runs/demo --catalog profile.yaml     # the model with these figures against the run

Every rank measures at once, as in training (every rank busy, each with the runner's thread count and, on CPU,
its deterministic kernels): the matmul and fused-attention rates inside one rank's share of the job's own model
under torch's profiler (a sweep of square shapes without a job), the memory bandwidth of a large element-wise op,
the fixed cost of one operation and of one checkpointed region, and collectives on the process group (all-reduces
from 4 KiB to 16 MiB, fitted as latency + bytes / bandwidth; reduce-scatter and all-gather bandwidth; for
tensor-parallel jobs the fixed cost of one collective as the runner's DTensor plan issues it in one of the job's
blocks; for FSDP2 jobs the cost of one of its collectives beyond the bytes, as the runner shards the job's blocks).
The row's peak is the job's matmuls' rate (their FLOPs over their time inside the model), so the profile sets the
model's `gemm_fraction` to 1 (the roofline still slows thin shapes) and `link_efficiency` to 1 (the bandwidth is
the one achieved).
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

__all__ = ["calibrate", "measure_rank", "profile_row", "in_model_rates", "kernel_totals"]

SWEEP = (256, 512, 1024)
"""Square matmul sizes measured without a job."""
COLLECTIVE_BYTES = tuple(4096 * 4 ** k for k in range(7))          # 4 KiB ... 16 MiB
COLLECTIVE_REPEATS = 9
FSDP_BLOCKS = 4
"""Blocks FSDP2's collectives are timed over (fewer when the job has fewer)."""
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


IN_MODEL_LAYERS = 4
"""Blocks of the job's model the in-model rates are timed over (fewer when the job has fewer)."""
IN_MODEL_SAMPLES = 12
"""Training steps of that model the profiler records."""
_MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}
"""The linear layers' kernels, with the positions of their two matrices among the recorded input shapes."""
_FLASH = ("aten::_scaled_dot_product_flash_attention_for_cpu",
          "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def rank_spec(job: Job):
    """The job's model as one rank holds it: heads, MLP width and vocabulary over tp, tokens over cp."""
    m, par = job.model, job.parallel
    return dataclasses.replace(m, heads=m.heads // par.tp, kv_heads=m.kv_heads_ // par.tp, head_dim=m.head_dim_,
                               ffn=m.ffn_ // par.tp, vocab=-(-m.vocab // par.tp), seq_len=m.seq_len // par.cp,
                               max_positions=m.max_positions_, layers=min(m.layers, IN_MODEL_LAYERS))


def in_model_rates(job: Job, seconds: float = 1.5) -> tuple[float, float | None]:
    """(matmul FLOP/s, fused attention FLOP/s or None) as the job's own model runs them: this rank's share of the
    model (`rank_spec`) trains forward and backward on random tokens, in the job's precision, and each rate is
    its kernels' FLOPs over their time under torch's profiler. Without recompute: the profiler records the
    product during which checkpoint's early stop is raised as a call (its kernel never runs), and per-op
    recompute's cached products as calls too, FLOPs that no kernel computed. A kernel inside a model runs slower
    than the same product alone (on this 2-core machine up to a third for products with a 1 MiB result: the
    other kernels evict its operands), so the rates are taken where the step runs them. IN_MODEL_SAMPLES steps
    are profiled, spread evenly over about `seconds` (reading a profile costs more than recording it); every
    rank runs as many steps, so each one's kernels share the machine with the others' as in a run."""
    from torch.profiler import ProfilerActivity, profile
    from .train.model import GPT
    from .train.precision import torch_precision
    spec, plan = rank_spec(job), torch_precision(job.precision.mode or "fp32")
    torch.manual_seed(0)
    model = GPT(spec, attention=job.memory.attention, dtype=plan.param_dtype)
    tokens = torch.randint(0, spec.vocab, (job.batch.micro_batch, spec.seq_len))

    def step():
        with plan.autocast("cpu"):
            loss = model(tokens, tokens)
        loss.backward()
    step_s = torch.tensor([_timed_s(step, seconds=0.0, least=1)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(step_s, op=dist.ReduceOp.MAX)           # one stride for all: the same number of steps
    stride = max(1, round(seconds / (IN_MODEL_SAMPLES * float(step_s))))
    totals = dict.fromkeys(("matmul_flops", "matmul_s", "attention_flops", "attention_s"), 0.0)
    for i in range(IN_MODEL_SAMPLES * stride):
        if i % stride:
            step()
            continue
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step()
        for key, value in kernel_totals(prof).items():
            totals[key] += value
    attention = totals["attention_flops"] / totals["attention_s"] if totals["attention_s"] else None
    return totals["matmul_flops"] / totals["matmul_s"], attention


def kernel_totals(prof) -> dict:
    """FLOPs and seconds of the linear layers' products (mm, addmm) and of the fused attention kernels (forward
    and backward) that a torch profiler recorded with shapes; FLOPs from the shapes, 2·m·k·n a product and
    3·2·2·b·h·s²·d/2 a causal attention forward with its backward."""
    totals = dict.fromkeys(("matmul_flops", "matmul_s", "attention_flops", "attention_s"), 0.0)
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key in _MATMULS:
            a, b = (event.input_shapes[i] for i in _MATMULS[event.key])
            totals["matmul_flops"] += 2.0 * a[0] * a[1] * b[1] * event.count
            totals["matmul_s"] += event.cpu_time_total / 1e6
        elif event.key in _FLASH:
            totals["attention_s"] += event.cpu_time_total / 1e6
            if event.key == _FLASH[0]:                 # (batch, heads, seq, head dim); causal: half the products
                batch, heads, seq, dim = event.input_shapes[0]
                totals["attention_flops"] += 3 * 2 * 2.0 * batch * heads * seq * seq * dim / 2 * event.count
    return totals


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
    decoder = job.model.has_shape and not job.model.encoder       # (the runner's GPT builds decoders)
    model = GPT(job.model) if decoder else torch.nn.Sequential(*[torch.nn.Linear(512, 512)] * 16)
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


def checkpoint_overhead_s(job: Job) -> float:
    """Seconds one checkpointed region costs beyond running its forward again: torch's checkpoint (non-reentrant,
    as the runner's recompute) packs and unpacks every tensor the region saves through its hooks, records the
    rerun's graph and raises its early stop through autograd. Fitted as a + b·saved on chains of tiny products
    (2 and 32 saved tensors: checkpointed forward and backward, less the same without checkpoint, less the
    chain's forward), then taken at the number of tensors the job's region saves (its block; under selective
    recompute its attention core), counted with torch's saved-tensor hooks. Timing the job's block itself this
    way leaves a difference of three large times, lost in a shared machine's noise; the chains' figure is a
    floor (a 256-wide block's region costs about three times as much here, by torch's profiler)."""
    from torch.utils.checkpoint import checkpoint
    extra = {}
    for n in (1, 16):
        weights, x = [torch.ones(1, requires_grad=True) for _ in range(n)], torch.ones(1, requires_grad=True)

        def region(y, weights=weights):
            for w in weights:
                y = y * w
            return y
        plain_s = _timed_s(lambda: region(x).backward())
        checkpointed_s = _timed_s(lambda: checkpoint(region, x, use_reentrant=False).backward())
        extra[2 * n] = checkpointed_s - plain_s - _timed_s(lambda: region(x.detach()))
    per_saved_s = max((extra[32] - extra[2]) / 30, 0.0)
    fixed_s = max(extra[2] - 2 * per_saved_s, 0.0)
    run, build = _block_run(job, job.model.seq_len)
    block, m, saved = build(job.model), job.model, [0]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.__setitem__(0, saved[0] + 1) or t, lambda t: t):
        if job.memory.recompute == "selective":       # the region is the attention core alone
            block.attn.core(*(torch.randn(job.batch.micro_batch, m.heads, m.seq_len, m.head_dim_, requires_grad=True)
                              for _ in range(3)))
        else:
            run(block, backward=False)
    return fixed_s + per_saved_s * saved[0]


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


def _extra_s(layout, local, run, seconds: float) -> float:
    """Mean seconds `run(layout)` takes beyond `run(local)`, timed in turns (3 calls each) for about `seconds`
    while the other ranks do the same (they agree when to stop, so all call as often); the group's maximum."""
    spent = {layout: 0.0, local: 0.0}
    for module in spent:
        run(module)
    runs, start = 0, time.perf_counter()
    while True:
        for module in spent:
            began = time.perf_counter()
            for _ in range(3):
                run(module)
            spent[module] += time.perf_counter() - began
        runs += 3
        done = torch.tensor([float(time.perf_counter() - start > seconds)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
    extra = torch.tensor([(spent[layout] - spent[local]) / runs])
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return float(extra)


def _block_run(job: Job, tokens_per_rank: int):
    """(run(block), build(spec)): one forward and backward of a toolkit.train.model.Block, built as the runner
    builds the job's (its attention, its weights' dtype), on random activations of the job's micro-batch (this
    rank's tokens), with rotary tables where the job has them, under autocast for amp-* as a micro-batch runs;
    `run(block, checkpointed=True)` through torch's checkpoint, `backward=False` the forward alone."""
    from .train.model import Block, rope_tables
    from .train.precision import torch_precision
    m, plan = job.model, torch_precision(job.precision.mode or "fp32")
    x = torch.randn(job.batch.micro_batch, tokens_per_rank, m.hidden, dtype=plan.param_dtype, requires_grad=True)
    rope = rope_tables(m.seq_len, m.head_dim_) if m.position == "rope" else (None, None)

    def run(block, checkpointed: bool = False, backward: bool = True):
        from torch.utils.checkpoint import checkpoint
        with plan.autocast("cpu"):
            out = checkpoint(block, x, *rope, use_reentrant=False) if checkpointed else block(x, *rope)
        if backward:
            out.float().sum().backward()

    def build(spec):
        return Block(spec, job.memory.attention, False).to(plan.param_dtype)
    return run, build


def tp_collective_s(job: Job, world: int, dtype: torch.dtype, bus_bw_bytes_per_s: float | None,
                    seconds: float = 2.0) -> float | None:
    """Seconds of one tensor-parallel collective's fixed cost as the runner's program issues it, beyond moving its
    bytes: one of the job's blocks under the runner's own DTensor plan (toolkit.train.parallel.block_plan, the
    job's tp group and sequence parallelism), forward and backward, against a block of this rank's share (heads
    and MLP width over tp) without parallelism, in turns; the difference, over the block's collectives
    (toolkit.estimate.comm.tp_collectives_per_block), is each collective with the DTensor dispatch and
    redistribution around it. Measured at the job's shapes because on a shared CPU the wait for the peer grows
    with the work between collectives. None without tensor parallelism."""
    tp = job.parallel.tp
    if tp <= 1 or world % tp:
        return None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from .estimate.comm import tp_collectives_per_block
    from .train.parallel import block_plan
    m, sp = job.model, job.parallel.sp
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("rest", "tp"))["tp"]
    run, build = _block_run(job, m.seq_len // tp if sp else m.seq_len)
    local_run, _ = _block_run(job, m.seq_len)
    torch.manual_seed(0)
    whole = build(m)
    parallelize_module(whole, mesh, block_plan(whole, sp))
    share = build(dataclasses.replace(m, heads=m.heads // tp, kv_heads=m.kv_heads_ // tp, head_dim=m.head_dim_,
                                      ffn=m.ffn_ // tp))
    extra = _extra_s(whole, share, lambda b: (run if b is whole else local_run)(b), seconds)
    collectives = float(tp_collectives_per_block(job))
    activation_bytes = job.batch.micro_batch * m.seq_len * m.hidden * torch.finfo(dtype).bits // 8
    moving_s = 2 * (tp - 1) / tp * activation_bytes / bus_bw_bytes_per_s if bus_bw_bytes_per_s else 0.0
    return max(extra / collectives - moving_s, 0.0)


class _Blocks(torch.nn.Module):
    """A few blocks in a row under a parameterless root: FSDP2's root unit over inner block units, as in the
    model (with several, each block's gather overlaps the one before it as the program's prefetch does)."""

    def __init__(self, blocks: list[torch.nn.Module]):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x, cos=None, sin=None):
        for block in self.blocks:
            x = block(x, cos, sin)
        return x


def fsdp_collective_s(job: Job, world: int, reduce_scatter_bw: float | None, gather_bw: float | None,
                      seconds: float = 1.0) -> float | None:
    """Seconds of one FSDP2 collective's cost beyond its ring bytes, as the runner's program issues it: up to
    FSDP_BLOCKS of the job's blocks sharded as toolkit.train.parallelize.apply_fsdp shards them (its dp group,
    mixed-precision policy and resharding) under an empty root, forward and backward, against the same blocks
    whole, in turns; the difference per block, less its bytes at the measured gather and reduce-scatter
    bandwidths, over a block's collectives in a micro-batch (a gather, a second one in backward at ZeRO-3, a reduce-scatter). On a CPU this is far
    above the all-reduce's latency: fresh buffers for every gather and reduction (their pages are first touched
    then), the copies in and out of them, the hooks, and the wait for the peer's thread. None unless the job
    runs FSDP2 over more than one replica."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from .estimate.states import bytes_per_param
    from .train.parallelize import fsdp_policies
    par = job.parallel
    dp = world // (par.tp * par.pp)
    if par.zero < 2 or job.backend != "torch" or dp <= 1 or world % (par.tp * par.pp):
        return None
    mesh = init_device_mesh("cpu", (world // dp, dp), mesh_dim_names=("rest", "dp"))["dp"]
    run, build = _block_run(job, job.model.seq_len)
    torch.manual_seed(0)
    count = min(job.model.layers, FSDP_BLOCKS)
    sharded = _Blocks([build(job.model) for _ in range(count)])
    whole = _Blocks([build(job.model) for _ in range(count)])
    precision, _ = fsdp_policies(job, pin_memory=False)
    reshard = par.zero == 3 and par.pp == 1
    for module in (*sharded.blocks, sharded):
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=precision)
    extra = _extra_s(sharded, whole, run, seconds) / count
    params = sum(p.numel() for p in whole.blocks[0].parameters())
    weight_b, grad_b, _ = bytes_per_param(job)
    gather_b = 2 if job.precision.plan.family == "amp" else weight_b        # FSDP2 gathers amp's 16-bit copies
    gathers = 2 if reshard else 1
    ring = (dp - 1) / dp * params
    moving_s = gathers * ring * gather_b / (gather_bw or float("inf")) + \
        ring * grad_b / (reduce_scatter_bw or float("inf"))
    return max((extra - moving_s) / (gathers + 1), 0.0)


def measure_rank(job: Job, rank: int, world: int) -> dict:
    """One rank's figures, measured while every other rank measures the same, with a training rank's settings:
    its thread count and, on CPU, deterministic kernels (toolkit.train.determinism.pinned), under which every
    fresh tensor is filled before use (torch.utils.deterministic.fill_uninitialized_memory)."""
    importlib.import_module("toolkit.train.loop")     # what a training rank loads (accelerate, the runner)
    from .train.determinism import pinned, rank_threads
    with pinned(rank_threads(world), "cuda" if torch.cuda.is_available() else "cpu"):
        return _measure_rank(job, rank, world)


def _measure_rank(job: Job, rank: int, world: int) -> dict:
    mode = job.precision.mode or "fp32"
    dtype = TORCH_DTYPES[compute_dtype(mode)]
    shaped = job.model.has_shape
    shapes = job_shapes(job) if shaped else [(n, n, n) for n in SWEEP]
    bandwidth, latency = collective_fit(world)
    reduce_scatter_bw, gather_bw = sharded_bw_bytes_per_s(world)
    figures = {"rank": rank, "dtype": compute_dtype(mode), "shapes": [list(s) for s in shapes],
               **_compute_rates(job, shapes, dtype),
               "memory_bw_bytes_per_s": elementwise_bw_bytes_per_s(job, dtype) if shaped else memory_bw_bytes_per_s(),
               "optimizer_params_per_s": optimizer_params_per_s(job), "op_overhead_s": op_overhead_s(),
               "checkpoint_overhead_s": checkpoint_overhead_s(job) if shaped else None,
               "bus_bw_bytes_per_s": bandwidth, "latency_s": latency, "tp_collective_s": tp_collective_s(job, world, dtype, bandwidth) if shaped else None,
               "fsdp_collective_s": fsdp_collective_s(job, world, reduce_scatter_bw, gather_bw) if shaped else None,
               "reduce_scatter_bw_bytes_per_s": reduce_scatter_bw, "gather_bw_bytes_per_s": gather_bw}
    gc.collect()
    figures["baseline_bytes"] = _resident_bytes()   # the rank with its code, threads and gloo buffers, tensors freed
    return figures


def _compute_rates(job: Job, shapes, dtype: torch.dtype) -> dict:
    """Matmul and attention rates: inside the job's model where the runner can build it, else at the job's
    shapes alone (or a sweep of square shapes without a job)."""
    if not job.model.has_shape or job.model.encoder:      # (the runner's GPT builds decoders)
        return {"matmul_flops": matmul_flops(shapes, dtype),
                "attention_flops": attention_flops(job, dtype) if job.model.has_shape else None, "in_model": False}
    matmul, attention = in_model_rates(job)
    return {"matmul_flops": [matmul], "attention_flops": attention or attention_flops(job, dtype), "in_model": True}


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
    for key in ("tp_collective_s", "fsdp_collective_s"):
        if ranks[0].get(key) is not None:
            assumptions[key] = ranks[0][key]
    if ranks[0].get("checkpoint_overhead_s") is not None:
        assumptions["checkpoint_overhead_s"] = max(r["checkpoint_overhead_s"] for r in ranks)
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
                     + (f"matmuls and attention timed inside the job's model, {dtype}, forward and backward)"
                        if ranks[0].get("in_model") else
                        f"{len(ranks[0]['shapes'])} matmul shapes in {dtype}, forward and backward)"),
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
