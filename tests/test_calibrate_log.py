"""Calibrating from another framework's training log (`toolkit calibrate --measured LOG` with the job's flags):
lines written as Megatron-LM, torchtitan and Composer format them (their format strings, quoted in
toolkit/calibrate/log_step.py) give the step they time, warm-up left out, and the same profile --step-s gives."""

import pytest
import yaml

from toolkit.calibrate.log_step import step_s_of_log
from toolkit.cli.main import main

JOB = "--model llama3-8b --gpus 8xH100-SXM --global-batch 64 --seq 8192 --precision mixed-bf16".split()
TOKENS, DEVICES = 64 * 8192, 8


def _megatron(ms: list[float]) -> str:
    return "\n".join(
        f" [2026-11-02 10:00:{i:02d}] iteration {i + 1:8d}/{500000:8d} | consumed samples: {64 * (i + 1):12d} |"
        f" elapsed time per iteration (ms): {t:.1f} | learning rate: 3.000E-04 | global batch size:    64 |"
        for i, t in enumerate(ms)
    )


def _torchtitan(tps: list[int]) -> str:
    red, blue, reset = "\x1b[31m", "\x1b[34m", "\x1b[39m"
    return "\n".join(
        f"[titan] 2026-11-02 10:00:00,000 - root - INFO - {red}step: {i:2}  loss:  7.1234  memory: 61.20GiB(77.30%)  "
        f"{blue}tps: {t:,}  tflops: 385.12  mfu: 38.94%{reset}"
        for i, t in enumerate(tps, 1)
    )


def test_megatron_lines_give_their_median_step_after_warm_up():
    step_s, framework, lines = step_s_of_log(_megatron([30000.0, 12000.0, 9400.0, 9500.0, 9600.0]), TOKENS, DEVICES)
    assert framework == "megatron" and lines == 3 and step_s == pytest.approx(9.5)


def test_torchtitan_tokens_a_second_per_device_become_the_jobs_step():
    tps = round(TOKENS / (9.5 * DEVICES))  # the per-device rate a 9.5 s step of this job prints
    step_s, framework, _ = step_s_of_log(_torchtitan([1000, 2000, tps, tps, tps]), TOKENS, DEVICES)
    assert framework == "torchtitan" and step_s == pytest.approx(9.5, rel=1e-3)


def test_composer_batches_a_second():
    text = "\n".join(f"[batch={i}/100]:\n\t Train throughput/batches_per_sec: {1 / 9.5:.6f}" for i in range(1, 6))
    assert step_s_of_log(text, TOKENS, DEVICES)[:2] == (pytest.approx(9.5, rel=1e-4), "composer")


def test_a_log_calibrates_as_the_same_step_given_by_hand(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(_megatron([30000.0, 12000.0, 9500.0, 9500.0]))
    by_log, by_hand = tmp_path / "log.yaml", tmp_path / "hand.yaml"
    assert main(["calibrate", *JOB, "--measured", str(log), "--out", str(by_log)]) == 0
    assert "megatron log" in capsys.readouterr().out
    assert main(["calibrate", *JOB, "--step-s", "9.5", "--out", str(by_hand)]) == 0
    scale = [yaml.safe_load(p.read_text())["accelerators"][0]["step_calibration"]["scale"] for p in (by_log, by_hand)]
    assert scale[0] == pytest.approx(scale[1], rel=1e-9)


def test_a_log_without_timed_lines_is_refused_in_one_line(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("loss 2.3\nloss 2.2\n")
    assert main(["calibrate", *JOB, "--measured", str(log), "--out", str(tmp_path / "p.yaml")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no timed step" in err[0]
