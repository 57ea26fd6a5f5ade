"""What one rank computes, measured where the runner's program runs it: matmul and attention rates inside the
job's own model (torch's profiler), element-wise bandwidth, the optimizer's rate, and the fixed costs of one
operation and of one checkpointed region. toolkit.calibrate runs these on every rank at once."""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from ..specs.job import Job

__all__ = [
    "SWEEP",
    "job_shapes",
    "head_shape",
    "matmul_flops",
    "half_size",
    "thin_shapes",
    "rank_spec",
    "rank_step",
    "in_model_rates",
    "kernel_totals",
    "memory_bw_bytes_per_s",
    "attention_flops",
    "elementwise_bw_bytes_per_s",
    "optimizer_params_per_s",
    "op_overhead_s",
    "ops_per_unit",
    "dispatched_ops",
    "checkpoint_overhead_s",
    "region_runs",
    "region_tail",
    "selective_op_overhead_s",
    "block_run",
    "timed_s",
]

SWEEP = (256, 512, 1024)
"""Square matmul sizes measured without a job."""
COLD_BYTES = 64 * 2**20
"""Matmul operands are cycled through this much memory, more than a CPU's last-level cache."""


def timed_s(fn, seconds: float = 0.3, least: int = 3, device: str = "cpu") -> float:
    """Median seconds of one call of fn, repeated for about `seconds` after a warm-up call; on a GPU each call
    ends when the device has run what it queued."""
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    wait()
    times, start = [], time.perf_counter()
    while len(times) < least or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def job_shapes(job: Job) -> list[tuple[int, int, int]]:
    """The (m, k, n) of the job's matmuls on one rank: q, k, v, o, the MLP and the output projection."""
    from ..estimate.steptime import block_matmul_shapes

    shapes = {tuple(int(x) for x in shape) for shape in block_matmul_shapes(job)}
    return sorted(shapes | {head_shape(job)})


