"""The layout rules, written once over numpy arrays: `Job.resolve` checks one layout with them and says in a
SpecError why it fails (toolkit.specs.resolve); the planner's layout grid applies all of them to 10^5 layouts at
once (`layout_valid`, used by toolkit.estimate.grid). Each takes scalars or arrays and returns booleans.
"""

from __future__ import annotations

import numpy as np

from .axes import model_parallel
from .backends import backend_masks, deepspeed_fp32
from .precision import TORCH_SEMANTICS
from .stages import uneven_fits

__all__ = [
    "heads_split",
    "devices_split",
    "sequence_split",
    "vpp_has_pp",
    "sp_has_tp",
    "batch_split",
    "interleaved_rounds_fit",
    "optimizer_offload_fits",
    "params_offload_fits",
    "adapters_fit",
    "per_op_recompute_fits",
    "layout_valid",
]


def heads_split(model, tp):
    """tp divides the attention heads and the key/value heads."""
    tp = np.asarray(tp)
    return (model.heads % tp == 0) & (model.kv_heads_ % tp == 0)


def devices_split(devices, parallel):
    """One replica's devices (tp × pp × cp, toolkit.specs.axes) divide the devices: dp is what is left."""
    return devices % np.asarray(model_parallel(parallel)) == 0


def sequence_split(model, cp):
    """Context parallelism cuts each sequence into 2 × cp balanced pieces."""
    return model.seq_len % (2 * np.asarray(cp)) == 0


def vpp_has_pp(vpp, pp):
    """Interleaved stages need pipeline stages."""
    return (np.asarray(vpp) == 1) | (np.asarray(pp) > 1)


def sp_has_tp(sp, tp):
    """Sequence parallelism splits over the tensor-parallel group."""
    return ~np.asarray(sp) | (np.asarray(tp) > 1)


def batch_split(global_batch, micro_batch, dp):
    """The global batch is whole micro-batches on every data-parallel rank."""
    return global_batch % (np.asarray(micro_batch) * np.asarray(dp)) == 0


