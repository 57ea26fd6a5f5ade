"""`toolkit generate --serve`: the toolkit's KV-cache GPT behind an OpenAI-compatible API (`/v1/completions`,
`/v1/chat/completions`, `/v1/models`), streamed or not, with continuous batching (toolkit.serve.engine), so
`toolkit bench` and the load simulation can be checked against a live server on this machine.

    toolkit generate --serve --port 8000 --layers 2 --hidden 64 --heads 4 --vocab 256 --seq 128 --precision fp32
    curl -N localhost:8000/v1/completions -d '{"prompt": [1, 2, 3], "max_tokens": 8, "stream": true}'

A prompt is a list of token ids (as vLLM's benchmark sends it) or text, read as bytes modulo the vocabulary.
Sampling is greedy; there is no end-of-sequence token, so every request makes max_tokens.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from ..specs import Job
from .engine import BatchEngine

__all__ = ["make_server", "http_server", "serve"]


def make_server(
    job: Job, port: int, host: str = "127.0.0.1", start: bool = True
) -> tuple[ThreadingHTTPServer, BatchEngine]:
    """The server and its engine, built, and the engine started on its own thread unless `start` is False (port 0
    picks a free one: server.server_address)."""
    from .worker import _build

    torch.manual_seed(job.training.seed)
    model = _build(job, torch.device("cpu"), None)
    s = job.serving
    max_len = max(job.model.seq_len, s.context)
    engine = BatchEngine(model, max_num_seqs=s.max_num_seqs, max_batched_tokens=s.max_batched_tokens, max_len=max_len)
    return http_server(engine, job.model.name or "toolkit-gpt", job.model.vocab, port, host, start), engine


def http_server(
    engine: BatchEngine, name: str, vocab: int, port: int, host: str = "127.0.0.1", start: bool = True
) -> ThreadingHTTPServer:
    """The API over a built engine (started on its own thread unless `start` is False)."""
    if start:
        engine.start()
    handler = type("Handler", (_Handler,), {"engine": engine, "model_name": name, "vocab": vocab})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(job: Job, port: int, host: str = "127.0.0.1") -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM), then stop cleanly: the model steps on this (main) thread, the
    HTTP handlers on others (BatchEngine.run says why)."""
    server, engine = make_server(job, port, host, start=False)
    host, port = server.server_address[:2]
    s = job.serving
    print(
        f"serving {job.model.name or 'toolkit-gpt'} at http://{host}:{port}/v1 (OpenAI-compatible, continuous "
        f"batching: {s.max_num_seqs} requests, {s.max_batched_tokens} tokens a step); Ctrl-C stops",
        flush=True,
    )
    threading.Thread(target=server.serve_forever, daemon=True, name="toolkit-http").start()
    signal.signal(signal.SIGTERM, _interrupt)  # a job manager's stop ends it as Ctrl-C does
    try:
        engine.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _Handler(BaseHTTPRequestHandler):
    engine: BatchEngine
    model_name: str
    vocab: int

    def log_message(self, *args) -> None:  # quiet: a benchmark sends thousands
        return

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [{"id": self.model_name, "object": "model"}]})
        elif self.path.rstrip("/") in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        chat = self.path.rstrip("/").endswith("/chat/completions")
        if not (chat or self.path.rstrip("/").endswith("/completions")):
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            prompt = self._prompt(body, chat)
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            tokens = self.engine.submit(prompt, max_tokens)
            first = next(tokens, None)  # raises here for a request the engine refuses
        except (ValueError, TypeError, KeyError) as err:
            return self._json(400, {"error": {"message": str(err), "type": "invalid_request_error"}})
        stream = _chain(first, tokens)
        if body.get("stream"):
            return self._stream(stream, len(prompt), chat, body)
        made = list(stream)
        text = "".join(f" {t}" for t in made)
        choice = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text, "token_ids": made}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(made)}
        self._json(
            200,
            {
                "id": _id(),
                "object": _kind(chat, False),
                "model": self.model_name,
                "choices": [choice],
                "usage": usage | {"total_tokens": len(prompt) + len(made)},
            },
        )

    def _prompt(self, body: dict, chat: bool) -> list[int]:
        if chat:
            text = "\n".join(str(m.get("content", "")) for m in body["messages"])
            return [b % self.vocab for b in text.encode()] or [0]
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return [b % self.vocab for b in prompt.encode()] or [0]
        if not all(isinstance(t, int) and 0 <= t < self.vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab})")
        return list(prompt)

    def _stream(self, tokens, prompt_tokens: int, chat: bool, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        rid, made = _id(), 0
        for t in tokens:
            made += 1
            delta = {"delta": {"content": f" {t}"}} if chat else {"text": f" {t}", "token_ids": [t]}
            chunk = {
                "id": rid,
                "object": _kind(chat, True),
                "model": self.model_name,
                "created": int(time.time()),
                "choices": [{"index": 0, "finish_reason": None, **delta}],
            }
            self._event(chunk)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": made, "total_tokens": prompt_tokens + made}
            self._event(
                {"id": rid, "object": _kind(chat, True), "model": self.model_name, "choices": [], "usage": usage}
            )
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, data: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, code: int, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def _chain(first, rest):
    if first is None:
        return
    yield first
    yield from rest


def _id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:16]


def _kind(chat: bool, chunk: bool) -> str:
    return ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
