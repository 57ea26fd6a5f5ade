"""`toolkit export`: one file per target, each read by its own tool's loader or parser; the torchrun script trains."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from toolkit.cli import main
from toolkit.runs.folder import read_rank_memory
from toolkit.specs import Job

TINY = str(Path(__file__).parents[2] / "examples" / "tiny.yaml")
ZERO3 = ["--model", "llama2-7b", "--precision", "mixed-bf16", "--zero", "3", "--gpus", "16xA100-80GB"]


def export(capsys, tmp_path, *argv):
    code = main(["export", *argv, "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    files = list((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    return code, files, out, err


def embedded_job(script: Path) -> Job:
    text = re.search(r"<<'TOOLKIT_JOB'\n(.*)\nTOOLKIT_JOB\n", script.read_text(), re.S).group(1)
    return Job.from_dict(yaml.safe_load(text))


def test_accelerate_config_loads_in_accelerate_and_leaves_the_program_to_us(capsys, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    code, files, _, err = export(
        capsys, tmp_path, "--config", TINY, "--nodes", "2", "--gpus-per-node", "2", "--to", "accelerate"
    )
    assert code == 0 and len(files) == 1 and "warning" in err  # 2 × 2 devices where the job planned 1
    config = load_config_from_file(str(files[0]))
    assert (config.num_machines, config.num_processes, str(config.mixed_precision)) == (2, 4, "no")
    assert config.distributed_type.value == "MULTI_GPU"


@pytest.mark.parametrize("target", ["torchrun", "slurm"])
def test_scripts_parse_in_bash_and_carry_the_job_for_their_world(capsys, tmp_path, target):
    code, files, _, _ = export(
        capsys,
        tmp_path,
        "--model",
        "gpt2",
        "--tp",
        "2",
        "--global-batch",
        "64",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--to",
        target,
    )
    assert code == 0 and len(files) == 1
    assert subprocess.run(["bash", "-n", str(files[0])]).returncode == 0
    job = embedded_job(files[0]).resolve()[0]
    assert (job.cluster.count, job.parallel.dp, job.parallel.tp) == (16, 8, 2)
    if target == "slurm":
        assert "#SBATCH --nodes=2" in files[0].read_text() and "#SBATCH --gpus-per-node=8" in files[0].read_text()


def test_deepspeed_json_loads_in_deepspeed_for_its_data_parallel_world(capsys, tmp_path):
    code, files, _, _ = export(capsys, tmp_path, *ZERO3, "--to", "deepspeed")
    assert code == 0 and len(files) == 1
    script = (
        "import sys\n"
        "import deepspeed.runtime.config as config\n"
        # the config asks the process group for this rank only; a real one on CPU first JIT-builds DeepSpeed's
        # shared-memory op (~50 s in a fresh environment), which a config check does not need
        "config.dist.get_rank = lambda: 0\n"
        "DeepSpeedConfig = config.DeepSpeedConfig\n"
        "class DataParallel16:\n"
        "    def get_data_parallel_world_size(self): return 16\n"
        "    def get_data_parallel_rank(self): return 0\n"
        "    def get_model_parallel_world_size(self): return 1\n"
        "    def get_model_parallel_rank(self): return 0\n"
        "c = DeepSpeedConfig(sys.argv[1], mpu=DataParallel16())\n"
        "print(c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,"
        " c.zero_optimization_stage)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(files[0])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    batch, micro, accum, stage = map(int, done.stdout.split()[-4:])
    data = json.loads(files[0].read_text())
    assert (batch, micro, stage) == (data["train_batch_size"], 1, 3) and batch == micro * accum * 16


def test_refusals_are_one_line(capsys, tmp_path):
    code, files, _, err = export(capsys, tmp_path, "--model", "gpt2", "--to", "deepspeed")
    assert code == 2 and not files and len(err.strip().splitlines()) == 1 and "ZeRO" in err
    code, _, _, err = export(capsys, tmp_path, "--model", "gpt2", "--to", "kubernetes")
    assert code == 2 and "allowed: accelerate, torchrun, slurm, deepspeed" in err
    code, _, _, err = export(
        capsys, tmp_path, "--model", "gpt2", "--tp", "2", "--precision", "mixed-bf16", "--to", "torchrun"
    )  # Megatron's program: estimated, not run
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_the_torchrun_script_and_accelerate_launch_train_the_same_steps_on_two_gloo_ranks(capsys, tmp_path, corpus):
    """The exported torchrun script, and `toolkit train --launcher accelerate` (the path `auto` takes where CUDA
    GPUs are: accelerate launch with a config written from the job), train the same job to the same bits."""
    from accelerate.commands.config.config_args import load_config_from_file

    code, files, _, _ = export(
        capsys,
        tmp_path,
        "--config",
        TINY,
        "--steps",
        "3",
        "--data",
        str(corpus),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--to",
        "torchrun",
    )
    assert code == 0
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MASTER_PORT": "29562",
    }
    done = subprocess.run(
        ["bash", str(files[0]), str(tmp_path / "run")], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    torchrun = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in torchrun] == [1, 2, 3]
    out = tmp_path / "accelerate"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "train",
            "--config",
            TINY,
            "--steps",
            "3",
            "--data",
            str(corpus),
            "--nproc",
            "2",
            "--launcher",
            "accelerate",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "starting: accelerate launch --config_file" in done.stdout  # the command is shown
    config = load_config_from_file(str(out / "accelerate_config.yaml"))
    assert (config.num_processes, str(config.mixed_precision)) == (2, "no")
    assert [r["rank"] for r in read_rank_memory(out)] == [0, 1]  # two ranks, each measured
    launched = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in launched] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in torchrun
    ]


def test_export_reads_the_users_catalog(capsys, tmp_path):
    """An accelerator from --catalog resolves in the export as it does in estimate (it used the built-in only)."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "accelerators:\n  - name: MyGPU\n    vendor: Me\n    memory_bytes: 85899345920\n"
        "    memory_bw_bytes_per_s: 2.0e12\n    link_bw_bytes_per_s: 4.0e11\n    tdp_w: 500\n"
        "    peak_tflops: {fp32: 50, tf32: n/a, fp16: 400, bf16: 400, fp8: n/a, int8: unknown}\n"
        "    source: a test\n    as_of: 2026-12-02\n"
    )
    code, files, _, err = export(
        capsys, tmp_path, "--model", "gpt2", "--gpus", "2xMyGPU", "--catalog", str(mine), "--to", "torchrun"
    )
    assert code == 0, err
    assert embedded_job(files[0]).cluster.accelerator == "MyGPU"
