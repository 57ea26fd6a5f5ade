"""A Job as the files a cluster launches: `toolkit export --config job.yaml --to TARGET [--nodes N]
[--gpus-per-node G] --out DIR` writes exactly one file into DIR.

- accelerate: an accelerate config (its own loader reads it) that only starts processes, leaving the program to
  the toolkit (`mixed_precision: 'no'`, no dynamo, multi-GPU, machines and processes from the job or the flags);
- torchrun: a bash script that writes the job (dp fixed for the world) into the run folder and starts one
  toolkit rank per GPU on this node with torchrun;
- slurm: the same as an sbatch script for N nodes (srun starts torchrun on each);
- deepspeed: DeepSpeed's JSON for a job that uses ZeRO, as the runner configures DeepSpeed's engine.
A plan for 1,024 GPUs exported for a 2-node trial is normal: --nodes/--gpus-per-node that disagree with the job's
devices override them (dp follows), with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import yaml

from ..capability import run_refusal
from ..specs import Job, SpecError, load_catalog

__all__ = ["TARGETS", "export_job", "accelerate_config"]

TARGETS = {
    "accelerate": "accelerate_config.yaml",
    "torchrun": "run_torchrun.sh",
    "slurm": "run_slurm.sbatch",
    "deepspeed": "deepspeed_config.json",
}
PORT = 29500


@dataclasses.dataclass(frozen=True)
class Exported:
    path: Path
    warnings: list[str]
    command: str
    """How to use the file (printed by the CLI)."""


def _sized(job: Job, catalog, nodes: int | None, gpus_per_node: int | None, warnings: list[str]) -> Job:
    """The resolved job on nodes × gpus-per-node devices (the job's own when no flag is given), dp following."""
    for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise SpecError(name, value, "must be 1 or more")
    resolved, _ = job.resolve(catalog)
    per_node = gpus_per_node or resolved.cluster.gpus_per_node
    if nodes is None:  # the job's devices: one node may be partly used
        per_node = min(per_node, resolved.cluster.count)
        nodes = max(1, resolved.cluster.count // per_node)
    count = nodes * per_node
    if count != resolved.cluster.count:
        warnings.append(
            f"the job plans {resolved.cluster.count} devices; exported for {count} "
            f"({count // per_node} node(s) × {per_node}), dp following"
        )
    par = dataclasses.replace(job.parallel, dp=None)
    cluster = dataclasses.replace(job.cluster, count=count, gpus_per_node=per_node)
    return job.replace(parallel=par, cluster=cluster).resolve(catalog)[0]


def export_job(
    job: Job, target: str, out_dir: str | Path, nodes: int | None = None, gpus_per_node: int | None = None, catalog=None
) -> Exported:
    """Write the job as TARGETS[target] into out_dir (the user's catalog rows, if any, in `catalog`)."""
    if target not in TARGETS:
        raise SpecError("--to", target, f"allowed: {', '.join(TARGETS)}")
    warnings: list[str] = []
    job = _sized(job, catalog or load_catalog(), nodes, gpus_per_node, warnings)
    if target == "deepspeed":
        text, command = _deepspeed(job)
    else:
        refusal = run_refusal(job)
        if refusal:
            raise SpecError(*refusal)
        text, command = {"accelerate": _accelerate, "torchrun": _torchrun, "slurm": _slurm}[target](job)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TARGETS[target]
    path.write_text(text, encoding="utf-8")
    if target in ("torchrun", "slurm"):
        path.chmod(0o755)
    return Exported(path=path, warnings=warnings, command=command.replace("FILE", shlex.quote(str(path))))


def _shape(job: Job) -> tuple[int, int]:
    per_node = job.cluster.gpus_per_node
    return job.cluster.count // per_node, per_node


def _describe(job: Job) -> str:
    p = job.parallel
    return (
        f"{job.model.name or 'model'} on {job.cluster.count} × {job.cluster.accelerator or 'GPU'} "
        f"[dp {p.dp} · tp {p.tp} · pp {p.pp}{' · ZeRO-' + str(p.zero) if p.zero else ''}] {job.precision.mode}"
    )


def accelerate_config(job: Job) -> str:
    """The accelerate config for a resolved job's world (what `--to accelerate` writes, without the command)."""
    return _accelerate(job)[0]


def _accelerate(job: Job) -> tuple[str, str]:
    nodes, per_node = _shape(job)
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "MULTI_GPU" if job.cluster.count > 1 else "NO",
        "downcast_bf16": "no",
        "dynamo_config": {},
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "no",
        "num_machines": nodes,
        "num_processes": job.cluster.count,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }
    if nodes > 1:
        config.update(main_process_ip="MAIN_NODE_ADDRESS", main_process_port=PORT)
    header = (
        f"# toolkit export: {_describe(job)}\n# accelerate starts the processes only; the toolkit runs the "
        "program (its precision, layout and optimizer come from the job)\n"
    )
    world = (
        f"--gpus {job.cluster.count}x{job.cluster.accelerator}"
        if job.cluster.accelerator
        else f"--dp {job.parallel.dp}"
    )
    command = (
        f"toolkit estimate --config JOB.yaml {world} --write-job OUT/job.yaml   # the job for this world, "
        "then on each machine:\n"
        "accelerate launch --config_file FILE --machine_rank R -m toolkit.train.worker OUT/job.yaml OUT"
    )
    return header + yaml.safe_dump(config, sort_keys=True), command


def _job_heredoc(job: Job) -> str:
    return "cat > \"$OUT/job.yaml\" <<'TOOLKIT_JOB'\n" + job.to_yaml() + "TOOLKIT_JOB\n"


def _torchrun(job: Job) -> tuple[str, str]:
    nodes, per_node = _shape(job)
    name = job.model.name or "run"
    script = (
        f"#!/usr/bin/env bash\n# toolkit export: {_describe(job)}\n"
        f"# Run on each of the {nodes} node(s): NODE_RANK=<0..{nodes - 1}> MASTER_ADDR=<node 0> bash "
        f'{TARGETS["torchrun"]} [OUT]\nset -euo pipefail\nOUT="${{1:-runs/{name}}}"\nmkdir -p "$OUT"\n'
        + _job_heredoc(job)
        + f'exec torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank "${{NODE_RANK:-0}}" '
        f'--master-addr "${{MASTER_ADDR:-127.0.0.1}}" --master-port "${{MASTER_PORT:-{PORT}}}" '
        '-m toolkit.train.worker "$OUT/job.yaml" "$OUT"\n'
    )
    return script, "bash FILE runs/NAME      # on every node, with NODE_RANK and MASTER_ADDR set"


def _slurm(job: Job) -> tuple[str, str]:
    nodes, per_node = _shape(job)
    name = job.model.name or "run"
    script = (
        f"#!/usr/bin/env bash\n#SBATCH --job-name=toolkit-{name}\n#SBATCH --nodes={nodes}\n"
        f"#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node={per_node}\n#SBATCH --exclusive\n"
        f"# toolkit export: {_describe(job)}; one torchrun per node (srun), one toolkit rank per GPU\n"
        "set -euo pipefail\n"
        f'OUT="${{OUT:-runs/{name}-${{SLURM_JOB_ID:-local}}}}"      # on a filesystem every node sees\n'
        'mkdir -p "$OUT"\n'
        + _job_heredoc(job)
        + 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node {per_node} --rdzv-backend c10d '
        f'--rdzv-endpoint "$MASTER_ADDR:{PORT}" --rdzv-id "$SLURM_JOB_ID" '
        '-m toolkit.train.worker "$OUT/job.yaml" "$OUT"\n'
    )
    return script, "sbatch FILE"


def _deepspeed(job: Job) -> tuple[str, str]:
    if job.parallel.zero == 0:
        raise SpecError("parallel.zero", 0, "the DeepSpeed export is for jobs that use ZeRO (give --zero 1, 2 or 3)")
    from .deepspeed import deepspeed_config

    config = {"train_batch_size": job.batch.global_batch, **deepspeed_config(job)}
    return json.dumps(config, indent=2) + "\n", "deepspeed --num_gpus G your_script.py --deepspeed_config FILE"
