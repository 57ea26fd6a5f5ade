"""The CLI contract: the issue's headline command, the JSON keys, job files and the catalog listing."""

import json

import pytest
import yaml

HEADLINE = ["estimate", "--model", "gpt3-175b", "--tokens", "300e9", "--gpus", "1024xA100-80GB", "--mfu", "0.45"]

CONTRACT_KEYS = [
    "model.params",
    "memory.params_bytes",
    "memory.grads_bytes",
    "memory.optimizer_bytes",
    "memory.activations_bytes",
    "memory.peak_bytes",
    "memory.host_bytes",
    "memory.device_bytes",
    "memory.fits",
    "compute.flops_6nd",
    "compute.total_flops",
    "compute.pf_days",
    "time.train_s",
    "cost.amount",
    "cost.currency",
]


def _get(d, dotted):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_headline_command(cli_json):
    est = cli_json(*HEADLINE)
    for key in CONTRACT_KEYS:
        _get(est, key)  # present (None allowed)
    assert est["compute"]["flops_6nd"] == pytest.approx(3.14e23, rel=0.01)  # GPT-3 paper, Table D.1
    assert est["compute"]["pf_days_6nd"] == pytest.approx(3640, rel=0.01)
    attention = 6 * 96 * 2048 * 12288 * 300e9
    assert est["compute"]["attention_flops"] == pytest.approx(attention)
    # the exact matmul count: 6·N·D plus causal attention, within the embedding/position/norm terms
    assert est["compute"]["total_flops"] == pytest.approx(est["compute"]["flops_6nd"] + attention, rel=0.002)
    assert est["compute"]["pf_days"] == pytest.approx(est["compute"]["total_flops"] / 8.64e19)
    # time = total / (1024 · 312e12 · 0.45)
    assert est["time"]["train_s"] == pytest.approx(est["compute"]["total_flops"] / (1024 * 312e12 * 0.45))
    # amp-bf16 saves a bf16 cast of every weight for backward: 2 bytes/param among the activations.
    assert est["memory"]["activations_bytes"] > 2 * 174_604_259_328
    assert est["memory"]["peak_bytes"] > est["memory"]["params_bytes"] + est["memory"]["optimizer_bytes"]
    # amp-bf16 + AdamW, no sharding: 16 bytes per parameter cannot fit in 80 GiB.
    assert est["memory"]["fits"] is False
    assert est["memory"]["params_bytes"] == pytest.approx(4 * 174_604_259_328)
    assert est["cost"]["amount"] is None  # no offer given


def test_cost_is_billed_per_whole_instance(cli_json):
    est = cli_json(
        "estimate",
        "--model",
        "gpt2",
        "--tokens",
        "1e10",
        "--gpus",
        "12xH100-SXM",
        "--gpus-per-node",
        "4",
        "--mfu",
        "0.5",
        "--offer",
        "p5.48xlarge",
    )
    hours = est["time"]["train_s"] / 3600
    assert est["cost"]["instances"] == 2  # 12 devices -> two 8-GPU instances
    assert est["cost"]["amount"] == pytest.approx(2 * 55.04 * hours)
    assert any("idle" in n for n in est["notes"])


def test_spot_prices_and_range(cli_json):
    est = cli_json("estimate", "--model", "llama2-7b", "--offer", "p4de.24xlarge", "--mfu", "0.4", "--spot")
    hours = est["time"]["train_s"] / 3600
    assert est["cost"]["amount"] == pytest.approx(11.0 * hours) and est["cost"]["amount_spot_low"] == pytest.approx(
        8.65 * hours
    )