def interleaved_rounds_fit(micro_batches, pp):
    """Whether torch's interleaved schedule can run the step's micro-batches: it groups them in rounds of
    max(1, m // pp), which must divide m (ScheduleInterleaved1F1B refuses otherwise)."""
    m = np.asarray(micro_batches)
    return m % np.maximum(1, m // np.asarray(pp)) == 0


def optimizer_offload_fits(offload, zero, torch_semantics: bool):
    """Optimizer-only offload is DeepSpeed's ZeRO-Offload (zero ≥ 1); FSDP2 offloads everything or nothing."""
    return (np.asarray(offload) != "optimizer") | (~np.asarray(torch_semantics) & (np.asarray(zero) >= 1))


def params_offload_fits(offload, zero, torch_semantics: bool):
    """Parameter offload needs sharded parameters' owners: FSDP2 at zero 2 or 3, DeepSpeed at zero 3."""
    zero = np.asarray(zero)
    return (np.asarray(offload) != "params") | (zero == 3) | (torch_semantics & (zero == 2))


def adapters_fit(tp, pp, zero):
    """LoRA/QLoRA are modelled for data-parallel replicas (zero 0 or 1)."""
    return (np.asarray(tp) == 1) & (np.asarray(pp) == 1) & (np.asarray(zero) <= 1)


def named_backend_fits(backend: str | None, mode: str, zero, tp, pp):
    """A backend the job names must be the one each layout's program follows (`backend_masks`); DeepSpeed also
    runs Megatron's layouts at zero 0 or 1 (Megatron-DeepSpeed), and fp32 with ZeRO over dp (`deepspeed_fp32`).
    Unnamed, every layout infers its own."""
    if backend is None:
        return np.asarray(True)
    megatron, deepspeed = backend_masks(mode, zero, tp, pp)
    if backend == "megatron":
        return megatron
    if backend == "deepspeed":
        return deepspeed | (megatron & (np.asarray(zero) <= 1)) | deepspeed_fp32(backend, mode, zero, tp, pp)
    return ~megatron & ~deepspeed


def per_op_recompute_fits(recompute, backend: str | None, mode: str, zero, tp, pp, plain_blocks: bool = True):
    """Per-op selective recompute is torch's checkpoint policy API (torchtitan's "op" option): Megatron's and
    DeepSpeed's programs have no such policy, and adapters or int8 packing change what a block saves."""
    megatron, deepspeed = backend_masks(mode, zero, tp, pp)
    named = np.asarray(backend in ("megatron", "deepspeed"))
    torch_program = ~megatron & ~deepspeed & ~named & ~deepspeed_fp32(backend, mode, zero, tp, pp)
    return (np.asarray(recompute) != "selective-op") | (torch_program & plain_blocks)


def replicas_fit(dp_replicate, dp, zero, torch_semantics: bool):
    """HSDP replicates FSDP2's shards: dp_replicate must divide dp, and above 1 needs ZeRO-2/3 of torch's program."""
    replicate = np.asarray(dp_replicate)
    return (np.asarray(dp) % replicate == 0) & ((replicate == 1) | (torch_semantics & (np.asarray(zero) >= 2)))


def experts_split(model, ep, dp, dp_replicate=1, tp=1, cp=1, etp=1):
    """Expert parallelism shares out a Mixture of Experts' routed experts: ep divides them, and either the shard
    group of dp (dp / dp_replicate, etp 1: the plain layout) or, folded as Megatron-Core folds it, the stage's
    tp · cp · dp ranks hold the experts' grid etp × ep × edp (etp also divides an expert's width). A dense model
    takes ep 1 and etp 1 only."""
    ep, etp = np.asarray(ep), np.asarray(etp)
    experts = model.experts if model.has_shape else 0
    width = model.expert_ffn_ if experts else 1
    shard = np.asarray(dp) // np.asarray(dp_replicate)
    plain = (etp == 1) & (shard % ep == 0)
    folded = (shard * np.asarray(tp) * np.asarray(cp) % (ep * etp) == 0) & (width % etp == 0)
    return np.where(experts > 0, (experts % ep == 0) & (plain | folded), (ep == 1) & (etp == 1))


def layout_valid(job, devices: int):
    """Every layout rule at once, for a job whose layout fields are arrays over layouts (dp = devices / tp·pp·cp)."""
    m, par, micro = job.model, job.parallel, job.batch.micro_batch
    torch_semantics = (job.precision.mode in TORCH_SEMANTICS) & ~deepspeed_fp32(
        par.backend, job.precision.mode, par.zero, par.tp, par.pp
    )
    micro_batches = job.batch.global_batch // (np.asarray(micro) * par.dp)
    rules = [
        devices_split(devices, par),
        heads_split(m, par.tp),
        sequence_split(m, par.cp),
        uneven_fits(m.layers, par.pp, par.vpp),  # the first and last chunk may hold fewer (stages.py)
        vpp_has_pp(par.vpp, par.pp),
        sp_has_tp(par.sp, par.tp),
        batch_split(job.batch.global_batch, micro, par.dp),
        (np.asarray(par.vpp) == 1) | interleaved_rounds_fit(micro_batches, par.pp),
        optimizer_offload_fits(par.offload, par.zero, torch_semantics),
        params_offload_fits(par.offload, par.zero, torch_semantics),
        named_backend_fits(par.backend, job.precision.mode, par.zero, par.tp, par.pp),
        replicas_fit(par.dp_replicate, par.dp, par.zero, torch_semantics),
        experts_split(m, par.ep, par.dp, par.dp_replicate, par.tp, par.cp, par.etp),
        per_op_recompute_fits(
            job.memory.recompute,
            par.backend,
            job.precision.mode,
            par.zero,
            par.tp,
            par.pp,
            not job.finetune.adapters and job.memory.act_compress == "none",
        ),
    ]
    if job.finetune.adapters:
        rules.append(adapters_fit(par.tp, par.pp, par.zero))
    return np.logical_and.reduce(np.broadcast_arrays(*rules))
