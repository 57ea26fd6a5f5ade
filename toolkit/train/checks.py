"""What the runner refuses before any process starts, checked without importing torch (a refusal takes a
fraction of a second): the capability table's verdict, missing packages, and `accelerate launch` settings
that would change the program behind the job's back."""

from __future__ import annotations

import os

from ..capability import run_refusal
from ..specs import Job, SpecError
from ..specs.job import compute_dtype

__all__ = ["runner_checks", "refuse_accelerate_overrides"]


def runner_checks(job: Job) -> None:
    """What the runner cannot do, refused before any process starts (toolkit.capability; the estimator may
    still model it), and the packages the job needs."""
    refusal = run_refusal(job)
    if refusal:
        raise SpecError(*refusal)
    if job.backend == "deepspeed":
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise SpecError(
                "parallel.backend",
                "deepspeed",
                f"{job.precision.mode} with ZeRO runs on DeepSpeed, which "
                "is not installed (pip install deepspeed); or use amp-bf16 "
                "(torch's ZeRO: FSDP2)",
            )
        import torch

        if compute_dtype(job.precision.mode) == "fp16" and not torch.cuda.is_available():
            raise SpecError(
                "precision.mode", job.precision.mode, "DeepSpeed runs fp16 on GPUs only; on CPU train mixed-bf16"
            )
    if job.optimizer.name == "adamw-8bit":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise SpecError(
                "optimizer.name",
                "adamw-8bit",
                "needs the bitsandbytes package (pip install bitsandbytes); or use adamw",
            ) from None
    import importlib.util

    for tracker in job.training.trackers:  # found, not imported: trackio reads TRACKIO_DIR at import
        if importlib.util.find_spec(tracker) is None:
            raise SpecError("training.trackers", tracker, f"is not installed (pip install {tracker})")


_ACCELERATE_SWITCHES = (
    "ACCELERATE_USE_FSDP",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_USE_MEGATRON_LM",
    "ACCELERATE_USE_PARALLELISM_CONFIG",
)


def refuse_accelerate_overrides(job: Job, environ=os.environ) -> None:
    """`accelerate launch` turns a user's default config into environment variables that would change the
    program behind the job's back (an fp32 job trained under bf16 autocast, FSDP or DeepSpeed engaged by
    accelerate); the toolkit builds precision and layout from the job, so a conflicting one is refused."""
    mode = job.precision.mode
    mixed = environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if mixed not in ("no", "" if mode == "fp32" else compute_dtype(mode)):
        raise SpecError(
            "ACCELERATE_MIXED_PRECISION",
            mixed,
            f"conflicts with precision.mode = {mode}, which the "
            "toolkit applies itself; unset it (accelerate config: mixed_precision: no)",
        )
    for name in _ACCELERATE_SWITCHES:
        if environ.get(name, "").lower() in ("1", "true", "yes"):
            raise SpecError(
                name,
                environ[name],
                "the toolkit builds the parallel layout from the job (parallel.zero, "
                "parallel.tp); unset it (accelerate config: distributed_type: MULTI_GPU or MULTI_CPU)",
            )
    if environ.get("ACCELERATE_DYNAMO_BACKEND", "no").lower() not in ("no", ""):
        raise SpecError(
            "ACCELERATE_DYNAMO_BACKEND",
            environ["ACCELERATE_DYNAMO_BACKEND"],
            "would compile the model, which the toolkit's step and its memory records do not expect; "
            "unset it (accelerate config: dynamo_backend: no)",
        )
    steps = environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    if steps not in ("1", str(job.grad_accum)):
        raise SpecError(
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
            steps,
            f"the job's accumulation comes from batch.global_batch ({job.grad_accum} micro-batches per rank); unset it",
        )
