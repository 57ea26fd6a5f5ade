"""`toolkit bench` against a stub OpenAI-compatible server whose timing is known: it streams `max_tokens` SSE chunks,
the first after FIRST_S and the rest GAP_S apart, then a usage chunk and [DONE]; the bench must measure those
delays, send what it was asked to, and fail in one line when nothing answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from toolkit.serve.bench import BenchError, _percentile, bench_text, run_bench, write_bench

FIRST_S = 0.020
GAP_S = 0.005


class _Stub(BaseHTTPRequestHandler):
    """POST /v1/completions: the request is kept on the server, then streamed back one token per chunk."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if self.path != "/v1/completions" or body["model"] != "stub":
            self.send_error(404, "no such model or path")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        for i in range(n):
            time.sleep(FIRST_S if i == 0 else GAP_S)
            chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_concurrency_measures_the_stubs_delays(stub):
    server, url = stub
    server.bodies.clear()
    result = run_bench(url, "stub", concurrency=2, requests=6, input_tokens=16, output_tokens=8, vocab=50)
    assert (result["mode"], result["completed"], result["failed"], result["errors"]) == ("concurrency", 6, 0, [])
    assert [r["output_tokens"] for r in result["per_request"]] == [8] * 6
    assert FIRST_S <= result["ttft_s"]["p50"] < FIRST_S + 0.050
    assert 0.8 * GAP_S <= result["itl_s"]["p50"] < GAP_S + 0.020
    assert 0.8 * GAP_S <= result["tpot_s"]["p50"] < GAP_S + 0.020
    assert result["itl_s"]["count"] == 6 * 7 and result["ttft_s"]["count"] == 6
    assert result["e2e_s"]["p50"] >= FIRST_S + 7 * GAP_S
    assert result["output_tokens_per_s"] == pytest.approx(48 / result["duration_s"])
    body = server.bodies[0]
    assert len(body["prompt"]) == 16 and all(1 <= t < 50 for t in body["prompt"])
    assert (body["max_tokens"], body["ignore_eos"], body["stream"], body["temperature"]) == (8, True, True, 0)
    assert body["stream_options"] == {"include_usage": True}


def test_rate_sends_the_requests_asked_for_at_seeded_times(stub):
    server, url = stub
    server.bodies.clear()
    result = run_bench(url, "stub", rate=100.0, requests=5, input_tokens=4, output_tokens=3, seed=1)
    assert (result["mode"], result["rate"], result["concurrency"]) == ("rate", 100.0, None)
    assert len(server.bodies) == 5 and result["completed"] == 5
    sends = [r["send_s"] for r in result["per_request"]]
    assert sends == sorted(sends) and sends[0] > 0
    again = run_bench(url, "stub", rate=100.0, requests=5, input_tokens=4, output_tokens=3, seed=1)
    assert sorted(b["prompt"] for b in server.bodies[:5]) == sorted(b["prompt"] for b in server.bodies[5:])
    assert [r["send_s"] for r in again["per_request"]] == pytest.approx(sends, abs=0.02)  # the seed fixes them
    assert again["requests"] == 5


def test_a_trace_replays_its_lengths_and_arrivals(stub, tmp_path):
    _, url = stub
    rows = [
        {"input_tokens": 3, "output_tokens": 2, "arrival_s": 0.0},
        {"input_tokens": 5, "output_tokens": 4, "arrival_s": 0.05},
    ]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_bench(url, "stub", dataset=str(tmp_path / "trace.jsonl"))
    assert result["mode"] == "trace" and result["completed"] == 2
    assert [(r["input_tokens"], r["output_tokens"]) for r in result["per_request"]] == [(3, 2), (5, 4)]
    assert result["per_request"][1]["send_s"] >= 0.05


def test_the_result_is_written_with_date_and_machine(stub, tmp_path):
    _, url = stub
    result = run_bench(url, "stub", requests=2, input_tokens=4, output_tokens=2)
    path = write_bench(result, tmp_path / "out" / "b")
    saved = json.loads(path.read_text())
    assert path.name == "bench.json"
    assert set(result) | {"date", "machine"} == set(saved)
    expected = {"url", "model", "mode", "rate", "concurrency", "requests", "input_tokens", "output_tokens"}
    expected |= {"completed", "failed", "errors", "duration_s", "ttft_s", "itl_s", "tpot_s", "e2e_s", "tool"}
    assert expected | {"output_tokens_per_s", "requests_per_s", "per_request"} == set(result)
    assert set(saved["ttft_s"]) == {"mean", "p50", "p90", "p99", "count"}
    assert set(saved["per_request"][0]) == {
        "send_s",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "input_tokens",
        "output_tokens",
        "error",
    }
    text = bench_text(result)
    assert "2 completed, 0 failed" in text and "TTFT" in text and "output tokens/s" in text


def test_a_dead_url_raises_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(BenchError) as info:
        run_bench(url, "m", requests=2, timeout_s=2.0)
    message = str(info.value)
    assert "\n" not in message and url in message and "is the server running" in message


def test_http_errors_are_kept_per_request(stub):
    _, url = stub
    with pytest.raises(BenchError, match="HTTP 404"):
        run_bench(url, "not-served", requests=2, output_tokens=2)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="not both"):
        run_bench("http://127.0.0.1:1/v1", "m", rate=1.0, concurrency=2)
    with pytest.raises(ValueError, match="rate"):
        run_bench("http://127.0.0.1:1/v1", "m", rate=0.0)


def test_percentiles_are_numpys_linear():
    values = sorted([0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.05])
    for q in (0, 50, 90, 99, 100):
        assert _percentile(values, q) == pytest.approx(np.percentile(values, q, method="linear"))
    assert _percentile([2.0], 99) == 2.0
