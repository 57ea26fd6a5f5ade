"""Bad input: every case exits 2 with one line on stderr that names the field; never a traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HF = str(Path(__file__).parents[1] / "fixtures" / "hf")
L7 = ["--model", "llama2-7b", "--gpus", "8xA100-80GB"]

# (case id, argv, text the message must contain)
CASES = [
    ("tp-not-dividing-heads", L7 + ["--tp", "3"], "parallel.tp = 3: must divide model.heads = 32"),
    (
        "tp-not-dividing-kv-heads",
        ["--model", "llama2-70b", "--gpus", "16xH100-SXM", "--tp", "16"],
        "must divide model.kv_heads = 8",
    ),
    ("dp-tp-pp-not-device-count", L7 + ["--dp", "4"], "dp × tp × pp = 4 × 1 × 1 = 4 but cluster.count = 8"),
    ("tp-pp-not-dividing-count", L7 + ["--tp", "4", "--pp", "4"], "tp × pp = 16 does not divide cluster.count = 8"),
    ("global-batch-indivisible", L7 + ["--global-batch", "100"], "batch.global_batch = 100: must be a multiple"),
    (
        "micro-batch-indivisible",
        L7 + ["--micro-batch", "3", "--global-batch", "32"],
        "multiple of micro_batch × dp = 3 × 8",
    ),
    ("unknown-accelerator", ["--model", "gpt2", "--gpus", "8xA100-80G"], "unknown accelerator (did you mean A100-80GB"),
    ("unknown-preset", ["--model", "lama2-7b"], "unknown preset (did you mean llama2-7b"),
    ("unknown-offer", ["--model", "gpt2", "--offer", "p4dx.24xlarge"], "unknown offer (did you mean p4d.24xlarge"),
    (
        "offer-accelerator-mismatch",
        ["--model", "gpt2", "--gpus", "8xA100-80GB", "--offer", "p5.48xlarge"],
        "carries H100-SXM, but the job runs on A100-80GB",
    ),
    (
        "negative-layers",
        ["--layers", "-2", "--hidden", "512", "--heads", "8"],
        "model.layers = -2: must be greater than zero",
    ),
    ("zero-hidden", ["--layers", "2", "--hidden", "0", "--heads", "8"], "model.hidden = 0: must be greater than zero"),
    ("zero-seq", ["--model", "gpt2", "--seq", "0"], "model.seq_len = 0"),
    ("negative-tokens", ["--model", "gpt2", "--tokens=-1e9"], "tokens = -1000000000.0: must be greater than zero"),
    (
        "negative-tokens-spaced",
        ["--model", "gpt2", "--tokens", "-1e9"],
        "tokens = -1000000000.0: must be greater than zero",
    ),
    ("mfu-above-one", ["--model", "gpt2", "--mfu", "45"], "mfu = 45.0: must lie in (0, 1]"),
    ("mfu-zero", ["--model", "gpt2", "--mfu", "0"], "mfu = 0.0: must lie in (0, 1]"),
    (
        "unknown-precision",
        ["--model", "gpt2", "--precision", "bf61"],
        "precision.mode = 'bf61': allowed: fp32, amp-bf16",
    ),
    ("unknown-optimizer", ["--model", "gpt2", "--optimizer", "adamw8"], "optimizer.name = 'adamw8': allowed"),
    ("zero-stage-4", ["--model", "gpt2", "--zero", "4"], "parallel.zero = '4': allowed: 0, 1, 2, 3"),
    ("unknown-recompute", ["--model", "gpt2", "--recompute", "partial"], "memory.recompute = 'partial': allowed"),
    (
        "per-op-recompute-with-adapters",
        ["--model", "gpt2", "--recompute", "selective-op", "--finetune", "lora"],
        "memory.recompute = 'selective-op': per-op recompute is not combined with adapters",
    ),
    ("unknown-compression", ["--model", "gpt2", "--act-compress", "int4"], "memory.act_compress = 'int4': allowed"),
    ("not-a-number", ["--model", "gpt2", "--tp", "two"], "parallel.tp = 'two': expected a number"),
    (
        "fractional-count",
        ["--model", "gpt2", "--micro-batch", "1.5"],
        "batch.micro_batch = 1.5: expected a whole number",
    ),
    ("gpus-malformed", ["--model", "gpt2", "--gpus", "8A100"], "--gpus = '8A100': expected COUNTxNAME"),
    (
        "bf16-on-v100",
        ["--model", "gpt2", "--gpus", "8xV100-32GB", "--precision", "mixed-bf16"],
        "V100-32GB has no bf16 math units",
    ),
    (
        "fp32-grads-outside-mixed",
        ["--model", "gpt2", "--precision", "amp-bf16", "--grad-dtype", "fp32"],
        "precision.grad_dtype = 'fp32': fp32 main gradients apply to mixed-bf16/mixed-fp16 only",
    ),
    (
        "optimizer-offload-torch",
        ["--model", "gpt2", "--gpus", "8xA100-80GB", "--zero", "2", "--offload", "optimizer"],
        "parallel.offload = 'optimizer': torch's FSDP2",
    ),
    (
        "optimizer-offload-no-zero",
        ["--model", "gpt2", "--precision", "mixed-bf16", "--offload", "optimizer"],
        "ZeRO-Offload needs parallel.zero = 1, 2 or 3",
    ),
    (
        "param-offload-deepspeed-zero2",
        ["--model", "gpt2", "--precision", "mixed-bf16", "--zero", "2", "--offload", "params"],
        "parameter offload needs parallel.zero = 3",
    ),
    (
        "pp-not-dividing-layers",
        ["--model", "gpt2", "--gpus", "16xA100-80GB", "--pp", "16"],
        "parallel.pp = 16: 12 layers on pp × vpp = 16 chunks leave a chunk without a layer",
    ),
    ("vpp-without-pp", ["--model", "gpt2", "--vpp", "2"], "parallel.vpp = 2: interleaved stages need parallel.pp > 1"),
    ("sp-without-tp", ["--model", "gpt2", "--sp"], "parallel.sp = True: sequence parallelism"),
    (
        "interleaved-rounds",
        [
            "--model",
            "gpt3-125m",
            "--gpus",
            "4xRTX-4090",
            "--pp",
            "2",
            "--vpp",
            "2",
            "--global-batch",
            "62",
        ],  # (the planner offered such layouts and then crashed)
        "rounds of max(1, 31 // pp) = 15, which must divide them",
    ),
    (
        "heads-not-dividing-hidden",
        ["--layers", "2", "--hidden", "100", "--heads", "3"],
        "model.heads = 3: must divide model.hidden = 100",
    ),
    (
        "kv-not-dividing-heads",
        ["--layers", "2", "--hidden", "512", "--heads", "8", "--kv-heads", "3"],
        "model.kv_heads = 3: must divide model.heads = 8",
    ),
    ("dropout-one", ["--model", "gpt2", "--dropout", "1"], "model.dropout = 1.0: must lie in [0, 1)"),
    (
        "seq-beyond-positions",
        ["--model", "gpt2", "--seq", "4096"],
        "model.seq_len = 4096: exceeds the learned position table (model.max_positions = 1024)",
    ),
    ("two-model-sources", ["--model", "gpt2", "--params", "7e9"], "give one model source"),
    ("params-and-shape", ["--params", "7e9", "--layers", "4"], "give either model.params or the shape"),
    ("partial-shape", ["--layers", "4", "--hidden", "512"], "model.heads = None: is required"),
    ("no-model", ["--gpus", "8xA100-80GB"], "no model given"),
    (
        "count-across-nodes",
        ["--model", "gpt2", "--gpus", "12xA100-80GB"],
        "not a multiple of cluster.gpus_per_node = 8",
    ),
    ("headroom-one", ["--model", "gpt2", "--headroom", "1"], "memory.headroom_fraction = 1.0: must lie in [0, 1)"),
    ("missing-job-file", ["--config", "/no/such/job.yaml"], "job file = '/no/such/job.yaml': file not found"),
    (
        "missing-hf-config",
        ["--hf-config", "/no/such/config.json"],
        "hf_config = '/no/such/config.json': file not found",
    ),
    ("missing-catalog-file", ["--model", "gpt2", "--catalog", "/no/such/catalog.yaml"], "file not found"),
]


@pytest.mark.parametrize("argv, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_cli_input_gives_one_line(cli, argv, expect):
    code, out, err = cli("estimate", *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expect in lines[0], lines[0]
    assert "Traceback" not in err


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


FILE_CASES = [
    (
        "unknown-yaml-key",
        "job.yaml",
        "model: {preset: gpt2}\nparallel: {tp: 1, zer0: 1}\n",
        "parallel.zer0 = 1: unknown key (did you mean zero?)",
    ),
    ("unknown-section", "job.yaml", "model: {preset: gpt2}\nparalel: {tp: 2}\n", "paralel"),
    ("malformed-yaml", "job.yaml", "model: {preset: gpt2\nbatch: [1, 2\n", "is not valid YAML at line"),
    (
        "wrong-type-in-yaml",
        "job.yaml",
        "model: {preset: gpt2, layers: many}\n",
        "model.layers = 'many': expected a number",
    ),
    ("yaml-not-a-mapping", "job.yaml", "- just\n- a list\n", "expected a mapping"),
    ("empty-yaml", "job.yaml", "", "no model given"),
    (
        "truncated-yaml",
        "job.yaml",
        "model: {preset: gpt2}\nbatch: {micro_batch: 2, glob",
        "is not valid YAML at line 2",
    ),
    ("binary-yaml", "job.yaml", "\x00\x9f\xff\x00 garbage", "job.yaml': is not valid YAML"),
    (
        "bool-as-size",
        "job.yaml",
        "model: {preset: gpt2}\nbatch: {micro_batch: true}\n",
        "batch.micro_batch = True: expected a number, not true/false",
    ),
]


@pytest.mark.parametrize("name, text, expect", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_bad_job_file(cli, tmp_path, name, text, expect):
    code, _out, err = cli("estimate", "--config", _write(tmp_path, name, text))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and expect in err, err


@pytest.mark.parametrize(
    "text, expect",
    [
        ('{"model_type": "llama", "hidden_size": 64', "is not valid JSON at line 1"),
        (
            '{"model_type": "t5", "d_model": 512}',
            "model_type 't5' is not supported; supported: deepseek_v2, deepseek_v3, gpt_oss, llama",
        ),
        ('{"model_type": "llama", "hidden_size": 64}', "has no `num_attention_heads` key"),
    ],
    ids=["malformed-json", "unsupported-model-type", "missing-key"],
)
def test_bad_hf_config(cli, tmp_path, text, expect):
    code, _out, err = cli("estimate", "--hf-config", _write(tmp_path, "config.json", text))
    assert code == 2 and expect in err, err


@pytest.mark.parametrize(
    "text, expect",
    [
        ("offers:\n  - {name: p4d.24xlarge, on_demand_per_hour: 19.0}\n", "offers[0].source = None: is required"),
        (
            "offers:\n  - {name: my-box, provider: me, region: here, accelerator: Z900, count: 8, currency: USD,\n"
            "     on_demand_per_hour: 1, spot_per_hour_low: unknown, spot_per_hour_high: unknown,\n"
            "     network_bw_bytes_per_s: unknown, source: quote, as_of: 2026-11-01}\n",
            "unknown accelerator",
        ),
        ("acelerators: []\n", "unknown section (did you mean accelerators?)"),
    ],
    ids=["override-without-source", "offer-unknown-accelerator", "unknown-catalog-section"],
)
def test_bad_catalog_file(cli, tmp_path, text, expect):
    code, _out, err = cli("estimate", "--model", "gpt2", "--catalog", _write(tmp_path, "my.yaml", text))
    assert code == 2 and expect in err, err


def test_catalog_command_bad_kind_and_name(cli):
    code, _out, err = cli("catalog", "acelerators")
    assert code == 2 and "did you mean accelerators" in err
    code, _out, err = cli("catalog", "accelerators", "H100-PCIX")
    assert code == 2 and "unknown accelerator" in err


def test_console_script_prints_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: exit 2, one line, no traceback."""
    bad = _write(tmp_path, "job.yaml", "model: {preset: gpt2}\nparallel: {tp: 5}\n")
    run = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "estimate", "--config", bad, "--json"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "parallel.tp = 5" in run.stderr
    good = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "estimate", "--model", "gpt2", "--json"], capture_output=True, text=True
    )
    assert good.returncode == 0 and json.loads(good.stdout)["model"]["params"] == 124_439_808
