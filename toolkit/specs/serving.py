"""The serving section of a Job (`workload: inference`): what requests a deployment takes and how its engine stores
the model and the KV cache; and its checks.

    serving: {concurrency: 32, input_tokens: 1024, output_tokens: 256, weights: int4, kv_dtype: fp8}

The names follow vLLM's engine arguments where one exists (gpu_memory_utilization is `memory_fraction`,
max_num_batched_tokens `max_batched_tokens`, block_size `block_size`, max_model_len `max_context`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .engines import engine_defaults
from .errors import SpecError
from .fields import check_positive, check_range

__all__ = ["Serving", "resolve_serving", "WEIGHT_BITS", "KV_BYTES"]

WEIGHT_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4, "mxfp4": 4, "nvfp4": 4}
"""Bits of one stored weight before its scales (toolkit.estimate.serving adds the scales of a grouped format)."""
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, kw_only=True)
class Serving:
    concurrency: int | Literal["max"] = 1
    """Requests decoded together (continuous batching's running batch); `max`: the most the KV cache holds at
    max_context, as an offline maximum-throughput run takes."""
    input_tokens: int = 1024
    """Prompt tokens per request."""
    output_tokens: int = 256
    """Generated tokens per request."""
    max_context: int | None = None
    """Longest sequence a request may reach (vLLM's max_model_len); None = input_tokens + output_tokens."""
    weights: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4", "nvfp4"] | None = None
    """How the blocks' matrices are stored: 16-bit; fp8 (W8A8 where the device has FP8 units, else weight-only);
    int8 or int4 weight-only (GPTQ/AWQ, W4A16: 16-bit matmuls on dequantized tiles); fp4 = mxfp4 (OCP MX: an
    8-bit scale per 32, gpt-oss's format) or nvfp4 (an fp8 scale per 16), weight-only. None = the compute dtype. The
    embeddings and the output head stay 16-bit, as GPTQ and AWQ leave them."""
    group_size: int = 128
    """int4: weights sharing one 16-bit scale and one 4-bit zero point (GPTQ/AWQ's usual 128); 0 = per channel."""
    kv_dtype: Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"] = "auto"
    """KV-cache dtype (vLLM's kv_cache_dtype); auto = the compute dtype."""
    sparsity: Literal["none", "2:4"] = "none"
    """2:4: the blocks' matrices keep 2 of every 4 weights (NVIDIA's sparse tensor cores, cuSPARSELt)."""
    memory_fraction: float | None = None
    """Share of each device the engine may use (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static);
    None = the engine's default (vLLM 0.9)."""
    block_size: int | None = None
    """Tokens per KV-cache block in a paged engine (vLLM's 16, SGLang's page 1); None = the engine's."""
    max_batched_tokens: int | None = None
    """Tokens one engine step processes at most (vLLM's max_num_batched_tokens with chunked prefill): a prompt
    longer than this is prefilled in chunks, and the step's activations are sized by it. None = the engine's."""
    target_tokens_per_s: float | None = None
    """`plan --workload inference`: output tokens per second the deployment must serve."""
    target_requests_per_s: float | None = None
    """`plan --workload inference`: requests per second it must serve (instead of tokens/s)."""
    max_tpot_s: float | None = None
    """`plan --workload inference`: the slowest time per output token a plan may have (seconds); with a load, the
    goodput's bound too."""
    max_ttft_s: float | None = None
    """The slowest time to first token a request may have (seconds): the goodput's other bound."""
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    """The serving engine whose scheduler defaults (max_num_seqs, the step's token budget, host time per step)
    the simulation takes for what the job leaves unset (toolkit/data/engines.yaml, sourced and dated)."""
    max_num_seqs: int | None = None
    """Requests an engine step runs at most (vLLM's max_num_seqs, SGLang's max_running_requests, TensorRT-LLM's
    max_batch_size); None = the engine's default."""
    rate: float | None = None
    """Requests arriving a second, Poisson (vLLM's benchmark --request-rate): the load the simulation runs
    instead of a fixed concurrency."""
    requests: int = 1000
    """Requests the load simulation runs (vLLM's benchmark --num-prompts)."""
    lengths: Literal["fixed", "uniform", "random", "sharegpt"] = "fixed"
    """How the requests' prompt and output lengths spread around input_tokens and output_tokens (their means):
    all alike (a fixed-length benchmark), uniform (vLLM's and SGLang's `random` dataset; "random" is read as
    uniform), or ShareGPT's spread (the conversations engines benchmark on). vLLM's benchmark --dataset-name."""
    range_ratio: float = 0.0
    """lengths uniform: the shortest length as a share of the longest (SGLang's --random-range-ratio; 0: from one
    token up to twice the mean)."""
    host_s_per_step: float | None = None
    """The engine's CPU time per step on the critical path (s); None = the engine's (engines.yaml)."""
    prefill_workers: int = 0
    """Disaggregated serving (vLLM's and SGLang's PD disaggregation, NVIDIA Dynamo): replicas that only prefill;
    0 = aggregated (every replica does both). Each worker is one replica of tp × pp devices."""
    decode_workers: int = 0
    """Disaggregated serving: replicas that only decode, each receiving a request's KV cache from a prefill one."""
    prefix_cache_hit: float = 0.0
    """Share of each prompt already in the KV cache from an earlier request (vLLM's automatic prefix caching,
    SGLang's radix cache): it is not prefilled again."""
    spec_tokens: int = 0
    """Speculative decoding: draft tokens verified a step (MTP, EAGLE; vLLM's num_speculative_tokens)."""
    acceptance: float = 0.7
    """Speculative decoding: the chance each draft token is accepted, independently (Leviathan et al. 2023)."""
    draft_cost: float = 0.1
    """Speculative decoding: a draft token's cost as a share of a decode step of the target model (an MTP or EAGLE
    head is about one block of the target's: 1/layers; assumed 0.1)."""

    @property
    def context(self) -> int:
        """The longest sequence a request reaches."""
        return self.max_context if self.max_context is not None else self.input_tokens + self.output_tokens


def resolve_serving(
    serving: Serving, compute_dtype: str, seq_limit: int | None, notes: list[str], device=None
) -> Serving:
    """Check the section and fill its defaults: the engine's on this device (its catalog row: name and memory), the
    weight and KV dtypes from the compute dtype, the context."""
    memory_gib = device.memory_bytes / 2**30 if device is not None and device.memory_bytes else None
    engine = engine_defaults(serving.engine, device.name if device is not None else None, memory_gib)
    serving = dataclasses.replace(
        serving,
        max_batched_tokens=engine.max_batched_tokens
        if serving.max_batched_tokens is None
        else serving.max_batched_tokens,
        max_num_seqs=engine.max_num_seqs if serving.max_num_seqs is None else serving.max_num_seqs,
        memory_fraction=engine.memory_fraction if serving.memory_fraction is None else serving.memory_fraction,
        block_size=engine.block_size if serving.block_size is None else serving.block_size,
    )
    for name in ("input_tokens", "output_tokens", "block_size", "max_batched_tokens", "requests"):
        check_positive(getattr(serving, name), f"serving.{name}")
    check_positive(serving.max_num_seqs, "serving.max_num_seqs")
    check_range(serving.prefix_cache_hit, "serving.prefix_cache_hit", 0.0, 1.0, high_open=True)
    check_range(serving.range_ratio, "serving.range_ratio", 0.0, 1.0)
    if serving.lengths == "random":
        serving = dataclasses.replace(serving, lengths="uniform")
    check_range(serving.acceptance, "serving.acceptance", 0.0, 1.0)
    for name in ("prefill_workers", "decode_workers"):
        check_positive(getattr(serving, name), f"serving.{name}", allow_zero=True)
    if bool(serving.prefill_workers) != bool(serving.decode_workers):
        raise SpecError(
            "serving.prefill_workers",
            serving.prefill_workers,
            f"disaggregated serving needs both --prefill-workers and --decode-workers (got {serving.decode_workers})",
        )
    if serving.prefill_workers and serving.rate is None:
        raise SpecError(
            "serving.prefill_workers",
            serving.prefill_workers,
            "disaggregated serving is simulated under a request rate: give --rate",
        )
    check_positive(serving.spec_tokens, "serving.spec_tokens", allow_zero=True)
    check_positive(serving.draft_cost, "serving.draft_cost", allow_zero=True)
    for name in ("host_s_per_step",):
        if getattr(serving, name) is not None:
            check_positive(getattr(serving, name), f"serving.{name}", allow_zero=name == "host_s_per_step")
    check_positive(serving.group_size, "serving.group_size", allow_zero=True)
    check_range(serving.memory_fraction, "serving.memory_fraction", 0.0, 1.0, low_open=True)
    if serving.concurrency != "max":
        check_positive(serving.concurrency, "serving.concurrency")
    for name in ("target_tokens_per_s", "target_requests_per_s", "max_tpot_s", "max_ttft_s", "rate"):
        if getattr(serving, name) is not None:
            check_positive(getattr(serving, name), f"serving.{name}")
    context = serving.context
    if context < serving.input_tokens + serving.output_tokens:
        raise SpecError(
            "serving.max_context",
            context,
            f"is shorter than input_tokens + output_tokens = {serving.input_tokens + serving.output_tokens}; "
            "raise it or shorten the requests",
        )
    if seq_limit is not None and context > seq_limit:
        notes.append(
            f"serving context {context} tokens is beyond the model's {seq_limit} (its seq_len): the estimate "
            "counts it; the model may not have been trained for it"
        )
    weights = serving.weights or compute_dtype
    kv = compute_dtype if serving.kv_dtype == "auto" else serving.kv_dtype
    if weights in ("fp32",) and compute_dtype != "fp32":
        raise SpecError("serving.weights", weights, f"fp32 weights need precision fp32 (compute is {compute_dtype})")
    return dataclasses.replace(serving, weights=weights, kv_dtype=kv, max_context=context)
