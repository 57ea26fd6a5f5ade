"""The training loop: one Job, trained for real on accelerate (one process, or one of N ranks).

    run_training(job, "runs/demo")            # in this process (world of 1): Trainer(job, out, threads).fit()
    toolkit train job.yaml --out runs/demo --nproc 2    # N ranks through toolkit.train.launch

`Trainer` holds the run's state (program, scaler, pruner, data position, metrics) and does one step, one
evaluation and one checkpoint as methods; `fit` runs them in order. The step's layout-dependent pieces are
toolkit.program.step's, the trackers' set-up toolkit.train.trackers'.

The layout (DDP, ZeRO-1/2/3, offload, tp, sp, dp × tp) is applied by toolkit.program.parallelize, the function
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

import functools
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import latest_checkpoint, resume_key, save_checkpoint, unwritable_checkpoint
from ..checkpoint.init_weights import load_initial_weights
from ..checkpoint.run_state import checkpoint_state, first_error, load_checkpoint
from ..checkpoint.sharded import save_sharded, uses_sharded_checkpoint
from ..estimate.flops import flops_per_token
from ..launch.determinism import pinned, rank_threads, threads_note
from ..launch.device import device_type, has_gpu
from ..program.build import build_program, compile_blocks
from ..program.mesh import device_mesh, leave_one_process_group
from ..program.parallelize import dp_rank_and_size
from ..program.precision import torch_precision
from ..program.step import agree, apply_update, evaluate, forward_backward, mean_step_loss, reduce_and_clip, timeline_of
from ..program.techniques import Int8Activations, Pruner, block_matrices
from ..runs.folder import run_catalog_files, write_stage_timeline
from ..specs import Job, SpecError, load_catalog
from ..specs.job import compute_dtype
from .checks import refuse_accelerate_overrides, runner_checks
from .data import StepSampler, TokenShards, ensure_demo_corpus, make_loader, model_tokenizer
from .diverge import diagnose_nonfinite, loss_scale_underflow
from .memory_record import MemoryRecorder
from .metrics import MetricsLog, memory_reading
from .trackers import tracker_config, tracker_setup

__all__ = ["run_training", "Trainer", "RunResult", "TrainingStopped", "lr_at", "runner_checks"]


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


def _check_world(job: Job, world: int) -> None:
    """The layout's ranks must be the processes launched: refuse with the --nproc that would fit."""
    ranks = job.parallel.dp * job.parallel.tp * job.parallel.pp
    if world != ranks:
        raise SpecError(
            "parallel.dp",
            job.parallel.dp,
            f"the layout needs {ranks} processes but the run has {world}; launch with --nproc {ranks}",
        )


def _token_shards(job: Job, out: Path, cache_dir) -> tuple[TokenShards, TokenShards | None]:
    """The training shards and, with evaluation on, the held-out ones: training.data, else the demo corpus in the
    model's tokenizer (cached under cache_dir, default OUT/cache)."""
    t, spec = job.training, job.model
    demo = None if t.data else ensure_demo_corpus(cache_dir or out / "cache", model_tokenizer(job))
    data_dir = Path(t.data) if t.data else demo
    train_set = TokenShards(data_dir, "train", spec.seq_len)
    if train_set.vocab > spec.vocab:
        raise SpecError("model.vocab", spec.vocab, f"is smaller than the data's vocabulary ({train_set.vocab})")
    return train_set, TokenShards(data_dir, "val", spec.seq_len) if t.eval_every else None


def _batches(job: Job, train_set: TokenShards, dp_rank: int, dp_world: int, start_step: int):
    """This rank's micro-batches from the resumed step on: each replica its own share, the same on a rerun."""
    t = job.training
    sampler = StepSampler(
        len(train_set), job.batch.global_batch, job.batch.micro_batch, dp_rank, dp_world, t.seed, start_step, t.steps
    )
    return iter(make_loader(train_set, sampler, t.num_workers, t.prefetch))


