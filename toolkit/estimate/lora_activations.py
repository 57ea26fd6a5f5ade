"""Saved activations under LoRA and QLoRA (toolkit.estimate.activations for the rest, which dispatches here): which
tensors need a gradient decides what each block keeps, frozen weights keeping none of their inputs. Built on
toolkit.estimate.activation_terms, as activations is."""

from __future__ import annotations

import numpy as np

from ..specs.job import Job
from .activation_terms import (
    INT64_BYTES,
    ActivationBytes,
    attention_core,
    element_bytes,
    loss_bytes,
    math_path,
    norm_internal,
    norm_output,
    rank_widths,
)
from .params import projection_shapes

__all__ = ["lora_activations"]


def lora_activations(job: Job) -> ActivationBytes:
    """Saved activations with LoRA: follow which tensors need a gradient through each block.

    A frozen linear keeps only its weight (a parameter, or its 16-bit cast under autocast), never its
    input; an adapter keeps its input (for A's gradient) and A's output (for B's). The first block's
    input comes from a frozen embedding and needs no gradient, so what it keeps differs from the rest.
    """
    m = job.model
    residual = element_bytes(job)[1]
    h, b = m.hidden, job.batch.micro_batch
    tokens = b * m.seq_len
    recompute = np.asarray(job.memory.recompute)  # (arrays on the planner's layout grid: np.where below)
    selective, full = recompute == "selective", recompute == "full"
    first, rest = _lora_block(job, False), _lora_block(job, True)
    layers = first + rest * (m.layers - 1)
    # selective: backward rebuilds one block's attention core at a time; full: each block keeps its input, and
    # backward rebuilds one at a time
    kept_input = tokens * h * residual
    recompute_layer = np.where(selective, attention_core(job, tokens, b), np.where(full, rest - kept_input, 0.0))
    per_layer = np.where(full, kept_input, rest)
    layers = np.where(full, kept_input * m.layers, layers)
    head = norm_internal(job, tokens, h) + loss_bytes(job, tokens, m.vocab)  # the frozen head keeps no input
    batch = tokens * INT64_BYTES  # the token ids stay on the device
    return ActivationBytes(
        per_layer=per_layer,
        layers=np.asarray(layers),
        embedding=batch,
        head=head,
        recompute_layer=recompute_layer,
        in_flight=1.0,
        stage_layers=m.layers,
    )


def _lora_casts(job: Job, names, input_rg: bool) -> float:
    """Autocast's weight casts kept for backward: a frozen weight's if its input needs a gradient, an adapter's B
    always, its A if the input needs a gradient (QLoRA's frozen NF4 matrices keep no cast: they are dequantized
    again in backward; a frozen weight already in the autocast dtype is kept as itself, a parameter, no cast)."""
    shapes = projection_shapes(job.model)  # LoRA runs without tensor parallelism
    targets, r = set(job.finetune.targets), job.finetune.rank
    cast_frozen = input_rg and job.finetune.method != "qlora" and not job.finetune.base_16bit(job.precision.mode)
    out = sum(shapes[n][0] * shapes[n][1] for n in names) if cast_frozen else 0.0
    for n in names:
        if n in targets:
            out += r * shapes[n][1] + (r * shapes[n][0] if input_rg else 0)
    return np.where(np.asarray(element_bytes(job)[2]), 2 * out, 0.0)


def _lora_block(job: Job, rg_in: bool) -> float:
    """What one block keeps under LoRA, given whether its input needs a gradient (all blocks but the first)."""
    m = job.model
    act, _residual, amp = element_bytes(job)
    amp = np.asarray(amp)
    h, q, kv, f = rank_widths(job)
    b = job.batch.micro_batch
    tokens = b * m.seq_len
    targets = set(job.finetune.targets)
    selective = np.asarray(job.memory.recompute) == "selective"
    branch_mask = tokens * h * (act if job.memory.program == "cpu" else 1) if m.dropout > 0 else 0
    saved = len(targets) * tokens * job.finetune.rank * act  # every adapter's A output
    if rg_in:
        saved = saved + norm_internal(job, tokens, h)
    qkv_adapters = len(targets & {"q", "k", "v"})
    saved = saved + norm_output(job, tokens, h, qkv_adapters)  # kept by q/k/v adapters only
    q_rg, k_rg = rg_in or "q" in targets, rg_in or "k" in targets
    attn_rg = rg_in or bool(qkv_adapters)
    saved = saved + _lora_casts(job, ("q", "k", "v"), rg_in)
    if m.position == "rope":  # cos/sin casts kept by the rotations
        saved = saved + np.where(amp, 2 * (q_rg + k_rg) * m.seq_len * (m.head_dim_ // 2) * 2, 0.0)
    if attn_rg:
        core = attention_core(job, tokens, b)
        if math_path(job):  # explicit q·kᵀ keeps q only for k's gradient and kᵀ only for q's
            core_bytes = 4 if job.memory.attention == "flash" else act
            core = core - tokens * q * core_bytes * ((not k_rg) + (not q_rg))
        # selective recompute: the checkpointed core keeps its inputs, q, and k, v before GQA
        saved = saved + np.where(selective, tokens * (q + 2 * kv) * act, core)
    if "o" in targets:  # o's input, kept by its adapter
        copy = math_path(job) or m.position == "rope"
        saved = saved + np.where(copy or not attn_rg or selective, tokens * q * act, 0.0)
    saved = saved + _lora_casts(job, ("o",), attn_rg)
    x1_rg = attn_rg or "o" in targets
    saved = saved + (norm_internal(job, tokens, h) if x1_rg else 0)
    saved = saved + norm_output(job, tokens, h, len(targets & {"up", "gate"}))
    if m.mlp == "swiglu":
        gate_rg, up_rg = x1_rg or "gate" in targets, x1_rg or "up" in targets
        saved = saved + tokens * f * act * (gate_rg + up_rg + gate_rg + ("down" in targets))
        mlp_rg = gate_rg or up_rg
        saved = saved + _lora_casts(job, ("up", "gate"), x1_rg)
    else:
        up_rg = x1_rg or "up" in targets
        saved = saved + tokens * f * act * (up_rg + ("down" in targets))
        mlp_rg = up_rg
        saved = saved + _lora_casts(job, ("up",), x1_rg)
    saved = saved + _lora_casts(job, ("down",), mlp_rg)
    # dropout keeps its mask where its input needs a gradient: the attention and MLP branch outputs
    return saved + branch_mask * (x1_rg + (mlp_rg or "down" in targets))
