"""`toolkit bench`: load a live OpenAI-compatible endpoint (vLLM, SGLang, trtllm-serve, our own server) and measure
time to first token, inter-token latency, time per output token and throughput the way vLLM's benchmark_serving
does, so figures from different servers compare with each other and with the estimate.

    run_bench("http://127.0.0.1:8000/v1", "gpt2", rate=4.0, requests=40)    # Poisson arrivals, 4 requests/s
    run_bench(url, model, concurrency=8)                                    # 8 requests always in flight

Each request is a streamed POST /v1/completions whose prompt is a list of token ids, so the input length is exact
(no tokenizer on our side, no text that tokenizes differently on each server), with `max_tokens` and
`ignore_eos: true`, so the output length is exact too. Arrivals are Poisson at a rate, a fixed number in flight, or
the offsets of a trace (a JSONL dataset with `arrival_s`). Standard library only: the bench runs wherever Python
does, beside the server or far from it.

Imports: nothing of the toolkit.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import platform
import random
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["BenchError", "run_bench", "write_bench", "bench_text"]

TOOL = "toolkit bench: streamed OpenAI /v1/completions, vLLM benchmark_serving's protocol"
BENCH_FILE = "bench.json"


class BenchError(Exception):
    """No request completed: the message is one line naming the URL, the first error and what to do."""


@dataclasses.dataclass
class _Request:
    """One request: what it asks for (planned before the bench starts) and what it measured."""

    input_tokens: int
    output_tokens: int
    prompt: list[int]
    arrival_s: float | None = None
    send_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None


def _percentile(sorted_values: list[float], q: float) -> float:
    """numpy's percentile(method="linear") on sorted values: the point (n-1)*q/100 of the way, interpolated."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict:
    """mean, p50, p90, p99 and count, the summary benchmark_serving prints (None for no values)."""
    ordered = sorted(values)
    if not ordered:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "count": 0}
    summary = {f"p{q}": _percentile(ordered, q) for q in (50, 90, 99)}
    return {"mean": sum(ordered) / len(ordered), **summary, "count": len(ordered)}


