"""Load over time: a discrete-event simulation of an engine's continuous batching with chunked prefill, giving each
request's time to first token, time per output token and end-to-end latency, and their percentiles.

    table = StepTable.of(clock, engine)              # the clock's step times, tabulated once (fast to look up)
    sim = simulate(table, arrivals(rate=8, requests=1000, input_tokens=467, output_tokens=256), engine, kv_tokens)
    sim["ttft_s"]["p99"], sim["tpot_s"]["p50"], sim["goodput_requests_per_s"]

Each step the scheduler (vLLM V1's order) gives one token to every running request past its prompt, then spends
what is left of the step's token budget on prompts (SGLang's default instead runs a batch of prompt chunks on its
own whenever one can form, the decodes waiting that step): the running ones still being prefilled first, then waiting
requests, admitted while fewer than max_num_seqs run and the KV cache holds their whole context (no preemption:
a request is admitted only with room for all its tokens). A prompt's last chunk samples its first token. The step's
time is the clock's (toolkit.estimate.serving_time) plus the engine's host time per step. Runs of decode-only steps
between two events (an arrival that could start, a request finishing) are advanced at once, so 10,000 requests take
well under a second.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = ["StepTable", "Load", "arrivals", "draw_lengths", "simulate", "stats", "latencies", "LENGTH_SHAPES"]


@dataclass(frozen=True)
class StepTable:
    """An engine step's seconds as a few numbers: a decode-only step's base time by running requests, a step with
    prompt tokens by its rows, the KV read per cached token of a decoding request, the attention work per prompt
    token per earlier token, and the host time a step adds. Taken from the clock itself (ServingClock.step_s)."""

    rows: np.ndarray
    decode_s: np.ndarray
    mixed_s: np.ndarray
    kv_s_per_token: float
    attention_s_per_pair: float
    host_s: float
    window: tuple = ()
    """(contexts, what a decoding row reads at each): a sliding window caps the cache a row reads."""
    fused: bool = True
    """One forward carries the decodes and the prompt chunk (vLLM, SGLang, TensorRT-LLM); False: two forwards
    (the toolkit's own CPU server)."""
    host_s_per_token: float = 0.0
    """Host time for each token a step streams beyond the first (the toolkit's server: a queue and a write each)."""
    host_s_per_request: float = 0.0
    """Host time before a request reaches the scheduler: added to its time to first token and end to end."""
    rows_per_decode: int = 1
    """Rows a decoding request puts through the target model a step: 1, or speculative decoding's drafts + 1."""
    draft_share: float = 0.0
    """Speculative decoding's drafting, as a share of a plain decode step of the same requests."""

    @classmethod
    def of(cls, clock, max_rows: int, host_s: float = 0.0, fused: bool = True, **host) -> StepTable:
        rows = np.unique(np.geomspace(1, max(max_rows, 2), 24).round().astype(int))
        decode = np.array([clock.token_s(clock.step_s(r, 0.0)) for r in rows])
        mixed = np.array([clock.token_s(clock.step_s(0.0, 0.0, r, 0.0, sampled=1)) for r in rows])
        long = 256.0  # (below any sliding window)
        kv = (clock.token_s(clock.step_s(1, long)) - clock.token_s(clock.step_s(1, 0.0))) / clock.windowed(long)
        contexts = np.unique(np.geomspace(1, 2**20, 64).round())
        window = (contexts, np.array([clock.windowed(c) for c in contexts]))
        pairs = (clock.token_s(clock.step_s(0, 0, 64, long, 1)) - clock.token_s(clock.step_s(0, 0, 64, 0.0, 1))) / (
            64 * long
        )
        return cls(rows, decode, mixed, max(kv, 0.0), max(pairs, 0.0), host_s, window, fused, **host)

    def read(self, contexts) -> np.ndarray:
        """The cached tokens decoding rows at `contexts` read (all of them, or a sliding window's)."""
        return np.interp(contexts, *self.window) if self.window else np.asarray(contexts, dtype=float)

    def step_s(self, decodes: int, context_tokens: float, prompt_tokens: int, prompt_pairs: float) -> float:
        """One step: `decodes` requests reading `context_tokens` cached tokens in all, plus `prompt_tokens` prompt
        tokens whose attention spans `prompt_pairs` (token, earlier token) pairs."""
        kv = self.kv_s_per_token * context_tokens + self.attention_s_per_pair * prompt_pairs
        kv += self.host_s_per_token * max(decodes - 1, 0)
        if self.rows_per_decode > 1 or self.draft_share:  # speculative decoding: verify the drafts, draft the next
            kv += self.draft_share * float(np.interp(decodes, self.rows, self.decode_s)) if decodes else 0.0
            decodes = decodes * self.rows_per_decode
        if not prompt_tokens:
            return float(np.interp(decodes, self.rows, self.decode_s)) + kv + self.host_s
        if self.fused:
            return float(np.interp(decodes + prompt_tokens, self.rows, self.mixed_s)) + kv + self.host_s
        decode = float(np.interp(decodes, self.rows, self.decode_s)) if decodes else 0.0
        return decode + float(np.interp(prompt_tokens, self.rows, self.mixed_s)) + kv + self.host_s


@dataclass(frozen=True)
class Load:
    """The requests: their prompt and output tokens, and either arrival times (open loop: a rate or a trace) or a
    number kept in flight (closed loop: a new request the moment one finishes, as a benchmark at fixed
    concurrency sends them)."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None = None
    concurrency: int | None = None
    cached_tokens: np.ndarray | None = None
    """Prompt tokens a prefix cache already holds (not prefilled; their keys are read)."""
    tokens_per_step: float = 1.0
    """Tokens a decode step makes for each request: 1, or speculative decoding's expected accepted tokens plus the
    target's own (toolkit.estimate.serving_load.spec_tokens_per_step)."""
    prefilled: bool = False
    """Disaggregated serving's decode workers: each request arrives with its prompt in the cache (moved from a
    prefill worker) and its first token made; the simulation makes the rest."""


LENGTH_SHAPES = ("fixed", "uniform", "sharegpt")
"""How request lengths spread around their means: every request the same (a fixed-length benchmark), uniform
(vLLM's and SGLang's `random` dataset), or the ShareGPT conversations engines benchmark on (SHAREGPT_PROMPT_CDF, SHAREGPT_OUTPUT_SIGMA)."""

SHAREGPT_PROMPT_CDF = ((4, 20, 50, 100, 200, 500, 1000, 1024), (0, 0.2433, 0.3908, 0.4796, 0.5683, 0.8435, 0.998, 1))
"""ShareGPT's prompts as vLLM's and SGLang's benchmarks sample them (first turns of 4-1,024 tokens, Llama-3
tokenizer): the share shorter than each length, from a 1,003-prompt histogram, mean 230 tokens; read log-linearly
between the points (benchmarks/reference/request_lengths.md, section 4.1)."""
SHAREGPT_PROMPT_MEAN = 230.0
"""The mean of SHAREGPT_PROMPT_CDF read log-linearly (the same file)."""
SHAREGPT_OUTPUT_SIGMA = 1.0
"""ShareGPT's outputs: lognormal with this σ (of ln tokens) cut to 4-2,044 tokens, mean 200 (μ 4.833): the mean is
a benchmark's, the spread assumed (coefficient of variation about 1.1, as the prompts'; no published quantiles;
benchmarks/reference/request_lengths.md, section 4.2)."""
SHAREGPT_OUTPUT_MU = 4.833
"""The μ that, with SHAREGPT_OUTPUT_SIGMA and the cut, gives the mean SHAREGPT_OUTPUT_MEAN (the same file)."""
SHAREGPT_OUTPUT_MEAN = 200.0
"""ShareGPT's mean output under vLLM's benchmark sampler (the same file, source S3: 198.1)."""


def draw_lengths(mean: int, count: int, shape: str, rng, range_ratio: float = 0.0, least: int = 1) -> np.ndarray:
    """`count` lengths of mean `mean` spread as `shape`: fixed; uniform on [r·hi, hi] with hi chosen so the mean
    stays `mean` (SGLang's random dataset with --random-range-ratio r); sharegpt_input or sharegpt_output (the
    dataset's shapes above, scaled to `mean`)."""
    if shape == "fixed":
        return np.full(count, max(mean, least), dtype=np.int64)
    if shape == "uniform":
        hi = 2.0 * mean / (1.0 + range_ratio)
        drawn = rng.uniform(range_ratio * hi, hi, count)
    elif shape == "sharegpt_input":
        tokens, shares = SHAREGPT_PROMPT_CDF
        drawn = np.exp(np.interp(rng.uniform(0.0, 1.0, count), shares, np.log(tokens))) * mean / SHAREGPT_PROMPT_MEAN
    else:
        normal = NormalDist(SHAREGPT_OUTPUT_MU, SHAREGPT_OUTPUT_SIGMA)  # of ln tokens, cut to 4-2,044 tokens
        lo, hi = normal.cdf(math.log(4)), normal.cdf(math.log(2044))
        drawn = np.exp([normal.inv_cdf(u) for u in rng.uniform(lo, hi, count)]) * mean / SHAREGPT_OUTPUT_MEAN
    return np.maximum(np.rint(drawn), least).astype(np.int64)


def arrivals(
    *,
    requests: int,
    input_tokens: int,
    output_tokens: int,
    rate: float | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    cached_tokens: int = 0,
    tokens_per_step: float = 1.0,
    lengths: str = "fixed",
    range_ratio: float = 0.0,
) -> Load:
    """`requests` with prompts and outputs of these mean lengths spread as `lengths` (draw_lengths), Poisson at
    `rate` a second (seeded) or `concurrency` in flight; `cached_tokens` of each prompt in a prefix cache (at most
    the prompt less one token); `tokens_per_step` made a decode step (speculative decoding)."""
    rng = np.random.default_rng(seed)
    ins = draw_lengths(input_tokens, requests, lengths if lengths == "fixed" else _shape(lengths, "input"), rng,
                       range_ratio)  # fmt: skip
    outs = draw_lengths(output_tokens, requests, lengths if lengths == "fixed" else _shape(lengths, "output"), rng,
                        range_ratio, least=2 if output_tokens > 1 else 1)  # fmt: skip
    cached = np.minimum(np.full(requests, cached_tokens, dtype=np.int64), np.maximum(ins - 1, 0))
    extra = {"cached_tokens": cached, "tokens_per_step": tokens_per_step}
    if rate is not None:
        gaps = rng.exponential(1.0 / rate, requests)
        return Load(ins, outs, arrival_s=np.cumsum(gaps) - gaps[0], **extra)
    return Load(ins, outs, concurrency=concurrency or 1, **extra)


def _shape(lengths: str, side: str) -> str:
    """The shape of a dataset's prompts or outputs (ShareGPT's differ)."""
    return f"{lengths}_{side}" if lengths == "sharegpt" else lengths


class _Sim:
    """Every request's progress as arrays indexed by request, the queue, the running batch and the clock."""

    def __init__(self, table: StepTable, load: Load, max_num_seqs: int, max_batched_tokens: int, kv_tokens: float,
                 mixed: bool = True):  # fmt: skip
        self.table, self.load, self.mixed = table, load, mixed
        self.max_seqs, self.budget, self.kv_tokens = max_num_seqs, max_batched_tokens, kv_tokens
        n = self.n = len(load.input_tokens)
        cached = np.zeros(n, dtype=np.int64) if load.cached_tokens is None else load.cached_tokens.astype(np.int64)
        if load.prefilled:
            cached = load.input_tokens.astype(np.int64)
        self.prompt_left = load.input_tokens.astype(np.int64) - cached
        # decode steps a request needs after its first token: fewer when each step makes more than one
        steps = np.ceil((load.output_tokens - 1) / load.tokens_per_step).astype(np.int64) + 1
        self.out_left = np.where(load.output_tokens > 1, steps, load.output_tokens).astype(np.int64)
        if load.prefilled:  # the first token came with the prompt
            self.out_left = steps - 1
        self.context = cached.astype(float)
        self.grow = load.tokens_per_step
        self.need = load.input_tokens + load.output_tokens
        self.arrive = np.full(n, np.nan) if load.arrival_s is None else load.arrival_s.astype(float).copy()
        self.first, self.done = np.full(n, np.nan), np.full(n, np.nan)
        if load.prefilled:
            self.first = self.arrive.copy()
        self.order = np.argsort(self.arrive, kind="stable") if load.arrival_s is not None else np.arange(n)
        self.waiting, self.running = deque(), []
        self.t, self.sent, self.kv_used = 0.0, 0, 0

    def run(self) -> None:
        finished = 0
        if self.load.concurrency is not None:  # closed loop: the first ones all at once
            for _ in range(min(self.load.concurrency, self.n)):
                self._send(0.0)
        while finished < self.n:
            self._arrive()
            if not self.running and not self.waiting:
                self.t = float(self.arrive[self.order[self.sent]])
                continue
            self._admit()
            if not self.running:
                raise ValueError("a request needs more KV cache than the engine holds")
            for i in self._step():
                self.running.remove(i)
                self.kv_used -= self.need[i]
                finished += 1
                if self.load.concurrency is not None and self.sent < self.n:
                    self._send(self.t)

    def _send(self, at: float) -> None:
        self.arrive[self.sent] = at
        self.waiting.append(self.sent)
        self.sent += 1

    def _arrive(self) -> None:
        """Open loop: every request whose arrival time has come joins the queue."""
        while self.load.arrival_s is not None and self.sent < self.n and self.arrive[self.order[self.sent]] <= self.t:
            self.waiting.append(int(self.order[self.sent]))
            self.sent += 1

    def _fits_next(self) -> bool:
        w = self.waiting
        return bool(w) and len(self.running) < self.max_seqs and self.kv_used + self.need[w[0]] <= self.kv_tokens

    def _admit(self) -> None:
        while self._fits_next():
            i = self.waiting.popleft()
            self.running.append(i)
            self.kv_used += self.need[i]

    def _step(self) -> list[int]:
        """One step, or a run of decode-only steps up to the next event; returns the requests that finished."""
        idx = np.array(self.running)
        decoding = idx[self.prompt_left[idx] == 0]
        if len(decoding) == len(idx):
            return self._decode_run(decoding)
        if not self.mixed:  # a prefill batch on its own: the decodes wait a step (SGLang's default)
            decoding = decoding[:0]
        room, chunks, pairs = self.budget - len(decoding), [], 0.0
        for i in idx[self.prompt_left[idx] > 0]:
            if room <= 0:
                break
            c = int(min(self.prompt_left[i], room))
            pairs += c * (self.context[i] + c / 2)
            chunks.append((i, c))
            room -= c
        prompt = sum(c for _, c in chunks)
        cached = float(self.table.read(self.context[decoding]).sum())
        self.t += self.table.step_s(len(decoding), cached, prompt, pairs)
        self._emit(decoding, 1, self.t)
        for i, c in chunks:
            self.prompt_left[i] -= c
            self.context[i] += c
            if self.prompt_left[i] == 0:  # the last chunk samples the first token
                self.first[i] = self.t
                self.out_left[i] -= 1
                if self.out_left[i] == 0:
                    self.done[i] = self.t
        return [int(i) for i in idx if self.out_left[i] == 0]

    def _decode_run(self, decoding: np.ndarray) -> list[int]:
        """Decode-only steps until a request finishes, or one waiting or arriving could start."""
        k = 1 if self._fits_next() else int(self.out_left[decoding].min())
        b = len(decoding)
        cached = self.table.read(self.context[decoding][:, None] + self.grow * np.arange(k)[None, :]).sum(axis=0)
        ends = self.t + np.cumsum(self.table.step_s(b, 0.0, 0, 0.0) + self.table.kv_s_per_token * cached)
        if b < self.max_seqs and self.load.arrival_s is not None and self.sent < self.n:
            k = min(k, int(np.searchsorted(ends, self.arrive[self.order[self.sent]])) + 1)
        self.t = float(ends[k - 1])
        self._emit(decoding, k, self.t)
        return [int(i) for i in decoding if self.out_left[i] == 0]

    def _emit(self, ids: np.ndarray, k: int, end: float) -> None:
        """`k` tokens to each of `ids`, the last at `end`; a request whose count runs out is done then."""
        self.out_left[ids] -= k
        self.context[ids] += k * self.grow
        self.done[ids[self.out_left[ids] == 0]] = end


def simulate(
    table: StepTable, load: Load, *, max_num_seqs: int, max_batched_tokens: int, kv_tokens: float, mixed: bool = True
) -> dict:
    """Run `load` through the engine (`mixed`: decodes and prompt chunks share a step; else prefill batches run on
    their own, prefill first); per-request latencies and their statistics (see `stats`)."""
    sim = _Sim(table, load, max_num_seqs, max_batched_tokens, kv_tokens, mixed)
    sim.run()
    return _result(sim, load)


def _result(st: _Sim, load: Load) -> dict:
    return latencies(st.arrive, st.first, st.done, load.output_tokens, st.table.host_s_per_request)


def latencies(arrive, first, done, outs, before_s: float = 0.0) -> dict:
    """Each request's time to first token, per output token and end to end from its arrival, first token and last
    (`before_s` of host work ahead of the scheduler added to the first and the last), their statistics, and the
    throughput over the whole span."""
    ttft = first - arrive + before_s
    tpot = np.where(outs > 1, (done - first) / np.maximum(outs - 1, 1), 0.0)
    e2e = done - arrive + before_s
    span = float(np.nanmax(done) - np.nanmin(arrive))
    return {
        "requests": int(len(outs)),
        "duration_s": span,
        "ttft_s": stats(ttft),
        "tpot_s": stats(tpot),
        "e2e_s": stats(e2e),
        "output_tokens_per_s": float(outs.sum() / span) if span > 0 else math.inf,
        "requests_per_s": float(len(outs) / span) if span > 0 else math.inf,
        "keeps_up": _keeps_up(arrive, done),
        "per_request": {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e},
    }


def _keeps_up(arrive: np.ndarray, done: np.ndarray) -> bool:
    """Whether requests finish as fast as they arrive (between the first and the last of each); where they do not,
    the queue grows without end (saturated)."""
    n = len(arrive)
    arriving, finishing = np.ptp(arrive), np.ptp(done)
    if n < 2 or arriving <= 0:
        return True
    return bool((n - 1) / max(finishing, 1e-12) >= 0.95 * (n - 1) / arriving)


def stats(values: np.ndarray) -> dict:
    """mean, p50, p90, p99 (linear interpolation, as numpy's and vLLM's benchmark's percentiles)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}