def test_config_file_and_flag_override(cli_json, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: {preset: llama2-7b}\ncluster: {accelerator: A100-80GB, count: 16}\nparallel: {tp: 2}\n")
    est = cli_json("estimate", "--config", str(path), "--tp", "4")
    assert est["job"]["parallel"]["tp"] == 4 and est["job"]["parallel"]["dp"] == 4


def test_write_job_round_trips(cli, cli_json, tmp_path):
    out = tmp_path / "job.yaml"
    first = cli_json("estimate", "--model", "llama3-8b", "--gpus", "8xH100-SXM", "--zero", "3", "--write-job", str(out))
    assert yaml.safe_load(out.read_text())["parallel"]["zero"] == 3
    again = cli_json("estimate", "--config", str(out))
    assert again["memory"] == first["memory"] and again["job"] == first["job"]


def test_human_output_names_the_parts(cli):
    code, out, _err = cli(*HEADLINE)
    assert code == 0
    for text in ("174.60 B parameters", "does NOT fit", "PF-days", "days", "causal"):
        assert text in out


def test_catalog_listing(cli):
    code, out, _ = cli("catalog", "accelerators")
    assert code == 0 and "MLU370-X8" in out and "989.4" in out
    code, out, _ = cli("catalog", "presets", "--json")
    names = [row["name"] for row in json.loads(out)]
    assert {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "gpt2-medium", "bert-large", "megatron-1t"} <= set(
        names
    )
    code, out, _ = cli("catalog", "offers", "gn10xp.20xlarge320")
    assert code == 0 and "on_demand_per_hour: unknown" in out and "count: 8" in out


def test_params_only_model(cli_json):
    est = cli_json("estimate", "--params", "7e9", "--tokens", "1e12", "--gpus", "8xA100-80GB", "--mfu", "0.5")
    assert est["compute"]["flops_6nd"] == pytest.approx(6 * 7e9 * 1e12)
    assert est["compute"]["total_flops"] is None and est["time"]["train_s"] is not None


SMALL = [
    "--layers",
    "2",
    "--hidden",
    "128",
    "--heads",
    "4",
    "--vocab",
    "1000",
    "--seq",
    "128",
    "--micro-batch",
    "2",
    "--global-batch",
    "2",
]


def test_trace_prints_the_estimate_keys(cli_json):
    traced = cli_json("trace", *SMALL)
    estimated = cli_json("estimate", *SMALL)
    for key in CONTRACT_KEYS:
        _get(traced, key)
    assert traced["memory"]["source"] == "trace" and traced["memory"]["program"] == "cpu"
    measured = traced["compute"].pop("traced_flops_per_token")
    assert traced["compute"] == estimated["compute"]
    assert measured > 0  # FlopCounterMode's count (the CPU flash kernel counts 0; see compare)
    assert traced["memory"]["activations_bytes"] == estimated["memory"]["activations_bytes"]


def test_compare_reports_error_per_category(cli, cli_json):
    cmp = cli_json("compare", *SMALL, "--recompute", "full", "--precision", "fp32")
    rows = cmp["memory"]
    assert set(rows) == {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"}
    assert rows["activations_bytes"]["error"] == 0
    assert abs(rows["peak_bytes"]["error"]) < 0.03
    eager = cli_json("compare", *SMALL, "--recompute", "full", "--attention", "eager")
    assert abs(eager["flops_per_token"]["error"]) < 0.01  # FlopCounterMode on the same program
    code, out, _ = cli("compare", *SMALL)
    assert code == 0 and "peak" in out and "%" in out


def test_trace_refuses_layouts_it_cannot_run(cli):
    code, out, err = cli(
        "trace", "--model", "gpt2", "--gpus", "4xA100-80GB", "--tp", "2", "--zero", "3", "--offload", "params"
    )  # offload inside a tp x dp mesh
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "tracer covers data-parallel replicas" in err


def test_specs_and_estimate_do_not_import_torch():
    """DESIGN: specs, estimate and the CLI's estimate path stay light enough for sliders and searches."""
    import subprocess
    import sys

    code = "import sys, toolkit.cli, toolkit.estimate.grid; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_plan_json_contract(cli):
    code, out, _ = cli(
        "plan",
        "--model",
        "llama2-7b",
        "--offers",
        "p5.48xlarge,p4de.24xlarge",
        "--objective",
        "cost",
        "--max-gpus",
        "32",
        "--precision",
        "mixed-bf16",
        "--top",
        "3",
        "--json",
    )
    result = json.loads(out)
    assert code == 0 and {"evaluated", "plans", "pareto"} <= set(result)
    assert len(result["plans"]) == 3 and result["evaluated"] > 1000
    assert {"layout", "peak_bytes", "step_s", "train_days", "cost", "currency"} <= set(result["plans"][0])


@pytest.mark.parametrize(
    "method, precision, extra, fits",
    [
        ("lora", "amp-bf16", (), 2),
        ("lora", "amp-bf16", ("--base-weights", "fp32"), 0),
        ("lora", "pure-bf16", (), 2),
        ("qlora", "amp-bf16", (), 2),
    ],
)
def test_plan_a_lora_fine_tune_on_consumer_gpus(cli, method, precision, extra, fits):
    """The seed article's small-team case (it crashed in the LoRA activations on the layout grid): LoRA is
    planned for replicas only; 7B frozen weights fit 24 GiB cards in bf16 (LoRA's base as fine-tunes load it), not
    kept in fp32 under amp-bf16."""
    code, out, err = cli(
        "plan",
        "--model",
        "llama2-7b",
        "--gpus",
        "8xRTX-4090",
        "--finetune",
        method,
        "--lora-rank",
        "16",
        "--lora-targets",
        "q,v",
        "--precision",
        precision,
        *extra,
    )
    assert code == 0 and not err, err
    assert f"{fits} fit" in out
    assert all("tp 1 · pp 1" in line for line in out.splitlines() if "8xRTX-4090" in line)


def test_plan_and_doctor_text_and_errors(cli):
    code, out, _ = cli("plan", "--model", "llama2-7b", "--gpus", "8xH100-SXM", "--tp", "2", "--top", "2")
    assert code == 0 and "tp 2" in out and "evaluated" in out
    code, _, err = cli("plan", "--model", "llama2-7b")
    assert code == 2 and err.count("\n") == 1 and "give the hardware" in err
    code, _, err = cli("plan", "--model", "llama2-7b", "--offers", "nope.large")
    assert code == 2 and "nope.large" in err
    code, out, _ = cli(
        "doctor",
        "--model",
        "llama2-70b",
        "--gpus",
        "64xH100-SXM",
        "--tp",
        "8",
        "--pp",
        "4",
        "--zero",
        "1",
        "--precision",
        "mixed-bf16",
        "--micro-batch",
        "2",
    )
    assert code == 0 and "does NOT fit" in out and "sequence parallelism" in out
    code, _, err = cli("doctor", "--run", "/nonexistent/run")
    assert code == 2 and "no metrics.jsonl" in err


def test_html_pages_carry_the_figures(cli, tmp_path):
    page = tmp_path / "estimate.html"
    code, _, _ = cli("estimate", "--model", "llama2-7b", "--gpus", "8xH100-SXM", "--html", str(page))
    text = page.read_text()
    assert code == 0 and text.count("plotly-graph-div") == 2 and "GiB usable" in text and "tokens\\u002fs" in text
    assert page.stat().st_size < 100_000  # plotly.js comes from its CDN, not inlined
    plan = tmp_path / "plan.html"
    code, _, _ = cli("plan", "--model", "llama2-7b", "--offers", "p5.48xlarge", "--max-gpus", "16", "--html", str(plan))
    assert code == 0 and "Pareto front" in plan.read_text()


def test_a_file_or_folder_that_cannot_be_written_is_one_line_not_a_traceback(cli, tmp_path):
    """--html into a missing folder is refused before any work; a run folder under a file (the OS refuses to make
    it) and a profile into a missing folder each give one line naming the path, and nothing is left behind."""
    missing = tmp_path / "no-such-folder" / "page.html"
    for argv in (
        ("estimate", "--model", "gpt2-xl", "--html", str(missing)),
        ("pipeline", "--stages", "4", "--microbatches", "8", "--schedule", "1f1b", "--html", str(missing)),
    ):
        code, out, err = cli(*argv)
        assert code == 2 and err.count("\n") == 1 and "no-such-folder" in err and "does not exist" in err, err
        assert out == ""  # refused before the estimate printed
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = cli(
        "train",
        "--layers",
        "2",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--vocab",
        "256",
        "--seq",
        "16",
        "--steps",
        "1",
        "--out",
        str(blocker / "run"),
    )
    assert code == 1 and err.count("\n") == 1 and "a-file" in err and "Traceback" not in err, err
    assert blocker.read_text() == "not a folder"
    code, _, err = cli("calibrate", "--out", str(missing))
    assert code == 2 and err.count("\n") == 1 and "no-such-folder" in err
    assert not missing.parent.exists()


def test_a_reader_that_leaves_early_is_no_error():
    """`toolkit … | head`: the pipe closes under a large output; the command stops quietly with exit 0 (a broken
    pipe is an OSError too, and must not reach the one-line handler for paths that cannot be written)."""
    import subprocess
    import sys

    cmd = (
        f"{sys.executable} -m toolkit.cli pipeline --stages 32 --microbatches 256 --schedule 1f1b --json "
        "| head -c 10 > /dev/null; echo ${PIPESTATUS[0]}"
    )
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "0" and done.stderr == "", (done.stdout, done.stderr)


def test_estimate_check_exits_one_when_the_job_does_not_fit(cli):
    """Scripts can tell: `--check` exits 1 with one line when the device peak exceeds the device, 0 when it fits."""
    code, out, err = cli("estimate", "--model", "llama2-70b", "--gpus", "1xA100-80GB", "--check")
    assert code == 1 and "peak in a step" in out and err.count("\n") == 1 and "does not fit" in err
    assert cli("estimate", "--model", "llama2-7b", "--gpus", "8xA100-80GB", "--zero", "3", "--check")[0] == 0


@pytest.mark.parametrize(
    "argv, field",
    [
        (("--tokens", "-1e9"), "--tokens: tokens = -1000000000.0"),
        (("--micro-batch", "-2"), "--micro-batch: batch.micro_batch = -2"),
    ],
)
def test_a_negative_number_is_refused_by_the_spec_not_taken_for_an_option(cli, argv, field):
    code, _out, err = cli("estimate", "--model", "llama2-7b", *argv)
    assert code == 2 and field in err and "must be greater than zero" in err and "expected one argument" not in err


def test_a_default_warmup_longer_than_the_run_is_named_as_the_default(cli, tmp_path):
    code, _out, err = cli(
        "train",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--vocab",
        "256",
        "--seq",
        "32",
        "--steps",
        "5",
        "--out",
        str(tmp_path / "run"),
    )
    assert code == 2 and "warmup_steps = 10: (the default) must be below training.steps = 5; give --warmup 1" in err


def test_plan_says_what_it_assumed_and_shows_small_steps_in_ms(cli):
    """The token budget, the network across nodes and where its figure came from, what separates #1 from #2;
    a small model's steps in ms and its run in minutes."""
    code, out, _err = cli(
        "plan",
        "--model",
        "llama2-7b",
        "--gpus",
        "64xH100-SXM",
        "--precision",
        "amp-bf16",
        "--tokens",
        "1e11",
        "--top",
        "3",
    )
    assert code == 0 and "token budget 1e+11 tokens" in out
    assert "network across nodes 400 Gb/s per device (the accelerator's reference system)" in out
    assert "#1 against #2:" in out
    code, out, _err = cli(
        "plan",
        "--layers",
        "4",
        "--hidden",
        "256",
        "--heads",
        "8",
        "--vocab",
        "256",
        "--seq",
        "128",
        "--gpus",
        "8xA100-80GB",
        "--tokens",
        "1e8",
        "--top",
        "2",
    )
    assert code == 0 and " ms " in out and " min " in out and "0.0" not in out.split("\n")[4]
