"""How long a serving engine's steps take: prefill as compute-bound work at the kernels' measured rates, decode as
memory-bound work (every weight and every cached key and value read once a step at achieved bandwidth), each
product priced by whichever bound is longer; tensor parallelism's all-reduces on the collective model; and
continuous batching's steady state over concurrency (the throughput-latency curve).

    t = ServingClock(job, hw)          # a resolved serving job and its device's figures (hardware_for)
    t.prefill_s(1024)                 # one prompt alone: time to first token at no load
    t.steady(32)                      # {ttft_s, tpot_s, output_tokens_per_s, requests_per_s} at concurrency 32

The steady state: each running request needs input/output prompt tokens per token it generates, so with chunked
prefill (vLLM's default) every step carries the concurrency's decode tokens and, on average, that share of new
prompts, up to max_batched_tokens; time per output token is a step's time, stretched where the prompts need more
steps than the outputs. Quantized weights change the bytes read (toolkit.estimate.serving_memory.matrix_bits) and,
for fp8 on devices with FP8 units, the matmul rate; 2:4 sparsity doubles the matmul peak (sparse tensor cores) and
halves the bytes: both are upper bounds, since real sparse kernels reach less.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..specs.job import Job
from ..specs.serving import KV_BYTES
from .collectives import bus_bw_bytes_per_s, latency_s, ring_s
from .hardware import Assumptions, Hardware, hardware_for
from .kernels import attention_fraction, attention_kernel_of
from .kv_cache import cached_tokens, kv_width
from .mla import projection_shapes
from .moe import deepep_low_latency_s, deepep_s
from .serving_memory import matrix_bits
from .steptime import thin_factor

__all__ = ["ServingClock", "serving_hardware", "smooth_roofline_s", "KERNELS_PER_LAYER", "decode_ops_per_layer"]

KERNELS_PER_LAYER = 6
"""Kernels a serving engine runs per block besides its matmuls: two fused residual-add norms, the rotary
embedding, the cache write, the attention and the MLP's activation (vLLM's Llama: fused_add_rms_norm,
rotary_embedding, reshape_and_cache, the attention backend, silu_and_mul). Each takes at least the device's
fixed kernel time (kernels.yaml gemm_fixed_s)."""


def decode_ops_per_layer(job: Job) -> int:
    """Tensor operations toolkit.program.generate dispatches for one block on one decode step, as torch's dispatcher
    counts them (tests/serve/test_generate.py): two norms, q, k, v, o and the MLP's linears, their views and
    transposes, the cache's two writes and reads, the attention, the activation and the residual adds (26 for a
    GPT-2 block); SwiGLU's gate and product; rotary embeddings' ten operations on q and on k. What a CPU's
    per-operation cost multiplies."""
    m = job.model
    return 26 + (2 if m.mlp == "swiglu" else 0) + (20 if m.position == "rope" else 0)


DECODE_ATTENTION_FIXED_S = 18e-6
"""A paged decode-attention kernel's own time beyond streaming its cache: FlashAttention-2's paged decode on an
H100 SXM (Llama-3-70B's GQA-8, 64 sequences, page 256) took 21.1, 23.0, 28.8 and 43.6 µs at 32, 64, 128 and 256
cached tokens (onnxruntime PR 21414, 2024-08-29): 17-21 µs above its bytes at 3.0 TB/s (benchmarks/reference/
decode_kernels.md, rows A7-A10). Used on GPUs with a kernel profile, in place of the generic kernel time."""

DECODE_ATTENTION_BW_FRACTION = 0.67
"""Share of the memory's peak bandwidth a paged decode-attention kernel streams its cache at, once the cache is
large enough that its fixed time no longer shows: the slope of time against cache bytes is 2.61 TB/s for
FlashAttention-2's paged decode (GQA-8, 64 sequences, 32-256 cached tokens; onnxruntime PR 21414) and 1.91 TB/s for
FlashAttention-3's (MHA, 16 sequences, 2,000-4,000 tokens; flash-attention issue 1572), of an H100 SXM's 3.35 TB/s:
78 % and 57 %, geometric mean 67 % (benchmarks/reference/decode_kernels.md rows A7-A10, A13-A15). Used on GPUs with
a kernel profile, in place of the streaming fraction of copies (kernels.yaml memory_fraction)."""

ROOFLINE_SMOOTHING = 3.0
"""How sharply a matmul passes from memory-bound to compute-bound: its time is (t_flops^p + t_bytes^p)^(1/p), not the
larger of the two, since near the ridge neither the tensor cores nor the memory are kept busy. p = 3 reproduces 17
published kernel timings on H100/H800 (cuBLAS bf16, CUTLASS FP8, DeepGEMM dense and grouped FP8; M from 1 to 4,096;
benchmarks/reference/decode_kernels.md section 2-3) with mean |error| 6.6 %, against 9.7 % for the larger of the two,
which reads grouped expert GEMMs at the ridge 19-30 % too fast (`python benchmarks/kernel_roofline.py`)."""

DECODE_OPS_FIXED = 7
"""Operations of a decode step outside the blocks: the embedding (and learned positions), the final norm, the last
position's slice and the output projection (counted as decode_ops_per_layer is)."""


def smooth_roofline_s(flops_s, bytes_s, p: float = ROOFLINE_SMOOTHING):
    """A kernel's time from its compute-bound and memory-bound times (ROOFLINE_SMOOTHING; p = inf: the larger)."""
    longer = np.maximum(flops_s, bytes_s)
    if math.isinf(p):
        return longer
    safe = np.where(longer > 0, longer, 1.0)
    return longer * ((flops_s / safe) ** p + (bytes_s / safe) ** p) ** (1.0 / p)


def serving_hardware(job: Job, catalog) -> Hardware | None:
    """The device's figures for a serving job (hardware_for), with the FP8 matmul peak where the weights are fp8
    and the device has FP8 units (W8A8), which the training estimate takes from precision.fp8 instead."""
    hw = hardware_for(job, catalog)
    if hw is None or job.serving.weights != "fp8" or hw.matmul_peak_flops is not None:
        return hw
    fp8 = catalog.accelerator(job.cluster.accelerator).peak_flops("fp8")
    return dataclasses.replace(hw, matmul_peak_flops=fp8) if fp8 else hw


class ServingClock:
    """Step times of a resolved serving job on one replica (tp × pp devices)."""

    def __init__(self, job: Job, hw: Hardware, a: Assumptions | None = None):
        self.job, self.hw = job, hw
        self.a = a or hw.assumptions or Assumptions()
        self.prof = hw.kernels
        s, m = job.serving, job.model
        self.cb = job.precision.plan.compute_bytes
        self.weight_bits = matrix_bits(job)
        fp8 = s.weights == "fp8" and hw.matmul_peak_flops is not None
        self.peak = (hw.matmul_peak_flops if fp8 else hw.peak_flops) * (2 if s.sparsity == "2:4" else 1)
        # a serving engine under load holds its matmuls at the power limit, as a training step does (kernels.yaml)
        burst = (self.prof.gemm_fraction_fp8 if fp8 else self.prof.gemm_fraction) if self.prof else None
        self.fraction = burst * self.prof.power_limited_fraction if self.prof else None
        self.kv_bytes = KV_BYTES[s.kv_dtype]
        self.layers = math.ceil(m.layers / job.parallel.pp)

    # ---- one product, one layer ------------------------------------------------------------------
    def _matmul_s(self, rows, k, n, decoding: bool = False) -> float:
        """(rows × k)·(k × n) with stored weights: the longer of its FLOPs at the matmul rate and its bytes (the
        weights as stored, the activations in and out) at achieved bandwidth, plus the kernel's fixed time."""
        bytes_s = (k * n * self.weight_bits / 8 + rows * (k + n) * self.cb) / self.hw.memory_bw_bytes_per_s
        if self.prof is not None:
            tm, tn = self.prof.gemm_tile
            tiles = math.ceil(rows / tm) * math.ceil(n / tn)
            fill = tiles / (math.ceil(tiles / self.prof.sms) * self.prof.sms)
            return (
                smooth_roofline_s(2.0 * rows * k * n / (self.peak * self.fraction * fill), bytes_s)
                + self.prof.gemm_fixed_s
            )
        if decoding and self.a.decode_bw_bytes_per_s:  # a CPU's decode products: at their measured streaming rate
            return k * n * self.weight_bits / 8 / self.a.decode_bw_bytes_per_s
        thin = thin_factor(rows, k, n, self.a.gemm_half_size)
        return max(2.0 * rows * k * n * thin / (self.peak * self.a.gemm_fraction), bytes_s)

    def _shapes(self) -> list[tuple[int, int]]:
        """(k, n) of a block's dense products on one tensor-parallel rank, q, k and v fused and gate and up fused
        (as serving engines run them); a Mixture of Experts' shared experts as its dense MLP."""
        m, tp = self.job.model, self.job.parallel.tp
        *columns, (o_in, o_out) = projection_shapes(m)
        shapes = (
            [(columns[0][0], sum(o for _i, o in columns) / tp)]
            if m.attention_kind != "mla"
            else [(i, o / tp) for i, o in columns]
        )
        shapes.append((o_in / tp, o_out))
        f = m.shared_experts * m.shared_expert_ffn_ if m.experts else m.ffn_
        if f:
            shapes += [(m.hidden, (2 if m.mlp == "swiglu" else 1) * f / tp), (f / tp, m.hidden)]
        return shapes

    def _experts_s(self, rows: float) -> float:
        """A Mixture of Experts block's routed experts for `rows` tokens, as one grouped kernel for the up (and gate)
        products and one for the down (vLLM's fused MoE): the experts the rows touch (E·(1 − (1 − k/E)^rows), all of
        them once rows × top-k covers them) are read once each, every row's k experts' FLOPs run at the matmul rate,
        the two combined as a kernel is (smooth_roofline_s), plus its fixed time. With expert parallelism (ep > 1,
        attention data parallel over ep / tp engines stepping together) a device holds experts / ep whole experts and
        runs its share of the whole group's tokens, which DeepEP's kernels dispatch to it and combine back."""
        m, par = self.job.model, self.job.parallel
        e, k = m.experts, m.experts_per_token
        group_rows = rows * par.ep / par.tp if par.ep > 1 else rows  # each attention engine of the group brings as many
        held, f, split = (e / par.ep, m.expert_ffn_, par.ep) if par.ep > 1 else (e, m.expert_ffn_ / par.tp, 1)
        touched = held * (1 - (1 - k / e) ** group_rows)
        routed = group_rows * k / split  # rows this device's experts multiply
        total = 0.0
        for k_in, n_out in ((m.hidden, (2 if m.mlp == "swiglu" else 1) * f), (f, m.hidden)):
            weights = touched * k_in * n_out * self.weight_bits / 8
            moved = weights + routed * (k_in + n_out) * self.cb
            flops = 2.0 * routed * k_in * n_out
            if self.prof is not None:
                t = smooth_roofline_s(flops / (self.peak * self.fraction), moved / self.hw.memory_bw_bytes_per_s)
                total += t + self.prof.gemm_fixed_s
            else:
                total += max(flops / (self.peak * self.a.gemm_fraction), moved / self.hw.memory_bw_bytes_per_s)
        return total + self._dispatch_combine_s(rows)

    def _dispatch_combine_s(self, rows: float) -> float:
        """Expert parallelism's dispatch and combine of one block: this device's share of its engine's rows (rows / tp)
        sent as k copies to the experts' devices and their outputs brought back, the dispatch in FP8 where the weights
        are. Inside one node DeepEP's NVLink kernels (toolkit.estimate.moe.deepep_s); across nodes its low-latency
        RDMA kernels at the bandwidth DeepEP measured (deepep_low_latency_s), as SGLang and vLLM decode."""
        m, par = self.job.model, self.job.parallel
        if par.ep == 1:
            return 0.0
        copies = rows / par.tp * m.experts_per_token * m.hidden
        dispatch = copies * (1 if self.job.serving.weights == "fp8" else self.cb)
        combine = copies * self.cb
        if par.ep <= self.hw.gpus_per_node:
            return float(
                deepep_s(dispatch, par.ep, 1, self.hw, self.a, m) + deepep_s(combine, par.ep, 1, self.hw, self.a, m)
            )
        ll = deepep_low_latency_s(dispatch, par.ep, self.hw, "dispatch") + deepep_low_latency_s(
            combine, par.ep, self.hw, "combine"
        )
        return float(ll)  # (the measured latencies include the network hop)

    def _attention_s(self, decode_rows: float, context: float, prefill_tokens: float, prefill_context: float):
        """One layer's attention: the decoding sequences read their cached keys and values; the prompt tokens'
        attention FLOPs (causal: each sees its earlier tokens) at the fused kernel's measured rate."""
        m, tp = self.job.model, self.job.parallel.tp
        context, prefill_context = self.windowed(context), self.windowed(prefill_context)
        read_s = decode_rows * context * kv_width(m, tp) * self.kv_bytes / self._attention_bw_bytes_per_s()
        if not prefill_tokens:
            return read_s
        heads = m.heads / tp
        width = m.head_dim_ + (m.rope_head_dim or 0) + m.v_head_dim_ if m.attention_kind == "mla" else 2 * m.head_dim_
        flops = 2.0 * prefill_tokens * prefill_context * heads * width
        if self.prof is not None:
            impl = attention_kernel_of(self.prof, "torch", None)
            rate = attention_fraction(self.prof, impl, max(prefill_context, 1), m.head_dim_, True)
            rate = float(rate) * self.hw.peak_flops
        else:
            rate = self.hw.peak_flops * (self.a.attention_fraction or self.a.gemm_fraction)
        return read_s + flops / rate

    def _attention_bw_bytes_per_s(self) -> float:
        """The rate a decode-attention kernel reads the cache: DECODE_ATTENTION_BW_FRACTION of the peak on a GPU
        with a kernel profile, else the device's achieved bandwidth."""
        if self.prof is None:
            return self.hw.memory_bw_bytes_per_s
        peak = self.hw.memory_bw_bytes_per_s / self.prof.memory_fraction
        return peak * DECODE_ATTENTION_BW_FRACTION

    def windowed(self, context: float) -> float:
        """The keys a query attends over, averaged over the stage's layers: sliding-window layers see their window."""
        if not context or not self.job.model.sliding_window:
            return context
        return cached_tokens(self.job.model, context, self.job.parallel.pp) / self.layers

    def _layer_fixed_s(self, rows: float) -> float:
        """The block's other kernels: each streams the step's rows × hidden a few times, at least a kernel's time."""
        stream = 3 * rows * self.job.model.hidden * self.cb / self.hw.memory_bw_bytes_per_s
        if self.prof is not None:
            return KERNELS_PER_LAYER * max(self.prof.gemm_fixed_s, stream)
        return KERNELS_PER_LAYER * stream + decode_ops_per_layer(self.job) * self._op_s()

    def _op_s(self) -> float:
        """A CPU's fixed cost of one tensor operation outside autograd (0 on a GPU: graphs and queues hide it)."""
        a = self.a
        return a.inference_op_overhead_s if a.inference_op_overhead_s is not None else a.op_overhead_s

    def _tp_s(self, rows: float, collectives: int = 2) -> float:
        """`collectives` all-reduces of the step's rows × hidden (a block's two)."""
        tp = self.job.parallel.tp
        if tp == 1:
            return 0.0
        size = rows * self.job.model.hidden * self.cb
        bw = bus_bw_bytes_per_s(tp, 1, self.hw, self.a)
        lat = (
            self.a.tp_collective_s
            if self.a.tp_collective_s is not None
            else latency_s(tp, 1, self.hw.gpus_per_node, self.a)
        )
        return collectives * float(lat + ring_s(2, size, tp, bw))

    # ---- a step -------------------------------------------------------------------------------------
    def step_s(
        self,
        decode_rows: float,
        context: float,
        prefill_tokens: float = 0.0,
        prefill_context: float = 0.0,
        sampled: float | None = None,
    ) -> float:
        """One engine step on one pipeline stage's layers (the busiest), with the output projection: `decode_rows`
        sequences at mean `context` tokens, plus `prefill_tokens` prompt tokens at mean `prefill_context`."""
        m = self.job.model
        rows = decode_rows + prefill_tokens
        decoding = not prefill_tokens
        layer = sum(self._matmul_s(rows, k, n, decoding) for k, n in self._shapes())
        layer += self._attention_s(decode_rows, context, prefill_tokens, prefill_context)
        if decode_rows and self.prof is not None:  # the decode attention's own launch (DECODE_ATTENTION_FIXED_S)
            layer += max(DECODE_ATTENTION_FIXED_S - self.prof.gemm_fixed_s, 0.0)
        layer += self._layer_fixed_s(rows) + self._tp_s(rows)
        moe = self._experts_s(rows) if m.experts else 0.0
        blocks = self.layers * layer + max(self.layers - math.ceil(m.dense_layers / self.job.parallel.pp), 0) * moe
        head_rows = decode_rows if sampled is None else sampled
        fixed = DECODE_OPS_FIXED * self._op_s() if self.prof is None else 0.0
        head = self._matmul_s(max(head_rows, 1), m.hidden, m.vocab / self.job.parallel.tp, decoding)
        # the vocabulary-parallel embedding's all-reduce and the sampled rows' logits gathered (vLLM's, the runner's)
        ends = self._tp_s(rows, 1) + self._tp_s(max(head_rows, 1) * m.vocab / m.hidden, 1)
        return blocks + head + fixed + ends

    def token_s(self, stage_s: float) -> float:
        """A token's pass through every pipeline stage, with a point-to-point hop between stages."""
        pp = self.job.parallel.pp
        return pp * stage_s + (pp - 1) * self.a.latency_inter_s

    def prefill_s(self, tokens: int, batch: int = 1) -> float:
        """`batch` prompts of `tokens` together (one alone: time to first token at no load), in steps of at most
        max_batched_tokens, each prompt's chunk attending over its earlier chunks."""
        chunk = max(min(self.job.serving.max_batched_tokens // batch, tokens), 1)
        total, done = 0.0, 0
        while done < tokens:
            size = min(chunk, tokens - done)
            total += self.token_s(self.step_s(0, 0, batch * size, done + size / 2, sampled=batch))
            done += size
        return total

    def steady(self, concurrency: int) -> dict:
        """Continuous batching at `concurrency` running requests (see the module's docstring)."""
        s = self.job.serving
        inp, out, budget = s.input_tokens, s.output_tokens, s.max_batched_tokens
        prefill_per_step = concurrency * inp / out
        rows = concurrency + prefill_per_step
        stretch = max(rows / budget, 1.0)  # steps per output token where the prompts need more than one
        rows, prefill = min(rows, budget), min(prefill_per_step, max(budget - concurrency, 1))
        decode = min(concurrency, budget)
        pp = self.job.parallel.pp  # pp groups of the requests in flight, one on each stage
        step = self.token_s(self.step_s(decode / pp, inp + out / 2, prefill / pp, inp / 2))
        tpot = step * stretch
        wait = math.ceil(inp / max(budget - concurrency, 1)) * step
        ttft = max(self.prefill_s(inp), wait)
        return {
            "concurrency": concurrency,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "output_tokens_per_s": concurrency / tpot,
            "requests_per_s": concurrency / tpot / out,
            "step_tokens": rows,
        }

    def curve(self, largest: int) -> list[dict]:
        """The steady state at 1, 2, 4, ... running requests up to `largest` (and at `largest`)."""
        points = [2**i for i in range(int(np.log2(max(largest, 1))) + 1)]
        if points[-1] != largest:
            points.append(largest)
        return [self.steady(c) for c in points]
