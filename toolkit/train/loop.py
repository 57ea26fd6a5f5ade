"""The training loop: one Job, trained for real on accelerate (one process, or one of N ranks).

    run_training(job, "runs/demo")            # in this process (world of 1)
    toolkit train job.yaml --out runs/demo --nproc 2    # N ranks through toolkit.train.launch

The layout (DDP, ZeRO-1/2/3, offload, tp, sp, dp × tp) is applied by toolkit.train.parallelize, the function
the tracer uses too; accelerate only starts the processes and trackers. What a step does, in order: set the
learning rate (linear warm-up, cosine decay); for each micro-batch, forward under the precision mode's autocast
(and int8 saved activations if asked) and backward of loss / accumulation, syncing DDP gradients on the last one
only (FSDP2 reduce-scatters every one); average gradients where no DDP does (fp32 main gradients, as Megatron
does; dp × tp replicas); move 16-bit gradients to the fp32 masters (mixed-*); unscale (fp16 modes); clip and
log the global gradient norm over every placement; step,
or skip an overflowing fp16 step; write the masters back; re-apply pruning masks; one metrics line;
a checkpoint every N steps, at the end and on SIGTERM. A non-finite loss or gradient outside loss
scaling stops the run with a diagnosis instead of training on garbage. The first two steps of every
process also measure each rank's tensor memory (toolkit.train.memory_record -> memory/rank{r}.json).
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..estimate.flops import flops_per_token
from ..runs import run_catalog_files, write_stage_timeline
from ..specs import Job, SpecError, load_catalog
from ..specs.job import compute_dtype
from .checkpoint import latest_checkpoint, resume_key, save_checkpoint, unwritable_checkpoint
from .sharded_checkpoint import save_sharded, uses_sharded_checkpoint
from .checks import refuse_accelerate_overrides, runner_checks
from .data import StepSampler, TokenShards, ensure_demo_corpus, make_loader
from .determinism import pinned, rank_threads, threads_note
from .memory_record import MemoryRecorder
from .metrics import MetricsLog, memory_reading
from .optim import clip_grad_norm
from .parallel import loss_parallel
from .parallelize import device_mesh, dp_rank_and_size
from .precision import torch_precision
from .run_state import checkpoint_state, first_error, load_checkpoint
from .program import _backward, _build_program, _optimizer_step, _Program
from .techniques import Int8Activations, Pruner, block_matrices

__all__ = ["run_training", "RunResult", "TrainingStopped", "lr_at", "runner_checks"]


class TrainingStopped(Exception):
    """The run stopped on purpose (divergence, loss-scale underflow): the message says why and what to change."""


@dataclass
class RunResult:
    steps_done: int
    resumed_from: int
    stopped_by_signal: bool
    final_loss: float | None
    out_dir: Path


def lr_at(step: int, t) -> float:
    """Learning rate for 0-based optimizer step `step`: linear warm-up to t.lr, cosine to min_lr_fraction·lr."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(t.steps - t.warmup_steps - 1, 1)
    progress = min((step - t.warmup_steps) / span, 1.0)
    floor = t.lr * t.min_lr_fraction
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * progress))


def _diagnose_nonfinite(job: Job, step: int, lr: float, loss: float, grad_norm: float) -> str:
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    hints = [f"lower training.lr (now {job.training.lr:g}; try {job.training.lr / 3:.2g})"]
    if job.training.warmup_steps < 0.02 * job.training.steps:
        hints.append("lengthen training.warmup_steps")
    if job.training.grad_clip == 0:
        hints.append("turn on training.grad_clip (1.0)")
    if compute_dtype(job.precision.mode) == "fp16":
        hints.append("or use a bf16 mode, whose range is fp32's")
    return (f"{what} became {loss if what == 'loss' else grad_norm} at step {step + 1} (lr {lr:.3g}): the run diverged "
            f"and was stopped before the update. Fix: {'; '.join(hints)}. Resume from the last checkpoint after the change.")