def head_shape(job: Job) -> tuple[int, int, int]:
    """The (m, k, n) of the output projection on one rank: a micro-batch's tokens, hidden, vocabulary over tp."""
    return job.batch.micro_batch * job.model.seq_len, job.model.hidden, -(-job.model.vocab // job.parallel.tp)


def matmul_flops(shapes, dtype: torch.dtype, rounds: int = 3, device: str = "cpu") -> list[float]:
    """FLOP/s of each (m, k, n) linear layer as training runs it: the forward x·Wᵀ and the backward's two
    products, gy·W and gyᵀ·x, each with its operands laid out as autograd passes them. The shapes take turns
    over `rounds` rounds and each keeps its median round, so a burst of load on a shared machine spoils one
    round of every shape rather than every round of one. `device`: where they run (a GPU: "cuda")."""
    runs = []
    for m, k, n in shapes:
        # operands cycled through more memory than the caches hold: in a training step they arrive cold
        copies = max(2, int(COLD_BYTES // ((m * k + n * k + m * n) * torch.finfo(dtype).bits // 8)))
        sets = [
            tuple(torch.randn(r, c, dtype=dtype, device=device) for r, c in ((m, k), (n, k), (m, n)))
            for _ in range(copies)
        ]
        turn = iter(range(10**9))

        def linear(sets=sets, turn=turn, copies=copies):
            x, w, gy = sets[next(turn) % copies]
            x @ w.t(), gy @ w, gy.t() @ x

        runs.append((3 * 2.0 * m * k * n, linear))
    rates = [[] for _ in shapes]
    for _ in range(rounds):
        for i, (flops, linear) in enumerate(runs):
            rates[i].append(flops / timed_s(linear, seconds=0.3 / rounds, device=device))
    return [statistics.median(r) for r in rates]


def half_size(shapes, rates) -> tuple[float, float]:
    """(large-matrix FLOP/s, gemm_half_size) fitted to products' rates: each dimension x of a product runs at
    x / (x + half_size) of one rate shared by all (toolkit.estimate.steptime.thin_factor), in log space so that
    every shape weighs the same. The size is sought up to the thinnest dimension measured (beyond it the rate is
    an extrapolation)."""
    from ..estimate.steptime import thin_factor

    logs = np.log(np.asarray(rates, dtype=float))
    best = None
    for half in np.concatenate([[0.0], np.geomspace(1, min(min(shape) for shape in shapes), 300)]):
        adjusted = logs + np.log([thin_factor(m, k, n, half) for m, k, n in shapes])
        error = float(np.sum((adjusted - adjusted.mean()) ** 2))
        if best is None or error < best[0]:
            best = (error, float(np.exp(adjusted.mean())), float(half))
    return best[1], best[2]


def thin_shapes(shapes) -> list[tuple[int, int, int]]:
    """Each (m, k, n) with its rows (tokens) halved and doubled: the shapes a smaller and a larger micro-batch
    multiply, around the job's own."""
    return sorted({(max(m // 2, 1), k, n) for m, k, n in shapes} | {(2 * m, k, n) for m, k, n in shapes})


IN_MODEL_LAYERS = 4
"""Blocks of the job's model the in-model rates are timed over (fewer when the job has fewer)."""
IN_MODEL_SAMPLES = 12
"""Training steps of that model the profiler records."""
_MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}
"""The linear layers' kernels, with the positions of their two matrices among the recorded input shapes."""
_FLASH = (
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
)


def rank_spec(job: Job):
    """The job's model as one rank holds it: heads, MLP width and vocabulary over tp, tokens over cp."""
    m, par = job.model, job.parallel
    return dataclasses.replace(
        m,
        heads=m.heads // par.tp,
        kv_heads=m.kv_heads_ // par.tp,
        head_dim=m.head_dim_,
        ffn=m.ffn_ // par.tp,
        vocab=-(-m.vocab // par.tp),
        seq_len=m.seq_len // par.cp,
        max_positions=m.max_positions_,
        layers=min(m.layers, IN_MODEL_LAYERS),
    )


def rank_step(job: Job):
    """(spec, step()): this rank's share of the job's GPT (`rank_spec`, seeded weights in the job's dtype) and one
    micro-batch of random tokens through it, forward and backward under the job's autocast."""
    from ..program.model import GPT
    from ..program.precision import torch_precision

    spec, plan = rank_spec(job), torch_precision(job.precision.mode or "fp32")
    torch.manual_seed(0)
    model = GPT(spec, attention=job.memory.attention, dtype=plan.param_dtype)
    tokens = torch.randint(0, spec.vocab, (job.batch.micro_batch, spec.seq_len))

    def step():
        with plan.autocast("cpu"):
            loss = model(tokens, tokens)
        loss.backward()

    return spec, step


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

    _spec, step = rank_step(job)
    step_s = torch.tensor([timed_s(step, seconds=0.0, least=1)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(step_s, op=dist.ReduceOp.MAX)  # one stride for all: the same number of steps
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
            if event.key == _FLASH[0]:  # (batch, heads, seq, head dim); causal: half the products
                batch, heads, seq, dim = event.input_shapes[0]
                totals["attention_flops"] += 3 * 2 * 2.0 * batch * heads * seq * seq * dim / 2 * event.count
    return totals


def memory_bw_bytes_per_s(numel: int = 16 * 2**20) -> float:
    """Bytes an out-of-place add moves per second (two reads, one write), on arrays far larger than the caches."""
    x, y, out = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    return 3 * 4 * numel / timed_s(lambda: torch.add(x, y, out=out))


def attention_flops(job: Job, dtype: torch.dtype, device: str = "cpu") -> float:
    """FLOP/s of the job's fused attention (torch's SDPA, causal) forward and backward at its shape on one rank."""
    import torch.nn.functional as F

    m = job.model
    heads = max(1, m.heads // job.parallel.tp)
    q, k, v = (
        torch.randn(
            job.batch.micro_batch, heads, m.seq_len, m.head_dim_, dtype=dtype, device=device, requires_grad=True
        )
        for _ in range(3)
    )

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    flops = 3 * 2 * 2.0 * job.batch.micro_batch * heads * m.seq_len * m.seq_len * m.head_dim_ / 2  # causal half
    return flops / timed_s(run, device=device)


def elementwise_bw_bytes_per_s(job: Job, dtype: torch.dtype, device: str = "cpu") -> float:
    """Bytes per second of one block's element-wise kernels (two norms, two residual adds, the MLP activation)
    forward and backward at the job's shape, counting the bytes as the step-time model does
    (toolkit.estimate.steptime); on a GPU they are bound by memory, on a CPU often by their arithmetic."""
    import torch.nn.functional as F

    from ..estimate.elementwise import memory_bound_bytes_per_token

    m = job.model
    tokens = job.batch.micro_batch * m.seq_len
    x = torch.randn(tokens, m.hidden, dtype=dtype, device=device, requires_grad=True)
    up = torch.randn(tokens, m.ffn_ // job.parallel.tp, dtype=dtype, device=device, requires_grad=True)
    gate = torch.randn_like(up, requires_grad=True)
    kind = torch.nn.LayerNorm if m.norm == "layernorm" else torch.nn.RMSNorm
    norm = kind(m.hidden, dtype=dtype, device=device)

    def run():
        act = F.silu(gate) * up if m.mlp == "swiglu" else F.gelu(up, approximate="tanh")
        y = norm(x) + norm(x) + x + x
        (y.sum() + act.sum()).backward()

    plain = job.replace(
        memory=dataclasses.replace(job.memory, attention="flash", recompute="none"),
        model=dataclasses.replace(m, dropout=0.0, position="learned"),
        parallel=dataclasses.replace(job.parallel, sp=False),
    )
    return float(memory_bound_bytes_per_token(plain, False)) * tokens / timed_s(run, device=device)


def optimizer_params_per_s(job: Job, device: str = "cpu") -> float:
    """Parameters per second the job's optimizer (AdamW, its implementation) steps, over the model's tensors."""
    from ..estimate.phases import optimizer_impl
    from ..program.model import GPT

    decoder = job.model.has_shape and not job.model.encoder  # (the runner's GPT builds decoders)
    model = GPT(job.model) if decoder else torch.nn.Sequential(*[torch.nn.Linear(512, 512)] * 16)
    model = model.to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    impl = optimizer_impl(job)
    opt = torch.optim.AdamW(model.parameters(), foreach=impl == "foreach", fused=impl == "fused" or None)
    return sum(p.numel() for p in model.parameters()) / timed_s(opt.step, device=device)


def dispatched_ops(fn) -> int:
    """Tensor operations one call of fn dispatches (torch's dispatcher sees each: a view, a product, an add)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    count = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return count[0]


def op_overhead_s(chain: int = 200) -> float:
    """Seconds of one tensor operation's fixed cost: a chain of tiny ops forward and backward through autograd,
    over the operations it dispatches."""
    x = torch.ones(1, requires_grad=True)

    def run():
        y = x
        for _ in range(chain):
            y = y * 1.0001
        y.backward()

    return timed_s(run) / dispatched_ops(run)


def ops_per_unit(job: Job) -> float:
    """Tensor operations one op unit of the step-time model stands for (toolkit.estimate.steptime.op_units), in
    the job's own model: this rank's share (`rank_spec`), one micro-batch forward and backward in the job's
    precision, counted at the dispatcher, over the units the model counts for that micro-batch."""
    from ..estimate.steptime import op_units

    spec, step = rank_step(job)
    step()  # (the first backward makes the .grad tensors)
    plain = job.replace(memory=dataclasses.replace(job.memory, recompute="none"))
    return dispatched_ops(step) / float(op_units(plain, spec.layers, True))


def block_run(job: Job, tokens_per_rank: int):
    """(run(block), build(spec)): one forward and backward of a toolkit.program.model.Block, built as the runner
    builds the job's (its attention, its weights' dtype), on random activations of the job's micro-batch (this
    rank's tokens), with rotary tables where the job has them, under autocast for amp-* as a micro-batch runs;
    `run(block, checkpointed=True)` through torch's checkpoint (with `context_fn`: selective), `backward=False`
    the forward alone."""
    from ..program.model import Block, rope_tables
    from ..program.precision import torch_precision

    m, plan = job.model, torch_precision(job.precision.mode or "fp32")
    x = torch.randn(job.batch.micro_batch, tokens_per_rank, m.hidden, dtype=plan.param_dtype, requires_grad=True)
    rope = rope_tables(m.seq_len, m.head_dim_) if m.position == "rope" else (None, None)

    def run(block, checkpointed: bool = False, backward: bool = True, context_fn=None):
        from torch.utils.checkpoint import checkpoint, noop_context_fn

        with plan.autocast("cpu"):
            out = (
                checkpoint(block, x, *rope, use_reentrant=False, context_fn=context_fn or noop_context_fn)
                if checkpointed
                else block(x, *rope)
            )
        if backward:
            out.float().sum().backward()

    def build(spec):
        return Block(spec, job.memory.attention, False).to(plan.param_dtype)

    return run, build


def checkpoint_overhead_s(job: Job, rounds: int = 30) -> float:
    """Seconds one checkpointed region costs beyond running its forward again: torch's checkpoint (non-reentrant,
    as the runner's recompute) packs and unpacks every tensor the region saves through its hooks, records the
    rerun's graph and raises its early stop through autograd. Timed on the job's own region (its block; under
    selective recompute its attention core), in `rounds` rounds of four calls (`region_runs`): checkpointed
    forward and backward, plain forward and backward, the forward alone, and the forward's tail that the early
    stop skips. Each round after the first three (warm-up) gives checkpointed − plain − (forward − tail); the
    cost is their median. The four calls of a round see the same moments of a shared machine, and the median
    keeps the typical cost, which a run's median step pays. (A 256-wide block here: about 1 ms on 2 threads,
    1.5 ms on one; tiny regions of one-element products, which an earlier version fitted and scaled, cost a third
    of that.)"""
    runs = region_runs(job)
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - began)
    rounds_s = [
        checkpointed - plain - (forward - tail)
        for checkpointed, plain, forward, tail in zip(
            *(times[name][3:] for name in ("checkpointed", "plain", "forward", "tail"))
        )
    ]
    return max(statistics.median(rounds_s), 0.0)


def region_runs(job: Job) -> dict:
    """{checkpointed, plain, forward, tail}: calls over the job's checkpointed region (`checkpoint_overhead_s`),
    in its dtype and under its autocast as a micro-batch runs it."""
    from torch.utils.checkpoint import checkpoint

    from ..program.precision import torch_precision

    plan = torch_precision(job.precision.mode or "fp32")
    run, build = block_run(job, job.model.seq_len // job.parallel.cp)
    spec = rank_spec(job)
    block, b, s = build(spec), job.batch.micro_batch, spec.seq_len

    def autocast(fn):
        def call():
            with plan.autocast("cpu"):
                return fn()

        return call

    if job.memory.recompute != "selective":
        act = torch.randn(b, s, spec.ffn_, dtype=plan.param_dtype, requires_grad=True)
        residual = torch.randn(b, s, spec.hidden, dtype=plan.param_dtype)
        tail = (lambda: block.mlp.down(act) + residual) if region_tail(job) == "down" else (lambda: None)
        return {
            "checkpointed": lambda: run(block, checkpointed=True),
            "plain": lambda: run(block),
            "forward": lambda: run(block, backward=False),
            "tail": autocast(tail),
        }
    q = torch.randn(b, spec.heads, s, spec.head_dim_, dtype=plan.param_dtype, requires_grad=True)
    k, v = (
        torch.randn(b, spec.kv_heads_, s, spec.head_dim_, dtype=plan.param_dtype, requires_grad=True) for _ in range(2)
    )
    probs = torch.randn(b, spec.heads, s, s, dtype=plan.param_dtype, requires_grad=True)
    values = v.repeat_interleave(spec.heads // spec.kv_heads_, dim=1)
    tail = (lambda: probs @ values) if region_tail(job) == "probs-v" else (lambda: None)
    return {
        "checkpointed": autocast(
            lambda: checkpoint(block.attn.core, q, k, v, use_reentrant=False).float().sum().backward()
        ),
        "plain": autocast(lambda: block.attn.core(q, k, v).float().sum().backward()),
        "forward": autocast(lambda: block.attn.core(q, k, v)),
        "tail": autocast(tail),
    }


def region_tail(job: Job) -> str | None:
    """The last product of a checkpointed region that its recompute skips: torch's checkpoint stops once every
    tensor the backward needs is back, so a product whose output nothing in the region saves never reruns. A
    block's down projection, unless dropout follows it (its mask is saved); an eager attention core's probs·v
    (toolkit.estimate.flops counts the same)."""
    if job.memory.recompute == "selective":
        return "probs-v" if job.memory.attention == "eager" else None
    return "down" if job.model.dropout == 0 else None


def selective_op_overhead_s(job: Job, rounds: int = 30) -> float:
    """Seconds a per-op-recompute region costs beyond a plainly checkpointed one: torch's selective checkpoint
    runs every tensor operation of the region, in forward and in recompute, through a Python dispatch mode (its
    policy, its cache). Measured on the job's block checkpointed both ways, the selective policy saving nothing
    so that the same kernels run, a step of each in turn `rounds` times: the difference of their fastest steps. Both
    see the same moments of a shared machine, and a fixed cost shows best in the steps no other process slowed
    (one 256-wide block here: 1.0–1.6 ms)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def nothing_saved():
        return create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE)

    run, build = block_run(job, job.model.seq_len // job.parallel.cp)
    block = build(rank_spec(job))
    times = {False: [], True: []}
    for _ in range(rounds):
        for selective in (False, True):
            began = time.perf_counter()
            run(block, checkpointed=True, context_fn=nothing_saved if selective else None)
            times[selective].append(time.perf_counter() - began)
    return max(min(times[True][3:]) - min(times[False][3:]), 0.0)
