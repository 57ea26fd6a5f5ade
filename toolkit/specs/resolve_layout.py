"""The layout of a Job resolved and checked: dp from the devices, tp, pp, vpp and cp against the model's heads,
layers and sequence, pipeline stages and their partition (toolkit.specs.resolve calls it)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .axes import model_parallel
from .errors import SpecError
from .partition import partition_blocks
from .pipeline_layout import layout_string, parse_layout
from .precision import TORCH_SEMANTICS
from .rules import (
    devices_split,
    heads_split,
    interleaved_rounds_fit,
    sequence_split,
    sp_has_tp,
    vpp_has_pp,
)
from .stages import accounted_split, check_stage_layers, chunk_layers, rank_layers

Job = Any
"""A toolkit.specs.job.Job, which calls this module (Job.resolve -> resolve_job -> resolve_layout): named here, not
imported, so that the dependency runs one way, job -> resolve -> resolve_layout."""

__all__ = ["resolve_layout", "divisors", "listing", "check_interleaved_rounds"]


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def listing(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


def check_interleaved_rounds(micro_batches: int, pp: int, vpp: int, per_step: int) -> None:
    if not interleaved_rounds_fit(micro_batches, pp):
        rounds = max(1, micro_batches // pp)
        lower, upper = micro_batches - micro_batches % pp, micro_batches + pp - micro_batches % pp
        raise SpecError(
            "parallel.vpp",
            vpp,
            f"the interleaved schedule runs the step's {micro_batches} micro-batches in rounds of "
            f"max(1, {micro_batches} // pp) = {rounds}, which must divide them (torch's "
            f"ScheduleInterleaved1F1B); use batch.global_batch = {lower * per_step} or "
            f"{upper * per_step} (micro-batches a multiple of pp = {pp}), or vpp = 1",
        )


def _layout_stages(job: Job, notes: list[str]):
    """The parallel section with Megatron's layout string turned into the chunks' stage_layers."""
    par, model = job.parallel, job.model
    counts, mtp = parse_layout(par.pipeline_layout, model.layers, par.pp * par.vpp)
    if par.stage_layers and list(par.stage_layers) != counts:
        raise SpecError(
            "parallel.pipeline_layout",
            par.pipeline_layout,
            f"gives chunks {counts} but parallel.stage_layers lists {list(par.stage_layers)}; keep one",
        )
    if mtp:
        notes.append(f"the layout's {mtp} multi-token-prediction layer(s) are not modelled (the model has none)")
    return dataclasses.replace(par, stage_layers=tuple(counts))


def _check_model_split(job: Job, notes: list[str]) -> None:
    """tp against the heads, pp and vpp against the layers, cp against the sequence."""
    model, par = job.model, job.parallel
    if not model.has_shape:
        if par.stage_layers:
            raise SpecError(
                "parallel.stage_layers", list(par.stage_layers), "needs the model's layers (give model.layers)"
            )
        return
    serving_copies_kv = (  # a serving engine keeps a copy of a kv head on each of the tp / kv_heads ranks (vLLM)
        job.workload == "inference" and model.heads % par.tp == 0 and par.tp % model.kv_heads_ == 0
    )
    if not heads_split(model, par.tp) and not serving_copies_kv:
        for heads_field, heads in (("model.heads", model.heads), ("model.kv_heads", model.kv_heads_)):
            if heads % par.tp:
                raise SpecError(
                    "parallel.tp", par.tp, f"must divide {heads_field} = {heads}; allowed: {listing(divisors(heads))}"
                )
    check_stage_layers(model.layers, par.pp, par.vpp, par.stage_layers)
    if (par.stage_layers or model.layers % (par.pp * par.vpp)) and not par.partition:  # (partition said it)
        ranks = rank_layers(model.layers, par.pp, par.vpp, par.stage_layers)
        shown = (
            ", ".join(map(str, ranks)) if len(ranks) <= 6 else f"{ranks[0]}, {ranks[1]}, ..., {ranks[-2]}, {ranks[-1]}"
        )
        notes.append(
            f"pipeline ranks hold {shown} layers"
            + (
                ""
                if par.stage_layers
                else f" ({par.pp * par.vpp} equal chunks do not divide {model.layers} layers: "
                + (
                    "the embedding and the loss count as a layer each, as Megatron-Core splits them: its layout "
                    f"{layout_string(chunk_layers(model.layers, par.pp, par.vpp))})"
                    if accounted_split(model.layers, par.pp, par.vpp)
                    else "the first and last hold fewer, as Llama 3 405B ran)"
                )
            )
        )
    if par.cp > 1:
        notes.append(
            f"context parallelism: each of cp = {par.cp} ranks keeps {model.seq_len // par.cp} tokens of "
            "a sequence and passes keys and values round a ring (Liu et al. 2023); estimated, not traced "
            "or run here (torch's needs CUDA attention kernels)"
        )
    if not sequence_split(model, par.cp):
        raise SpecError(
            "parallel.cp",
            par.cp,
            f"context parallelism cuts each sequence into 2 × cp balanced "
            f"pieces: 2 × cp must divide model.seq_len = {model.seq_len}",
        )


def _partition_stages(job: Job, notes: list[str]):
    """The parallel section with `partition` turned into the stage_layers DeepSpeed would give each stage."""
    par = job.parallel
    if par.pp == 1 or par.vpp > 1 or not job.model.has_shape:
        raise SpecError(
            "parallel.partition",
            par.partition,
            "splits a DeepSpeed pipeline's stages: needs pp > 1, vpp 1 (DeepSpeed does not interleave) "
            "and the model's shape",
        )
    blocks = partition_blocks(job.model, par.pp, par.partition, par.tp, half=job.precision.mode != "fp32")
    if par.stage_layers and tuple(par.stage_layers) != tuple(blocks):  # (a resolved job carries both, equal)
        raise SpecError(
            "parallel.partition",
            par.partition,
            f"gives stages {blocks} but parallel.stage_layers lists {list(par.stage_layers)}; keep one",
        )
    notes.append(
        f"DeepSpeed's {par.partition} partition gives the {par.pp} stages {', '.join(map(str, blocks))} blocks"
    )
    return dataclasses.replace(par, stage_layers=tuple(blocks))


def _check_experts(model, par) -> None:
    """Expert parallelism needs experts to share out, and ranks to share them: dp's (one shard group under HSDP),
    or, folded as Megatron-Core folds it, the stage's tp · cp · dp ranks as the experts' grid etp × ep × edp."""
    for name in ("ep", "etp"):
        if getattr(par, name) < 1:
            raise SpecError(f"parallel.{name}", getattr(par, name), "must be 1 or more")
    if par.ep == 1 and par.etp == 1:
        return
    name = "ep" if par.ep > 1 else "etp"
    if not model.experts:
        raise SpecError(
            f"parallel.{name}",
            getattr(par, name),
            "splits a Mixture of Experts' experts: this model has none; set it to 1",
        )
    if model.expert_ffn_ % par.etp:
        raise SpecError("parallel.etp", par.etp, f"must divide an expert's width ({model.expert_ffn_})")
    shard = par.dp // par.dp_replicate
    ranks = shard * par.tp * par.cp
    if model.experts % par.ep or ranks % (par.ep * par.etp):
        fits = [
            d
            for d in divisors(ranks // math.gcd(ranks, par.etp))
            if model.experts % d == 0 and ranks % (d * par.etp) == 0
        ]
        raise SpecError(
            "parallel.ep",
            par.ep,
            f"must divide model.experts = {model.experts}, and ep × etp = {par.ep * par.etp} the tp × cp × dp = "
            f"{ranks} ranks of a stage"
            + (" (one HSDP shard group)" if par.dp_replicate > 1 else "")
            + f" (Megatron-Core's folding); allowed: {listing(fits)}",
        )


def resolve_layout(job: Job, cluster, notes: list[str]):
    """The parallel section with dp filled in from the devices."""
    par, count = job.parallel, cluster.count
    if par.pipeline_layout is not None and job.model.has_shape:
        par = _layout_stages(job, notes)
        job = dataclasses.replace(job, parallel=par)
    if par.partition is not None:
        par = _partition_stages(job, notes)
        job = dataclasses.replace(job, parallel=par)
    _check_model_split(job, notes)
    if not vpp_has_pp(par.vpp, par.pp):
        raise SpecError("parallel.vpp", par.vpp, "interleaved stages need parallel.pp > 1; set vpp to 1 or raise pp")
    if not sp_has_tp(par.sp, par.tp):
        raise SpecError(
            "parallel.sp", True, "sequence parallelism splits over the tensor-parallel group: needs parallel.tp > 1"
        )
    replica = model_parallel(par)
    named = "tp × pp" + (" × cp" if par.cp > 1 else "")
    if par.dp is None:
        if not devices_split(count, par):
            raise SpecError(
                "parallel.tp",
                par.tp,
                f"{named} = {replica} does not divide cluster.count = {count}; "
                f"pick {named} among {listing(divisors(count))}",
            )
        par = dataclasses.replace(par, dp=count // replica)
    elif par.dp * replica != count:
        raise SpecError(
            "parallel.dp",
            par.dp,
            f"dp × {named} = {par.dp} × {par.tp} × {par.pp}{f' × {par.cp}' if par.cp > 1 else ''} = "
            f"{par.dp * replica} "
            f"but cluster.count = {count}; with these use dp = {count / replica:g}"
            if count % replica == 0
            else f"dp × {named} = {par.dp * replica} but cluster.count = {count}, "
            f"which {named} = {replica} does not divide",
        )
    if par.dp_replicate < 1 or par.dp % par.dp_replicate:
        raise SpecError(
            "parallel.dp_replicate",
            par.dp_replicate,
            f"must divide dp = {par.dp} (shards over dp / dp_replicate ranks); allowed: {listing(divisors(par.dp))}",
        )
    torch_mode = job.precision.mode is None or job.precision.mode in TORCH_SEMANTICS  # (unset: amp-bf16 or -fp16)
    hsdp_program = par.zero >= 2 and torch_mode and par.backend in (None, "torch")
    if par.dp_replicate > 1 and not hsdp_program:
        raise SpecError(
            "parallel.dp_replicate",
            par.dp_replicate,
            "HSDP replicates FSDP2's shards: needs --zero 2 or 3 with an amp-*, fp32 or pure-bf16 "
            "mode (torch's program); or set it to 1",
        )
    _check_experts(job.model, par)
    if par.tp > cluster.gpus_per_node:
        notes.append(
            f"tp = {par.tp} crosses nodes of {cluster.gpus_per_node} devices: its all-reduces run over the network"
        )
    return par