def _peak_tflops(job: Job, catalog, device: torch.device, given: float | None) -> float | None:
    """The peak MFU is taken against: the one given, else the catalog's for the job's dtype on a GPU or a measured
    row (a GPU's peak is no CPU run's MFU)."""
    row = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    if given is None and row and (device.type == "cuda" or row.vendor == "measured"):
        peak = row.peak_flops(compute_dtype(job.precision.mode))
        given = peak / 1e12 if peak else None
    return given


def _pruned_tensors(prog, masks: dict) -> list[dict]:
    """The weights the masks act on by name, and their fp32 masters where the program keeps them."""
    named = dict(prog.raw.named_parameters())
    master_of = {}
    if prog.master:
        names = {id(p): n for n, p in prog.raw.named_parameters()}
        master_of = {names[id(p)]: m for p, m in prog.master.pairs}
    return [{n: named[n] for n in masks}, {n: master_of[n] for n in masks if n in master_of}]


def run_training(
    job: Job,
    out_dir: str | Path,
    *,
    peak_tflops: float | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> RunResult:
    """Train `job` (already validated or not) and write checkpoints and metrics under `out_dir`, with this rank's
    threads pinned and deterministic CPU kernels (toolkit.launch.determinism)."""
    threads = rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    with pinned(threads, device_type()):
        return Trainer(job, out_dir, threads, peak_tflops=peak_tflops, cache_dir=cache_dir, progress=progress).fit()


class Trainer:
    """One rank's run, torchtitan's shape: the constructor sets everything up (job, ranks, data, program, resume);
    `train_step`, `evaluate` and `save` are one step, one evaluation and one checkpoint; `fit` runs them in order
    and `close` releases what the run holds.

        trainer = Trainer(job, "runs/demo", threads=1)
        result = trainer.fit()
    """

    def __init__(
        self,
        job: Job,
        out_dir: str | Path,
        threads: int,
        *,
        peak_tflops: float | None = None,
        cache_dir=None,
        progress: bool = True,
    ):
        from accelerate import Accelerator

        self.out = out = Path(out_dir)
        self.catalog = load_catalog(*run_catalog_files(out))  # (a job on the user's own rows: OUT/catalogs)
        job, _notes = job.resolve(self.catalog)
        runner_checks(job)
        refuse_accelerate_overrides(job)
        self.job, self.threads, self.t, self.plan = job, threads, job.training, torch_precision(job.precision.mode)
        tracker_kwargs = tracker_setup(self.t.trackers, out)  # (before accelerate imports the trackers)
        # precision and layout are the job's: accelerate starts the processes and the trackers, nothing more
        self.accelerator = Accelerator(
            cpu=not has_gpu(),
            mixed_precision="no",
            dynamo_backend="no",
            log_with=list(self.t.trackers) or None,
            project_dir=str(out),
        )
        acc = self.accelerator
        self.device, self.rank, self.world = acc.device, acc.process_index, acc.num_processes
        _check_world(job, self.world)
        self.mesh = device_mesh(job, self.device.type)
        self.dp_rank, self.dp_world = dp_rank_and_size(self.mesh)
        self.train_set, self.val_set = _token_shards(job, out, cache_dir)
        self.base_mem_bytes, _ = memory_reading(self.device)  # before any weight exists: the summary's baseline
        source = job.training.init_from
        load = (lambda model: load_initial_weights(model, source)) if source else None
        self.prog = build_program(job, self.plan, self.device, self.mesh, load)
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=self.t.loss_scale,  # (DeepSpeed scales fp16)
            enabled=self.plan.loss_scaling and self.prog.engine is None,
        )
        self.pruner = (
            Pruner(self.t.pruning.method, self.t.pruning.sparsity) if self.t.pruning.method != "none" else None
        )
        self._pruned: list[dict] = []  # the tensors the masks act on, looked up once per set of masks
        self.checkpoints = _RunCheckpoints(out, acc, self.device, threads, self.t.keep_checkpoints)
        self.start_step, self.skipped_total = self.resume()
        self.metrics = MetricsLog(out / "metrics.jsonl", self.start_step) if acc.is_main_process else None
        if self.metrics and self.metrics.note:
            acc.print(f"metrics: {self.metrics.note}")
        self.compiled = False  # (training.compile: the blocks compile after the measured steps)
        self.recorder = MemoryRecorder(
            self.prog, job, self.device, self.rank, out, self.start_step, self.t.steps, stage=self.prog.pp_rank
        )
        if self.t.trackers:
            acc.init_trackers("toolkit", config=tracker_config(job), init_kwargs=tracker_kwargs)
        if self.pruner and self.t.pruning.at_step == 0 and self.start_step == 0:
            self.pruner.compute(block_matrices(self.prog.raw))
        if self.pruner and self.pruner.masks:
            self._prune()
        self.sigterm = _SigtermFlag()  # (before the DataLoader's workers fork: until they ignore it, theirs is this)
        self._set_up_steps(peak_tflops)
        self.bar = _progress(progress and acc.is_main_process, self.start_step, self.t.steps)

    def _set_up_steps(self, peak_tflops: float | None) -> None:
        """The batches from the resumed step on, the step's tokens and FLOPs, the peak MFU is taken against."""
        job = self.job
        self.batches = _batches(job, self.train_set, self.dp_rank, self.dp_world, self.start_step)
        self.tokens_per_step = job.batch.global_batch * job.model.seq_len
        self.flops_per_step = flops_per_token(job).model * self.tokens_per_step
        self.peak_tflops = _peak_tflops(job, self.catalog, self.device, peak_tflops)
        self.int8 = Int8Activations(self.prog.raw) if job.memory.act_compress == "int8" else None

    def resume(self) -> tuple[int, int]:
        """Load the newest valid checkpoint, if any: (step to start from, fp16 steps skipped so far)."""
        fresh_seed = self.t.seed + 1 + self.dp_rank  # a fresh run: dropout differs between replicas, repeatably
        return self.checkpoints.load_newest(self.job, self.catalog, self.prog, self.scaler, self.pruner, fresh_seed)

    def _prune(self) -> None:
        """Zero the pruned weights (and their fp32 masters) again."""
        if not self._pruned:
            self._pruned.extend(_pruned_tensors(self.prog, self.pruner.masks))
        for tensors in self._pruned:
            self.pruner.apply(tensors)

    def save(self, step: int) -> None:
        """The checkpoint of `step` (every rank calls it). A write that fails on any rank stops every rank with one
        line; the newest valid checkpoint stays."""
        self.checkpoints.save(step, self.job, self.prog, self.scaler, self.pruner, self.skipped_total)

    def train_step(self, step: int) -> dict:
        """One optimizer step: micro-batches, gradient reduction, clipping, the update (or an fp16 skip), masks.
        Returns the step's metrics record (without evaluation). The step itself is toolkit.program.step's, which
        the tracer runs too."""
        prog, job, t, plan, scaler = self.prog, self.job, self.t, self.plan, self.scaler
        began = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if t.compile and step not in self.recorder.steps and not self.compiled:
            compile_blocks(prog.raw)  # after the steps MemTracker measures: the estimate and they are eager
            self.compiled = True
        self.recorder.begin_step(step)
        lr = lr_at(step, t)
        for group in prog.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = forward_backward(
            prog,
            job,
            plan,
            scaler,
            self.batches,
            self.device,
            self.recorder,
            int8=self.int8,
            timeline=timeline_of(job, prog, self.mesh, self.dp_rank, step),
            on_timeline=functools.partial(write_stage_timeline, self.out),
        )
        grad_norm = float(reduce_and_clip(prog, scaler, t.grad_clip or float("inf")))
        mean_loss = mean_step_loss(loss_sum, self.world, job.parallel.pp) / job.grad_accum
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        if not plan.loss_scaling and not (math.isfinite(mean_loss) and math.isfinite(grad_norm)):
            if self.metrics:
                self.metrics.write({"step": step + 1, "loss": None, "lr": lr, "grad_norm": None, "stopped": "diverged"})
            raise TrainingStopped(diagnose_nonfinite(job, step, lr, mean_loss, grad_norm))
        skipped = apply_update(prog, scaler, scale_before, self.recorder, step)
        if prog.engine is not None:
            grad_norm = float(prog.engine.get_global_grad_norm())
        self.skipped_total += int(skipped)
        self._prune_after(step)
        self.recorder.end_step(step)
        if plan.loss_scaling and scaler.get_scale() < 1.0:
            raise TrainingStopped(loss_scale_underflow(scaler.get_scale(), step))
        return self._record(step, began, lr, mean_loss, grad_norm, scale_before, skipped)

    def _prune_after(self, step: int) -> None:
        pruner, at = self.pruner, self.t.pruning.at_step
        if pruner and at and step + 1 == at:
            pruner.compute(block_matrices(self.prog.raw))
            self._pruned.clear()
        if pruner and pruner.masks:
            self._prune()

    def _record(
        self, step: int, began: float, lr: float, mean_loss: float, grad_norm: float, scale_before, skipped: bool
    ) -> dict:
        elapsed = time.perf_counter() - began
        mem_bytes, mem_kind = memory_reading(self.device)
        tflops = self.flops_per_step / elapsed / self.world / 1e12
        record = {
            "step": step + 1,
            "loss": mean_loss if not skipped else None,
            "lr": lr,
            "tokens_per_s": self.tokens_per_step / elapsed,
            "tflops": tflops,
            "mfu": tflops / self.peak_tflops if self.peak_tflops else None,
            "mem_bytes": mem_bytes,
            "mem_kind": mem_kind,
            "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
            "loss_scale": scale_before,
            "skipped": bool(skipped),
            "time_s": elapsed,
            "wall_s": time.perf_counter() - self.loop_began,
        }
        if skipped:
            record["skipped_total"] = self.skipped_total
        if step == self.start_step:
            record["mem_base_bytes"] = self.base_mem_bytes
        return record

    def evaluate(self) -> float:
        """Mean held-out loss (see _evaluate); every rank calls it."""
        return evaluate(
            self.prog,
            self.val_set,
            self.job,
            self.plan,
            self.device,
            self.dp_rank,
            self.dp_world,
            before_forward=self.recorder.micro_batch,
        )

    def fit(self, checkpoints: bool = True) -> RunResult:
        """Steps from the resumed one to training.steps: evaluation, metrics and checkpoints at their cadence, a
        checkpoint and a stop when any rank got SIGTERM. checkpoints=False saves none (calibrate's short probe
        runs, toolkit.calibrate.device, whose final checkpoint would cost more than their steps)."""
        t, acc = self.t, self.accelerator
        self.loop_began = time.perf_counter()
        final_loss, stopped_by_signal, done = None, False, self.start_step
        self.prog.model.train()
        try:
            for step in range(self.start_step, t.steps):
                record = self.train_step(step)
                final_loss = record["loss"] if record["loss"] is not None else final_loss
                last = step + 1 == t.steps
                if self.val_set is not None and ((step + 1) % t.eval_every == 0 or last):
                    record["eval_loss"] = self.evaluate()
                if self.metrics:
                    self.metrics.write(record)
                if t.trackers:
                    acc.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step + 1)
                if self.bar:
                    self.bar.update(1)
                    shown = record["loss"] if record["loss"] is not None else float("nan")  # (an fp16 skip)
                    self.bar.set_postfix(loss=f"{shown:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
                stop = agree(self.sigterm.requested, self.device, self.world)
                if checkpoints and (last or stop or (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0)):
                    self.save(step + 1)
                done = step + 1
                if stop:
                    stopped_by_signal = True
                    acc.print(f"stopped by SIGTERM after step {step + 1}; checkpoint saved, run again to resume")
                    break
        finally:
            self.close()
        return RunResult(
            steps_done=done,
            resumed_from=self.start_step,
            stopped_by_signal=stopped_by_signal,
            final_loss=final_loss,
            out_dir=self.out,
        )

    def close(self) -> None:
        self.batches = None  # (its DataLoader workers exit now, not when they notice this rank has gone)
        self.recorder.close()
        if self.bar:
            self.bar.close()
        if self.metrics:
            self.metrics.close()
        self.sigterm.restore()
        if self.t.trackers:
            self.accelerator.end_training()
        leave_one_process_group()  # (a one-process FSDP2 run's own group; nothing otherwise)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _progress(enabled: bool, start: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, disable=None)


class _SigtermFlag:
    """SIGTERM (a scheduler's preemption, the launcher's Stop) only sets `requested`: the loop ends its step, the
    ranks agree, and the run stops after a checkpoint. `restore` puts the previous handler back."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._request) if _main_thread() else None

    def _request(self, *_) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class _RunCheckpoints:
    """This rank's part in the run's checkpoints under OUT/checkpoints: loading the newest valid one, and writing
    one with every rank (the engine's or the shards' own files, then rank 0's record)."""

    def __init__(self, out: Path, accelerator, device: torch.device, threads: int, keep: int):
        self.out, self.accelerator, self.device, self.threads, self.keep = out, accelerator, device, threads, keep
        self.rank, self.world = accelerator.process_index, accelerator.num_processes

    def load_newest(self, job: Job, catalog, prog, scaler, pruner, fresh_seed: int) -> tuple[int, int]:
        """(step to start from, fp16 steps skipped so far); a run with no valid checkpoint seeds torch with
        `fresh_seed` and starts at 0. Checkpoints of another job are refused, not loaded."""
        acc, out = self.accelerator, self.out
        state, path, problems = latest_checkpoint(out / "checkpoints", self.rank, self.world)
        for line in problems:
            acc.print(f"checkpoint: {line}")
        if state is None:
            torch.manual_seed(fresh_seed)
            return 0, 0
        if resume_key(Job.from_dict(state["job"], catalog).resolve(catalog)[0]) != resume_key(job):
            raise SpecError(
                "job",
                str(path),
                f"{out} holds checkpoints of a different job; use a new --out "
                "folder, or delete the checkpoints to start over",
            )
        start = load_checkpoint(job, prog, state, scaler, pruner, self.rank, self.world, out)
        acc.print(f"resumed from {path.name} (step {start[0]})")
        if note := threads_note(state.get("threads"), self.threads):
            acc.print(f"note: {note}")
        return start

    def save(self, step: int, job: Job, prog, scaler, pruner, skipped_total: int) -> None:
        """Every rank calls it. A write that fails on any rank stops every rank with one line (TrainingStopped);
        the newest valid checkpoint stays."""
        out, acc, world = self.out, self.accelerator, self.world
        model_sd, optim_sd, all_rng = checkpoint_state(prog, self.device, world)
        tag, sharded, failed = None, None, None
        try:
            if prog.engine is not None:  # every rank writes its partitions; the record below is written after
                from ..checkpoint.deepspeed import save_engine

                tag = save_engine(prog.engine, out / "checkpoints", step)
                acc.wait_for_everyone()
            elif uses_sharded_checkpoint(prog, world):  # every rank its shards; rank 0 gets their checksums
                sharded = save_sharded(prog, out / "checkpoints", step, self.rank)
            if acc.is_main_process:
                save_checkpoint(
                    out / "checkpoints",
                    step,
                    {
                        "step": step,
                        "skipped_total": skipped_total,
                        "job": job.to_dict(),
                        "deepspeed": tag,
                        "dcp": sharded,
                        "threads": self.threads,
                        "model": model_sd,
                        "optimizer": optim_sd,
                        "master": prog.master.state_dict() if prog.master else None,
                        "scaler": scaler.state_dict(),
                        "masks": pruner.state_dict() if pruner else None,
                        "rng": all_rng,
                    },
                    self.keep,
                )
        except OSError as err:  # a full disk, a read-only or vanished folder
            failed = err
        if agree(failed is not None, self.device, world):  # (also the ranks' meeting after the write)
            raise TrainingStopped(unwritable_checkpoint(out / "checkpoints", step, first_error(failed, world)))
