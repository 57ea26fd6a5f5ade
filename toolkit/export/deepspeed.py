"""DeepSpeed's JSON configuration for a job, as the estimate models its program: one builder, without torch, that
the runner's DeepSpeed backend, the ZeRO tracer and `toolkit export --to deepspeed` all use."""

from __future__ import annotations

from ..estimate.params import count_params
from ..specs.job import Job

__all__ = ["deepspeed_config"]


def deepspeed_config(job: Job) -> dict:
    """DeepSpeed's configuration for a mixed-* (or fp32) job with ZeRO: its micro-batch, accumulation, 16-bit mode and
    ZeRO stage, with the reduce and all-gather buckets set from training.bucket_cap_mb (as elements of the weights'
    dtype; DeepSpeed's own default, 5e8 elements, is a 1 GB bucket in 16-bit)."""
    bucket = int(job.training.bucket_cap_mb * 2**20 / job.precision.plan.weight_bytes)  # elements
    half = job.precision.plan.half
    zero = {
        "stage": job.parallel.zero,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
        "contiguous_gradients": True,
        "overlap_comm": job.overlap.grad_reduce is True,
    }  # (estimate: the same)
    if job.parallel.offload == "optimizer":  # ZeRO-Offload: fp32 states, gradients and the step on the host
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if job.parallel.zero == 3:
        # one block gathered at a time and the next one prefetched (FSDP's unit), released after each use; only
        # vectors as small as the hidden size (norms) stay whole on every rank
        block = count_params(job.model).per_layer
        zero.update(
            stage3_prefetch_bucket_size=block,
            stage3_max_live_parameters=2 * block,
            stage3_max_reuse_distance=0,
            stage3_param_persistence_threshold=job.model.hidden,
        )
    extra = {}
    if job.precision.grad_dtype == "fp32":  # fp32 accumulation: DeepSpeed's BF16 optimizer at ZeRO 0/1 (estimate)
        extra["data_types"] = {"grad_accum_dtype": "fp32"}
    if half:  # (fp32: no section, the engine keeps fp32 weights)
        extra[half] = {"enabled": True}
    return {
        **extra,
        "train_micro_batch_size_per_gpu": job.batch.micro_batch,
        "gradient_accumulation_steps": job.grad_accum or 1,
        "zero_optimization": zero,
        "gradient_clipping": job.training.grad_clip or 0.0,
        "zero_allow_untested_optimizer": True,  # the job's torch optimizer, as the runner builds it
        "zero_force_ds_cpu_optimizer": False,  # (offload: the same torch optimizer, not DeepSpeed's CPU Adam)
    }