def _pipeline_micro_batches(prog: _Program, job: Job, plan, batches, device, timeline: dict | None = None,
                            out: Path | None = None) -> torch.Tensor:
    """One step's micro-batches through the schedule; the sum of their losses on the last stage, 0 elsewhere.
    With `timeline` (the step's identity), the stage's chunks are timed from a barrier of the pipeline's ranks
    and written to OUT/pipeline/rank{stage}.json (toolkit.runs), for `toolkit pipeline --run`."""
    from .pipeline import run_schedule
    pairs = [next(batches) for _ in range(job.grad_accum)]
    tokens = torch.cat([x for x, _ in pairs]).to(device)
    targets = torch.cat([y for _, y in pairs]).to(device)
    losses: list = []
    if timeline is not None:
        dist.barrier(group=prog.stage_group)
        prog.clock.start()
    with plan.autocast(device.type):
        run_schedule(prog.schedule, job, prog.pp_rank, tokens, targets, losses)
    if timeline is not None:
        spans, step_s = prog.clock.stop()
        write_stage_timeline(out, dict(timeline, stage=prog.pp_rank, step_s=step_s, spans=spans))
    return sum((loss.detach().float() for loss in losses), torch.zeros((), device=device))


def _timeline_of(job: Job, prog: _Program, mesh, dp_rank: int, step: int) -> dict | None:
    """The identity of the timed pipeline step (the third, after the memory-recording ones; or the last of a
    shorter run), for the first pipeline's ranks only; None for every other step and rank."""
    if prog.schedule is None or step != min(2, job.training.steps - 1):
        return None
    if dp_rank != 0 or (job.parallel.tp > 1 and mesh["tp"].get_local_rank() != 0):
        return None
    schedule = "interleaved" if job.parallel.vpp > 1 else job.parallel.schedule
    return {"step": step + 1, "schedule": schedule, "stages": job.parallel.pp, "microbatches": job.grad_accum,
            "vpp": job.parallel.vpp}


def _micro_batch_context(prog: _Program, job: Job, last: bool):
    """DDP syncs gradients on the last micro-batch only; FSDP2 reduce-scatters every one (as the tracer measures);
    tensor parallelism computes the loss on vocabulary-sharded logits."""
    from torch.nn.parallel import DistributedDataParallel
    stack = contextlib.ExitStack()
    if isinstance(prog.model, DistributedDataParallel) and not last:
        stack.enter_context(prog.model.no_sync())
    if job.parallel.tp > 1:
        stack.enter_context(loss_parallel())
    return stack