def _read_dataset(path: str) -> list[dict]:
    """The JSONL rows (`input_tokens`, `output_tokens`, optional `arrival_s`), blank lines skipped."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"dataset {path} has no rows")
    for i, row in enumerate(rows):
        if not {"input_tokens", "output_tokens"} <= row.keys():
            raise ValueError(f"dataset {path} row {i + 1} lacks input_tokens or output_tokens: {row}")
    return rows


def _plan(rate, input_tokens, output_tokens, requests, dataset, vocab, seed) -> tuple[list[_Request], str | None]:
    """The requests, their prompts and arrival offsets drawn before the bench starts, so a seed fixes them all
    whatever order the threads run in; the mode is "trace" when every dataset row has `arrival_s`."""
    rng = random.Random(seed)
    rows = _read_dataset(dataset)[:requests] if dataset else [{}] * requests
    shapes = [(int(r.get("input_tokens", input_tokens)), int(r.get("output_tokens", output_tokens))) for r in rows]
    plan = [_Request(i, o, [rng.randrange(1, vocab) for _ in range(i)]) for i, o in shapes]
    if dataset and all("arrival_s" in r for r in rows):
        for req, row in zip(plan, rows):
            req.arrival_s = float(row["arrival_s"])
        return plan, "trace"
    if rate is not None:
        clock_s = 0.0
        for req in plan:
            clock_s += rng.expovariate(rate)
            req.arrival_s = clock_s
    return plan, None


def _is_token(choice: dict) -> bool:
    """A streamed choice carries a token when it has text or token ids, or no finish_reason (a token whose text the
    server's detokenizer still holds back); an empty chunk that only says why it finished is not one."""
    return bool(choice.get("text") or choice.get("token_ids") or choice.get("finish_reason") is None)


def _connect(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the endpoint's host and the /completions path under its base path."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.netloc, timeout=timeout_s), parts.path.rstrip("/") + "/completions"


def _stream(response: http.client.HTTPResponse) -> tuple[list[float], int | None]:
    """The arrival time of each token-carrying SSE chunk and the server's `usage.completion_tokens` if it sent one."""
    arrivals_s, usage = [], None
    for raw in iter(response.readline, b""):
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        now_s = time.perf_counter()
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"server error in stream: {chunk['error']}")
        if chunk.get("choices") and _is_token(chunk["choices"][0]):
            arrivals_s.append(now_s)
        if chunk.get("usage") and chunk["usage"].get("completion_tokens") is not None:
            usage = int(chunk["usage"]["completion_tokens"])
    return arrivals_s, usage


def _send(req: _Request, url: str, model: str, timeout_s: float, start_s: float) -> None:
    """Send one request and fill in its times; any failure is kept as the request's error, never raised, so one
    bad request does not end the bench."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.output_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}  # fmt: skip
    sent_s = time.perf_counter()
    req.send_s = sent_s - start_s
    try:
        conn, path = _connect(url, timeout_s)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                text = response.read(300).decode("utf-8", "replace")
                raise RuntimeError(f"HTTP {response.status} {response.reason}: {text}")
            arrivals_s, usage = _stream(response)
        finally:
            conn.close()
        if not arrivals_s:
            raise RuntimeError("the stream ended with no token")
    except Exception as e:  # every failure is a measurement, kept with its request
        req.error = " ".join(f"{type(e).__name__}: {e}".split())
        return
    req.output_tokens = usage if usage is not None else len(arrivals_s)
    req.ttft_s = arrivals_s[0] - sent_s
    req.e2e_s = arrivals_s[-1] - sent_s
    req.itl_s = [b - a for a, b in zip(arrivals_s, arrivals_s[1:])]
    if req.output_tokens > 1:
        req.tpot_s = (arrivals_s[-1] - arrivals_s[0]) / (req.output_tokens - 1)


def _by_arrival(plan: list[_Request], send) -> None:
    """Send each request at its arrival offset on its own thread, however many are still in flight (open loop:
    a slow server does not slow the arrivals)."""
    start_s = time.perf_counter()
    threads = []
    for req in plan:
        time.sleep(max(0.0, start_s + req.arrival_s - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(req,), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()


def _in_flight(plan: list[_Request], send, concurrency: int) -> None:
    """`concurrency` workers each send the next request as soon as their last one ends (closed loop)."""
    queue, lock = iter(plan), threading.Lock()

    def worker():
        while True:
            with lock:
                req = next(queue, None)
            if req is None:
                return
            send(req)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()


def _check(rate, concurrency, input_tokens, output_tokens, requests, vocab) -> None:
    """Refuse arguments that would measure nothing or something else than asked, with the fix."""
    if rate is not None and concurrency is not None:
        raise ValueError("give rate (requests/s, Poisson arrivals) or concurrency (requests in flight), not both")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be above 0 requests/s, got {rate}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
    if min(input_tokens, output_tokens, requests) < 1:
        raise ValueError("input_tokens, output_tokens and requests must each be 1 or more")
    if vocab < 2:
        raise ValueError(f"vocab must be 2 or more (token ids are drawn from [1, vocab)), got {vocab}")


def _summary(plan: list[_Request], duration_s: float) -> dict:
    """The measured part of the result: counts, the first errors, the latency stats over completed requests (ITL
    over every gap), throughput over the whole bench, and each request's own figures."""
    done = [r for r in plan if r.error is None]
    errors = [r.error for r in plan if r.error is not None]
    tokens = sum(r.output_tokens for r in done)
    return {
        "completed": len(done),
        "failed": len(errors),
        "errors": errors[:5],
        "duration_s": duration_s,
        "ttft_s": _stats([r.ttft_s for r in done]),
        "itl_s": _stats([gap for r in done for gap in r.itl_s]),
        "tpot_s": _stats([r.tpot_s for r in done if r.tpot_s is not None]),
        "e2e_s": _stats([r.e2e_s for r in done]),
        "output_tokens_per_s": tokens / duration_s if duration_s > 0 else None,
        "requests_per_s": len(done) / duration_s if duration_s > 0 else None,
        "per_request": [
            {
                "send_s": r.send_s,
                "ttft_s": r.ttft_s,
                "tpot_s": r.tpot_s,
                "e2e_s": r.e2e_s,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens if r.error is None else None,
                "error": r.error,
            }  # fmt: skip
            for r in plan
        ],
    }


def run_bench(
    url: str,
    model: str,
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    input_tokens: int = 128,
    output_tokens: int = 64,
    requests: int = 40,
    dataset: str | None = None,
    vocab: int = 256,
    seed: int = 0,
    timeout_s: float = 120.0,
) -> dict:
    """Benchmark the endpoint at `url` (its base, e.g. http://127.0.0.1:8000/v1) and return what it measured.

    `rate` sends Poisson arrivals at that many requests/s; `concurrency` keeps that many in flight (1 when neither
    is given); a `dataset` (JSONL: input_tokens, output_tokens, optional arrival_s) gives each request's lengths
    (its first `requests` rows) and, when every row has arrival_s, replays those offsets. `timeout_s` bounds each
    wait on the socket. Failed requests are counted; BenchError only when none completed."""
    _check(rate, concurrency, input_tokens, output_tokens, requests, vocab)
    if rate is None and concurrency is None:
        concurrency = 1
    plan, mode = _plan(rate, input_tokens, output_tokens, requests, dataset, vocab, seed)
    mode = mode or ("rate" if rate is not None else "concurrency")
    start_s = time.perf_counter()

    def send(req: _Request) -> None:
        _send(req, url, model, timeout_s, start_s)

    if mode == "concurrency":
        _in_flight(plan, send, concurrency)
    else:
        _by_arrival(plan, send)
    result = _summary(plan, time.perf_counter() - start_s)
    if result["completed"] == 0:
        raise BenchError(
            f"no request to {url} completed ({result['errors'][0]}): is the server running and serving "
            f"{model!r}? start one with `toolkit generate --serve --port P` (or `vllm serve {model} --port P`)"
        )
    in_flight = concurrency if mode == "concurrency" else None  # a trace sets its own arrivals
    shape = {"url": url, "model": model, "mode": mode, "rate": rate, "concurrency": in_flight}
    sizes = {"requests": len(plan), "input_tokens": input_tokens, "output_tokens": output_tokens}
    return {**shape, **sizes, **result, "tool": TOOL}


def write_bench(result: dict, out_dir) -> Path:
    """Keep a bench's result as out_dir/bench.json, dated and with the machine that ran the load (the client's
    cores bound the load it can offer), so a later comparison knows what it compares."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    machine = {"node": platform.node(), "arch": platform.machine(), "cpus": os.cpu_count()}
    record = {**result, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine}
    path = folder / BENCH_FILE
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _ms(stats: dict, q: str) -> str:
    value = stats.get(q)
    return "-" if value is None else f"{value * 1e3:.1f}"


def bench_text(result: dict) -> str:
    """The lines a person reads after a bench: how many requests completed, the latencies' p50/p99 in ms and the
    output throughput."""
    load = f"rate {result['rate']}/s" if result["mode"] == "rate" else result["mode"]
    if result["mode"] == "concurrency":
        load = f"concurrency {result['concurrency']}"
    lines = [
        f"{result['url']} {result['model']}: {load}, {result['input_tokens']} in / {result['output_tokens']} out",
        f"requests         {result['completed']} completed, {result['failed']} failed in {result['duration_s']:.2f} s",
    ]
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s")):
        lines.append(f"{name:<16} p50 {_ms(result[key], 'p50')} ms, p99 {_ms(result[key], 'p99')} ms")
    rate = result["output_tokens_per_s"]
    lines.append(f"output tokens/s  {'-' if rate is None else f'{rate:.1f}'}")
    if result["errors"]:
        lines.append(f"first error      {result['errors'][0]}")
    return "\n".join(lines)
