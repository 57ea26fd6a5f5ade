"""The whole loop on this machine: `toolkit generate --serve` (its engine and its OpenAI-compatible API), `toolkit
bench` driving it with streamed requests, and `toolkit compare --run` setting the load simulation beside what it
measured. The engine's continuous batching makes the same tokens as one request alone with a static cache."""

import json
import threading
from pathlib import Path

import torch

from toolkit.cli.main import main
from toolkit.program.generate import KVCache, greedy
from toolkit.serve.engine import BatchEngine
from toolkit.serve.http import make_server
from toolkit.specs import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODEL = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 128}


def _job(model: dict) -> Job:
    spec = {
        "workload": "inference",
        "model": model,
        "precision": {"mode": "fp32"},
        "serving": {"concurrency": 4, "input_tokens": 32, "output_tokens": 16, "max_num_seqs": 4,
                    "max_batched_tokens": 64},
    }  # fmt: skip
    return Job.from_dict(spec).resolve()[0]


def test_continuous_batching_makes_the_tokens_of_one_request_alone():
    """Three requests of different lengths through two slots, prompts chunked at 8 tokens: each request's tokens are
    those of a static-cache greedy run of it alone (RoPE and GQA, rows at different positions)."""
    from toolkit.program.build import build_model

    job = _job({**MODEL, "kv_heads": 2, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm"})
    torch.manual_seed(0)
    model = build_model(job, torch.float32, None).eval()
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (7, 12, 30)]
    alone = [greedy(model, torch.tensor([p]), 10, KVCache.for_model(model, 1, 128))[0].tolist() for p in prompts]
    engine = BatchEngine(model, max_num_seqs=2, max_batched_tokens=8, max_len=128)
    engine.start()
    got = [None] * 3

    def ask(i):
        got[i] = list(engine.submit(prompts[i], 10))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    engine.stop()
    assert got == alone


def test_serve_bench_compare(tmp_path, capsys):
    job = _job(MODEL)
    server, engine = make_server(job, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    (tmp_path / "job.yaml").write_text(job.to_yaml())
    out = tmp_path / "bench"
    try:
        rc = main(
            f"bench --url http://127.0.0.1:{port}/v1 --model toolkit-gpt --concurrency 4 --input-tokens 32 "
            f"--output-tokens 16 --requests 40 --out {out} --job {tmp_path / 'job.yaml'}".split()
        )
    finally:
        server.shutdown()
        engine.stop()
    assert rc == 0
    bench = json.loads((out / "bench.json").read_text())
    assert bench["completed"] == 40 and bench["failed"] == 0
    for key in ("ttft_s", "itl_s", "tpot_s"):
        assert 0 < bench[key]["p50"] <= bench[key]["p99"]
    capsys.readouterr()
    assert main(["compare", "--run", str(out), "--catalog", str(FIXTURES / "cpu_profile.yaml"), "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for key in ("ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99"):
        assert rows[key]["measured"] == bench[key[:6]][key[7:]]
        assert rows[key]["estimated"] > 0