def _local(loss: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor loss (tensor parallelism) as a plain tensor; anything else as it is."""
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def run_training(job: Job, out_dir: str | Path, *, peak_tflops: float | None = None, cache_dir: str | Path | None = None,
                 progress: bool = True) -> RunResult:
    """Train `job` (already validated or not) and write checkpoints and metrics under `out_dir`, with this rank's
    threads pinned and deterministic CPU kernels (toolkit.train.determinism)."""
    threads = rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    with pinned(threads, "cuda" if torch.cuda.is_available() else "cpu"):
        return _train(job, out_dir, threads, peak_tflops=peak_tflops, cache_dir=cache_dir, progress=progress)


def _train(job: Job, out_dir: str | Path, threads: int, *, peak_tflops: float | None, cache_dir, progress: bool
           ) -> RunResult:
    from accelerate import Accelerator

    out = Path(out_dir)
    catalog = load_catalog(*run_catalog_files(out))       # (a job on the user's own rows: OUT/catalogs)
    job, _notes = job.resolve(catalog)
    runner_checks(job)
    refuse_accelerate_overrides(job)
    t, spec = job.training, job.model
    plan = torch_precision(job.precision.mode)

    tracker_kwargs = tracker_setup(t.trackers, out)     # (before accelerate imports the trackers)
    # precision and layout are the job's: accelerate starts the processes and the trackers, nothing more
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no", dynamo_backend="no",
                              log_with=list(t.trackers) or None, project_dir=str(out))
    device, rank, world = accelerator.device, accelerator.process_index, accelerator.num_processes
    ranks = job.parallel.dp * job.parallel.tp * job.parallel.pp
    if world != ranks:
        raise SpecError("parallel.dp", job.parallel.dp, f"the layout needs {ranks} processes but the run has {world}; "
                                                        f"launch with --nproc {ranks}")
    mesh = device_mesh(job, device.type)
    dp_rank, dp_world = dp_rank_and_size(mesh)
    accum = job.grad_accum

    # ---- data ---------------------------------------------------------------------------------
    data_dir = Path(t.data) if t.data else ensure_demo_corpus(cache_dir or out / "cache")
    train_set = TokenShards(data_dir, "train", spec.seq_len)
    if train_set.vocab > spec.vocab:
        raise SpecError("model.vocab", spec.vocab, f"is smaller than the data's vocabulary ({train_set.vocab})")
    val_set = TokenShards(data_dir, "val", spec.seq_len) if t.eval_every else None

    # ---- model, optimizer, scaler -----------------------------------------------------------
    base_mem_bytes, _ = memory_reading(device)              # before any weight exists: the summary's baseline
    prog = _build_program(job, plan, device, mesh)
    model, raw_model, optimizer, master = prog.model, prog.raw, prog.optimizer, prog.master
    scaler = torch.amp.GradScaler(device.type, init_scale=t.loss_scale,       # (DeepSpeed scales fp16 itself)
                                  enabled=plan.loss_scaling and prog.engine is None)
    pruner = Pruner(t.pruning.method, t.pruning.sparsity) if t.pruning.method != "none" else None
    names = {id(p): n for n, p in raw_model.named_parameters()}
    master_of = {names[id(p)]: m for p, m in master.pairs} if master else {}

    # ---- resume --------------------------------------------------------------------------------
    start_step, skipped_total = 0, 0
    state, path, problems = latest_checkpoint(out / "checkpoints")
    for line in problems:
        accelerator.print(f"checkpoint: {line}")
    if state is not None:
        if resume_key(Job.from_dict(state["job"], catalog).resolve(catalog)[0]) != resume_key(job):
            raise SpecError("job", str(path), f"{out} holds checkpoints of a different job; use a new --out "
                                              "folder, or delete the checkpoints to start over")
        start_step, skipped_total = load_checkpoint(job, prog, state, scaler, pruner, rank, world, out)
        accelerator.print(f"resumed from {path.name} (step {start_step})")
        if note := threads_note(state.get("threads"), threads):
            accelerator.print(f"note: {note}")
    else:
        torch.manual_seed(t.seed + 1 + dp_rank)        # dropout differs between replicas, repeatably
    del state

    metrics = MetricsLog(out / "metrics.jsonl", start_step) if accelerator.is_main_process else None
    if metrics and metrics.note:
        accelerator.print(f"metrics: {metrics.note}")
    recorder = MemoryRecorder(prog, job, device, rank, out, start_step, t.steps, stage=prog.pp_rank)
    if t.trackers:
        accelerator.init_trackers("toolkit", config=tracker_config(job), init_kwargs=tracker_kwargs)

    pruned: list[dict] = []                  # the tensors the masks act on, looked up once per set of masks

    def prune_apply():
        if not pruned:
            named = dict(raw_model.named_parameters())
            pruned.append({n: named[n] for n in pruner.masks})
            pruned.append({n: master_of[n] for n in pruner.masks if n in master_of})
        for tensors in pruned:
            pruner.apply(tensors)

    if pruner and t.pruning.at_step == 0 and start_step == 0:
        pruner.compute(block_matrices(raw_model))
    if pruner and pruner.masks:
        prune_apply()

    # ---- the step --------------------------------------------------------------------------------
    sampler = StepSampler(len(train_set), job.batch.global_batch, job.batch.micro_batch, dp_rank, dp_world,
                          t.seed, start_step, t.steps)
    batches = iter(make_loader(train_set, sampler, t.num_workers, t.prefetch))
    tokens_per_step = job.batch.global_batch * spec.seq_len
    flops_per_step = flops_per_token(job).model * tokens_per_step
    row = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    if peak_tflops is None and row and (device.type == "cuda" or row.vendor == "measured"):   # (a GPU's peak is
        peak = row.peak_flops(compute_dtype(job.precision.mode))                               # no CPU run's MFU)
        peak_tflops = peak / 1e12 if peak else None
    int8 = Int8Activations(raw_model) if job.memory.act_compress == "int8" else None
    stop_requested = {"flag": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop_requested.update(flag=True)) \
        if _main_thread() else None

    def save(step: int) -> None:
        model_sd, optim_sd, all_rng = checkpoint_state(prog, device, world)
        tag, sharded, failed = None, None, None
        try:
            if prog.engine is not None:     # every rank writes its partitions; the record below is written after
                from .deepspeed_backend import save_engine
                tag = save_engine(prog.engine, out / "checkpoints", step)
                accelerator.wait_for_everyone()
            elif uses_sharded_checkpoint(prog, world):      # every rank its shards; rank 0 gets their checksums
                sharded = save_sharded(prog, out / "checkpoints", step, rank)
            if accelerator.is_main_process:
                save_checkpoint(out / "checkpoints", step, {
                    "step": step, "skipped_total": skipped_total, "job": job.to_dict(), "deepspeed": tag,
                    "dcp": sharded,
                    "threads": threads,
                    "model": model_sd, "optimizer": optim_sd,
                    "master": master.state_dict() if master else None, "scaler": scaler.state_dict(),
                    "masks": pruner.state_dict() if pruner else None, "rng": all_rng}, t.keep_checkpoints)
        except OSError as err:              # a full disk, a read-only or vanished folder
            failed = err
        if _agree(failed is not None, device, world):      # (also the ranks' meeting after the write)
            raise TrainingStopped(unwritable_checkpoint(out / "checkpoints", step, first_error(failed, world)))

    bar = _progress(progress and accelerator.is_main_process, start_step, t.steps)
    loop_began = time.perf_counter()
    final_loss, stopped_by_signal, done = None, False, start_step
    model.train()
    try:
        for step in range(start_step, t.steps):
            began = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            recorder.begin_step(step)
            lr = lr_at(step, t)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            if prog.schedule is not None:
                recorder.micro_batch()
                loss_sum = _pipeline_micro_batches(prog, job, plan, batches, device,
                                                   _timeline_of(job, prog, mesh, dp_rank, step), out)
            for micro in range(accum if prog.schedule is None else 0):
                inputs, targets = next(batches)
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                recorder.micro_batch()
                with _micro_batch_context(prog, job, last=micro == accum - 1):
                    with plan.autocast(device.type), (int8 or contextlib.nullcontext()):
                        loss = model(inputs, targets)
                    _backward(prog, scaler, loss, accum, last=micro == accum - 1)
                loss_sum += _local(loss.detach()).float()
            if master:
                master.grads_to_master()
            if prog.reduce_grads:
                prog.reduce_grads()
            scaler.unscale_(optimizer)
            grad_norm = (clip_grad_norm(prog.params, t.grad_clip or float("inf"), prog.stage_group, prog.counted)
                         if prog.engine is None else 0.0)             # (DeepSpeed clips inside its step)
            mean_loss = _mean_loss(loss_sum, world, job.parallel.pp) / accum
            scale_before = scaler.get_scale() if scaler.is_enabled() else None
            if not plan.loss_scaling and not (math.isfinite(mean_loss) and math.isfinite(grad_norm)):
                if metrics:
                    metrics.write({"step": step + 1, "loss": None, "lr": lr, "grad_norm": None, "stopped": "diverged"})
                raise TrainingStopped(_diagnose_nonfinite(job, step, lr, mean_loss, grad_norm))
            with recorder.optimizer_step(step):
                skipped = _optimizer_step(prog, scaler, scale_before)
            if prog.engine is not None:
                grad_norm = float(prog.engine.get_global_grad_norm())
            if master:
                master.zero_grad()
            skipped_total += int(skipped)
            if master and not skipped:
                master.master_to_model()
            if pruner and t.pruning.at_step and step + 1 == t.pruning.at_step:
                pruner.compute(block_matrices(raw_model))
                pruned.clear()
            if pruner and pruner.masks:
                prune_apply()
            recorder.end_step(step)
            if plan.loss_scaling and scaler.get_scale() < 1.0:
                raise TrainingStopped(
                    f"the fp16 loss scale fell to {scaler.get_scale():g} at step {step + 1}: gradients overflow fp16 "
                    "at every scale, so the loss diverged or activations exceed fp16's range (65504). Fix: lower "
                    "training.lr, or train in a bf16 mode (amp-bf16, mixed-bf16), whose range is fp32's.")
            elapsed = time.perf_counter() - began
            mem_bytes, mem_kind = memory_reading(device)
            tflops = flops_per_step / elapsed / world / 1e12
            record = {"step": step + 1, "loss": mean_loss if not skipped else None, "lr": lr,
                      "tokens_per_s": tokens_per_step / elapsed, "tflops": tflops,
                      "mfu": tflops / peak_tflops if peak_tflops else None,
                      "mem_bytes": mem_bytes, "mem_kind": mem_kind,
                      "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
                      "loss_scale": scale_before, "skipped": bool(skipped), "time_s": elapsed,
                      "wall_s": time.perf_counter() - loop_began}
            if skipped:
                record["skipped_total"] = skipped_total
            if step == start_step:
                record["mem_base_bytes"] = base_mem_bytes
            final_loss = mean_loss if not skipped else final_loss
            last = step + 1 == t.steps
            if val_set is not None and ((step + 1) % t.eval_every == 0 or last):
                record["eval_loss"] = _evaluate(prog, val_set, job, plan, device, dp_rank, dp_world,
                                                before_forward=recorder.micro_batch)
            if metrics:
                metrics.write(record)
            if t.trackers:
                accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step + 1)
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            stop = _agree(stop_requested["flag"], device, world)
            if last or stop or (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0):
                save(step + 1)
            done = step + 1
            if stop:
                stopped_by_signal = True
                accelerator.print(f"stopped by SIGTERM after step {step + 1}; checkpoint saved, run again to resume")
                break
    finally:
        recorder.close()
        if bar:
            bar.close()
        if metrics:
            metrics.close()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        if t.trackers:
            accelerator.end_training()
    return RunResult(steps_done=done, resumed_from=start_step, stopped_by_signal=stopped_by_signal,
                     final_loss=final_loss, out_dir=out)


def tracker_setup(trackers, out: Path) -> dict:
    """Where each tracker writes: into the run folder; returns accelerate's init_kwargs. Called before the
    Accelerator imports the trackers: trackio reads TRACKIO_DIR at import (set to OUT/trackio unless given).
    wandb without a login (no WANDB_API_KEY, no WANDB_MODE) would stop the run at an interactive prompt on
    every rank, so it logs offline there (`wandb sync` uploads later)."""
    if "trackio" in trackers:
        os.environ.setdefault("TRACKIO_DIR", str(out / "trackio"))
    kwargs = {}
    if "wandb" in trackers:
        offline = not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
        kwargs["wandb"] = {"dir": str(out), **({"mode": "offline"} if offline else {})}
    return kwargs


def tracker_config(job: Job) -> dict:
    """The job as the flat scalars trackers take (TensorBoard's hparams refuse nested dicts, lists and None):
    dotted keys, lists and None as text."""
    flat = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value if isinstance(value, (bool, int, float, str)) else str(value)
    walk("", job.to_dict())
    return flat


def _mean_loss(loss_sum: torch.Tensor, world: int, pp: int) -> float:
    """The step's loss on every rank: the mean over the ranks that computed one (all but earlier pipeline stages;
    the ranks of a tensor-parallel group hold the same value)."""
    if world == 1:
        return float(loss_sum)
    total = loss_sum.clone()
    torch.distributed.all_reduce(total)
    return float(total) / (world // pp)


def _agree(flag: bool, device, world: int) -> bool:
    """True on every rank if any rank was asked to stop (a SIGTERM may reach one process first)."""
    if world == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


@torch.no_grad()
def _evaluate(prog: _Program, val_set: TokenShards, job: Job, plan, device, rank: int, world: int,
              before_forward=lambda: None) -> float:
    """Mean loss over the same eval_batches × micro_batch held-out windows whatever the number of replicas:
    replica r takes windows r, r + world, ...; losses and counts are summed over ranks (the ranks of one
    tensor-parallel group add the same figures to both). Every rank runs the same number of forwards, as the
    collectives of FSDP2 and tensor parallelism require; a rank with no window left runs one that counts 0.
    Pipeline stages pass each batch rank to rank; only the last stage's rank counts it."""
    model = prog.raw
    model.eval()
    mb, count = job.batch.micro_batch, job.training.eval_batches * job.batch.micro_batch
    mine = [i % len(val_set) for i in range(rank, count, world)]
    forwards = math.ceil(math.ceil(count / world) / mb)
    vocab_parallel = loss_parallel if job.parallel.tp > 1 else contextlib.nullcontext
    sums = torch.zeros(2, device=device, dtype=torch.float64)
    for chunk in range(forwards):
        ids = mine[chunk * mb:(chunk + 1) * mb]
        window = torch.stack([val_set[i] for i in ids or [0]]).to(device)
        before_forward()
        with plan.autocast(device.type), vocab_parallel():
            loss = _local(_forward_loss(prog, job, plan, window[:, :-1], window[:, 1:]))
        if loss is not None:
            sums[0] += loss.double() * len(ids)
            sums[1] += len(ids)
    model.train()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(sums)
    return float(sums[0] / sums[1])


def _forward_loss(prog: _Program, job: Job, plan, tokens: torch.Tensor, targets: torch.Tensor):
    """The model's loss on one batch, without backward; None on a pipeline rank that does not hold the last chunk."""
    if prog.schedule is None:
        return prog.raw(tokens, targets)
    from .pipeline import pipeline_forward
    return pipeline_forward(prog.raw, job, prog.pp_rank, prog.stage_group, tokens, targets, plan.param_dtype,
                            prog.tp_mesh)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _progress(enabled: bool, start: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, disable=None)
