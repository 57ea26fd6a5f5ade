"""The runner's own step (toolkit.program.step), run twice under a memory tracker: what every trace measures, on
fake tensors (toolkit.trace.memory) or on gloo ranks (toolkit.trace.pipeline, toolkit.trace.zero).

    hooks = TraceHooks(tracker)
    with tracker:
        two_steps(prog, job, tracker, hooks)        # the second step is the steady one: its peak is kept
    hooks.snaps["boundary"], hooks.snaps["before_step"]

The runner records its own first two steps with the same tracker and hooks of its own
(toolkit.train.memory_record), so a trace and a run's measurement are one program measured twice.
"""

from __future__ import annotations

import contextlib

import torch

from ..program.build import Program
from ..program.instrument import snapshot
from ..program.precision import torch_precision
from ..program.step import apply_update, forward_backward, reduce_and_clip
from ..program.techniques import Int8Activations
from ..specs.job import Job

__all__ = ["random_batches", "TraceHooks", "two_steps"]


def random_batches(job: Job):
    """Token windows of the job's shape (fake under FakeTensorMode): the batch lives on the device too."""
    b, seq, vocab = job.batch.micro_batch, job.model.seq_len, job.model.vocab
    while True:
        yield torch.randint(0, vocab, (b, seq)), torch.randint(0, vocab, (b, seq))


class TraceHooks:
    """The step's recorder in a trace (toolkit.program.step): a snapshot at the last forward/backward boundary and
    one once the gradients are made, the update counted as the host's under offload, DDP's buckets (stood in for
    by toolkit.trace.ddp) synced on the last micro-batch only."""

    def __init__(self, tracker, buckets=None):
        self.tracker, self.buckets, self.snaps = tracker, buckets, {}

    def micro_batch(self, last: bool) -> None:
        self.tracker.reset_mod_stats()  # MemTracker refuses a module called twice otherwise
        if self.buckets is not None:
            self.buckets.syncing(last)

    def forward_done(self) -> None:
        self.snaps["boundary"] = snapshot(self.tracker, "current")

    def backward_done(self) -> None:
        self.snaps["before_step"] = snapshot(self.tracker, "current")
        if getattr(self.tracker, "host_bytes", None) is not None:  # offload: the host's states, gradients made
            self.snaps["host_bytes"] = self.tracker.host_bytes(self.snaps["before_step"])

    @contextlib.contextmanager
    def optimizer_step(self, step: int):  # noqa: ARG002 - the step's hook
        with self.tracker.optimizer_step():
            yield


def two_steps(prog: Program, job: Job, tracker, hooks, micro_batches: int | None = None, batches=None):
    """Two training steps of `prog` as the runner takes them, inside the caller's tracker; the peak is the second's
    (the first also creates the optimizer's states). fp16's loss scaler reads a value every step, which fake
    tensors have not: traces step unscaled (the scaler scales in place, allocating nothing)."""
    plan = torch_precision(job.precision.mode)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    int8 = Int8Activations(prog.raw) if job.memory.act_compress == "int8" else None
    batches = batches or random_batches(job)
    for step in range(2):
        if step == 1:
            tracker.reset_peak()
        forward_backward(
            prog, job, plan, scaler, batches, torch.device("cpu"), hooks, int8=int8, micro_batches=micro_batches
        )
        reduce_and_clip(prog, scaler, job.training.grad_clip or float("inf"))
        apply_update(prog, scaler, None, hooks, step)
