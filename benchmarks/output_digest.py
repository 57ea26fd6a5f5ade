"""Every public output of the estimator, written out so that a refactor can prove it changed none of them.

    .venv/bin/python benchmarks/output_digest.py --out before/    # on the old code
    .venv/bin/python benchmarks/output_digest.py --out after/     # on the new code
    diff -r before/ after/                                        # must print nothing

What it writes (one file each):
- `memory.json`: every figure of `memory_estimate` (each phase, each state term) and of `stage_memory_estimate` on
  every pipeline rank, for each job of benchmarks/memory_accuracy.py's matrix, floats in full (repr);
- `cli.txt`: `toolkit estimate --json`, `doctor --json` and `plan --json` output (or the one-line refusal) for the
  README's examples, every preset on a few clusters, and a seeded random set of flag combinations, odd values
  included (the property tests' ranges), which exercises every rule of Job.resolve;
- `grid.json`: `layout_grid`'s validity and the memory model's arrays over a few thousand layouts of three jobs.
Headline figures come last: how many outputs were written, and the grid's layouts per second.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from memory_accuracy import matrix  # noqa: E402

from toolkit.cli import main as cli  # noqa: E402
from toolkit.estimate.grid import layout_grid  # noqa: E402
from toolkit.estimate.memory import memory_estimate, stage_memory_estimate  # noqa: E402
from toolkit.specs import Job, load_catalog  # noqa: E402

CATALOG = load_catalog()
README = [
    "estimate --model gpt3-175b --tokens 300e9 --gpus 1024xA100-80GB --tp 8 --pp 16 --zero 1 --precision mixed-bf16 "
    "--mfu 0.45 --offer p4de.24xlarge",
    "plan --model llama2-70b --offers p5.48xlarge,p4de.24xlarge --objective cost --max-gpus 512 --precision mixed-bf16",
    "doctor --model llama2-70b --gpus 64xH100-SXM --tp 8 --pp 4 --zero 1 --precision mixed-bf16",
    "estimate --model llama2-7b --seq 512 --precision pure-bf16 --gpus 1xRTX-4090 --finetune lora --lora-rank 16 "
    "--lora-targets q,v",
    "estimate --model llama2-7b --seq 512 --precision pure-bf16 --gpus 1xRTX-4090 --finetune qlora --lora-rank 16 "
    "--lora-targets q,v",
    "estimate --model llama2-7b --gpus 8xH100-SXM --zero 3 --precision mixed-bf16 --mfu 0.4",
]
CHOICES = {  # flag: (sensible values, odd ones as tests/test_properties.py draws them)
    "--gpus": (
        [
            "1xA100-80GB",
            "8xA100-80GB",
            "64xH100-SXM",
            "16xAscend-910B",
            "8xMLU370-X8",
            "512xH100-SXM",
            "4xRTX-4090",
            "8xV100-32GB",
            "32xH100-SXM",
        ],
        ["0xA100-80GB", "8xTPU", "12xA100-40GB"],
    ),
    "--precision": (["fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "mixed-fp16", "pure-bf16"], ["bf16"]),
    "--tp": ([1, 2, 4, 8], [3, 0]),
    "--pp": ([1, 2, 4], [3, -1]),
    "--dp": ([1, 2, 4, 8], [0]),
    "--vpp": ([1, 2], [3]),
    "--cp": ([1, 2], [3]),
    "--zero": ([0, 1, 2, 3], [4]),
    "--offload": (["none", "optimizer", "params"], ["disk"]),
    "--recompute": (["none", "selective", "full"], ["some"]),
    "--micro-batch": ([1, 2, 4], [0]),
    "--global-batch": ([64, 512, 1024], [7]),
    "--seq": ([512, 2048, 4096], [0]),
    "--dropout": ([0.0, 0.1], [2]),
    "--mfu": ([0.4], [0, 1.5]),
    "--tokens": (["1e9", "300e9"], ["-1"]),
    "--finetune": (["lora", "qlora", "full"], ["prefix"]),
    "--lora-rank": ([8, 16], [0]),
    "--lora-targets": (["q,v", "q,k,v,o,up,down", "gate"], [""]),
    "--schedule": (["1f1b", "gpipe"], ["zb"]),
    "--backend": (["torch", "deepspeed", "megatron"], ["jax"]),
    "--attention": (["flash", "eager"], []),
    "--optimizer": (["adamw", "adam", "sgd", "adamw-8bit"], []),
    "--optimizer-impl": (["for-loop", "foreach", "fused"], []),
    "--headroom": ([0.02, 0.1], [1.0]),
    "--grad-dtype": (["param", "fp32"], ["fp64"]),
}
SWITCHES = ["--sp", "--fp8", "--spot", "--expandable-segments"]


def _float(value):
    return repr(float(value)) if np.ndim(value) == 0 else [repr(float(v)) for v in np.ravel(value)]


def _memory_dump(mem) -> dict:
    out = {
        f.name: _float(getattr(mem, f.name))
        for f in dataclasses.fields(mem)
        if f.name not in ("phases", "states", "peak_phase")
    }
    out["peak_phase"] = np.asarray(mem.peak_phase).tolist()
    out["phases"] = {k: _float(v) for k, v in mem.phases.items()}
    out["states"] = {f.name: _float(getattr(mem.states, f.name)) for f in dataclasses.fields(mem.states)}
    return out


def memory_outputs() -> dict:
    rows = {}
    for name, data in matrix():
        job, _ = Job.from_dict(data).resolve()
        entry = {"busiest": _memory_dump(memory_estimate(job))}
        for rank in range(job.parallel.pp) if job.parallel.pp > 1 else ():
            entry[f"pp rank {rank}"] = _memory_dump(stage_memory_estimate(job, rank))
        rows[name] = entry
    return rows


def _run_cli(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli(argv)
        except SystemExit as stop:  # argparse's refusals
            code = stop.code
        except Exception as crash:  # a traceback a user would see: recorded and counted, not hidden
            code = f"crash {type(crash).__name__}: {crash}"
    return f"$ {' '.join(argv)}\nrc {code}\n{out.getvalue()}{err.getvalue()}\n"


def _random_argv(rng: random.Random) -> list[str]:
    argv = (
        ["--model", rng.choice(sorted(CATALOG.presets))]
        if rng.random() < 0.8
        else [
            "--layers",
            str(rng.choice([2, 24, 80, 0])),
            "--hidden",
            str(rng.choice([64, 1024, 4096, 48])),
            "--heads",
            str(rng.choice([4, 8, 32, 3])),
        ]
    )
    odd = rng.random() < 0.25  # a quarter of the samples may carry odd values
    for flag, (sensible, strange) in CHOICES.items():
        if rng.random() < (0.6 if flag in ("--gpus", "--precision", "--tp", "--pp", "--zero") else 0.12):
            values = sensible + strange if odd and strange else sensible
            argv += [flag, str(rng.choice(values))]
    argv += [s for s in SWITCHES if rng.random() < 0.1]
    return argv


def cli_outputs(samples: int) -> str:
    texts = [_run_cli(line.split() + ["--json"]) for line in README]
    for preset in sorted(CATALOG.presets):
        for gpus in ("8xH100-SXM", "64xA100-80GB"):
            texts.append(_run_cli(["estimate", "--json", "--model", preset, "--gpus", gpus, "--tokens", "1e10"]))
    rng = random.Random(2026)
    for i in range(samples):
        command = "plan" if i % 25 == 0 else "doctor" if i % 5 == 0 else "estimate"
        argv = [command, "--json", *_random_argv(rng)]
        if command == "plan" and "--gpus" not in argv:
            argv += ["--gpus", "16xH100-SXM"]
        texts.append(_run_cli(argv))
    return "".join(texts)


def grid_outputs() -> tuple[dict, float]:
    out, layouts, seconds = {}, 0, 0.0
    for name, data in (
        (
            "llama2-70b/mixed",
            {
                "model": {"preset": "llama2-70b"},
                "precision": {"mode": "mixed-bf16"},
                "cluster": {"accelerator": "H100-SXM", "count": 512},
            },
        ),
        (
            "gpt3-13b/amp",
            {
                "model": {"preset": "gpt3-13b"},
                "precision": {"mode": "amp-bf16"},
                "cluster": {"accelerator": "A100-80GB", "count": 64},
            },
        ),
        (
            "llama3-8b/fp32",
            {
                "model": {"preset": "llama3-8b"},
                "precision": {"mode": "fp32"},
                "cluster": {"accelerator": "A100-80GB", "count": 16},
                "batch": {"global_batch": 256},
            },
        ),
    ):
        job, _ = Job.from_dict(data).resolve()
        start = time.perf_counter()
        grid = layout_grid(
            job,
            tp=[1, 2, 4, 8],
            pp=[1, 2, 4, 8],
            vpp=[1, 2],
            sp=[False, True],
            zero=[0, 1, 2, 3],
            offload=["none", "optimizer", "params"],
            micro_batch=[1, 2, 4],
            recompute=["none", "selective", "full"],
        )
        mem = memory_estimate(grid.job)
        seconds += time.perf_counter() - start
        layouts += len(grid)
        dump = _memory_dump(mem)
        out[name] = {
            "valid": grid.valid.tolist(),
            "sha256": hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest(),
            "peak_bytes": dump["peak_bytes"][:50],
        }
    return out, layouts / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write memory.json, cli.txt and grid.json into")
    parser.add_argument("--samples", type=int, default=1500, help="random flag combinations (default 1500)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    memory = memory_outputs()
    (out / "memory.json").write_text(json.dumps(memory, indent=1, sort_keys=True))
    cli_text = cli_outputs(args.samples)
    (out / "cli.txt").write_text(cli_text)
    grid, rate = grid_outputs()
    (out / "grid.json").write_text(json.dumps(grid, indent=1, sort_keys=True))
    print(f"memory rows: {len(memory)}")
    print(f"cli outputs: {cli_text.count('$ ')}")
    print(f"refusals: {cli_text.count(chr(10) + 'rc 2' + chr(10))}")
    print(f"crashes: {cli_text.count(chr(10) + 'rc crash')}")
    print(f"grid layouts per s: {rate:.3g}")


if __name__ == "__main__":
    main()
