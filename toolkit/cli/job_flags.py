"""A Job from the command line: one table of flags (flag -> Job section and field) drives argparse's options, the
job's overrides and the translation of an error's field back to its flag; the layout axes' flags come from
toolkit.specs.axes."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Literal, get_args, get_origin, get_type_hints

from ..specs import Job, SpecError
from ..specs.axes import AXES
from ..specs.job import (
    Batch,
    Cluster,
    Cost,
    Finetune,
    MemoryOptions,
    Moe,
    Optimizer,
    Overlap,
    Parallel,
    Precision,
    Serving,
    Training,
)
from ..specs.model import ModelSpec
from ..specs.yamlio import read_yaml
from .field_help import field_help

__all__ = [
    "OVERRIDES",
    "TRAIN_OVERRIDES",
    "add_job_args",
    "parse_gpus",
    "job_from_args",
    "flag_hint",
    "fixed_axes",
    "cpu_precision",
    "training_job",
]


SERVING_FLAGS = (
    "concurrency",
    "input_tokens",
    "output_tokens",
    "max_context",
    "weights",
    "group_size",
    "kv_dtype",
    "sparsity",
    "memory_fraction",
    "block_size",
    "max_batched_tokens",
    "target_tokens_per_s",
    "target_requests_per_s",
    "engine",
    "max_num_seqs",
    "rate",
    "requests",
    "lengths",
    "range_ratio",
    "max_ttft_s",
    "host_s_per_step",
    "prefix_cache_hit",
    "prefill_workers",
    "decode_workers",
    "spec_tokens",
    "acceptance",
    "draft_cost",
)
"""The serving section's flags (`--workload inference`), each named as its field."""

# flag -> (section, field, spec class): one table drives argparse help, the job overrides and the
# translation of error messages back to flag names.
_SECTIONS = {"parallel": Parallel, "batch": Batch, "memory": MemoryOptions}
OVERRIDES = {
    "seq": ("model", "seq_len", ModelSpec),
    "layers": ("model", "layers", ModelSpec),
    "hidden": ("model", "hidden", ModelSpec),
    "heads": ("model", "heads", ModelSpec),
    "kv_heads": ("model", "kv_heads", ModelSpec),
    "ffn": ("model", "ffn", ModelSpec),
    "vocab": ("model", "vocab", ModelSpec),
    "mlp": ("model", "mlp", ModelSpec),
    "norm": ("model", "norm", ModelSpec),
    "position": ("model", "position", ModelSpec),
    "tie_embeddings": ("model", "tie_embeddings", ModelSpec),
    "dropout": ("model", "dropout", ModelSpec),
    "experts": ("model", "experts", ModelSpec),
    "top_k": ("model", "experts_per_token", ModelSpec),
    "expert_ffn": ("model", "expert_ffn", ModelSpec),
    "shared_experts": ("model", "shared_experts", ModelSpec),
    "dense_layers": ("model", "dense_layers", ModelSpec),
    "router": ("model", "router", ModelSpec),
    "capacity_factor": ("model", "capacity_factor", ModelSpec),
    "expert_imbalance": ("model", "expert_imbalance", ModelSpec),
    "balance_loss": ("model", "balance_loss", ModelSpec),
    "global_batch": ("batch", "global_batch", Batch),
    "precision": ("precision", "mode", Precision),
    "grad_dtype": ("precision", "grad_dtype", Precision),
    "fp8": ("precision", "fp8", Precision),
    "fp8_recipe": ("precision", "fp8_recipe", Precision),
    "fp8_all_gather": ("precision", "fp8_all_gather", Precision),
    "optimizer": ("optimizer", "name", Optimizer),
    "momentum": ("optimizer", "momentum", Optimizer),
    "optimizer_impl": ("optimizer", "impl", Optimizer),
    "moment_dtype": ("optimizer", "moment_dtype", Optimizer),
    "dp": ("parallel", "dp", Parallel),
    **{axis.name: (axis.section, axis.name, _SECTIONS[axis.section]) for axis in AXES},  # the layout axes' flags
    "stage_layers": ("parallel", "stage_layers", Parallel),
    "recompute_modules": ("memory", "recompute_modules", MemoryOptions),
    "pipeline_layout": ("parallel", "pipeline_layout", Parallel),
    "partition": ("parallel", "partition", Parallel),
    "schedule": ("parallel", "schedule", Parallel),
    "backend": ("parallel", "backend", Parallel),
    "overlap_grad_reduce": ("overlap", "grad_reduce", Overlap),
    "overlap_param_gather": ("overlap", "param_gather", Overlap),
    "overlap_ep_comm": ("overlap", "ep_comm", Overlap),
    "dispatcher": ("moe", "dispatcher", Moe),
    "fp8_dispatch": ("moe", "fp8_dispatch", Moe),
    "max_nodes_per_token": ("model", "max_nodes_per_token", ModelSpec),
    "overlap_tp_comm": ("overlap", "tp_comm", Overlap),
    "act_compress": ("memory", "act_compress", MemoryOptions),
    "attention": ("memory", "attention", MemoryOptions),
    "attention_kernel": ("memory", "attention_kernel", MemoryOptions),
    "headroom": ("memory", "headroom_fraction", MemoryOptions),
    "expandable_segments": ("memory", "expandable_segments", MemoryOptions),
    "gpus_per_node": ("cluster", "gpus_per_node", Cluster),
    "host_memory_gib": ("cluster", "host_memory_gib", Cluster),
    "offer": ("cost", "offer", Cost),
    "spot": ("cost", "spot", Cost),
    "interruptions": ("cost", "interruptions_per_month", Cost),
    "pue": ("cost", "pue", Cost),
    "kwh_price": ("cost", "energy_price_per_kwh", Cost),
    "grid_co2": ("cost", "grid_kg_co2_per_kwh", Cost),
    "finetune": ("finetune", "method", Finetune),
    "lora_rank": ("finetune", "rank", Finetune),
    "lora_targets": ("finetune", "targets", Finetune),
    "base_weights": ("finetune", "base_weights", Finetune),
    "dataset_tokens": ("finetune", "dataset_tokens", Finetune),
    "epochs": ("finetune", "epochs", Finetune),
    **{flag: ("serving", flag, Serving) for flag in SERVING_FLAGS},
    "max_tpot_s": ("serving", "max_tpot_s", Serving),
    "workload": ("", "workload", Job),
    "tokens": ("", "tokens", Job),
    "mfu": ("", "mfu", Job),
    "compile": ("training", "compile", Training),  # prices the step (fused element-wise kernels) as it trains
}
# flags that only `toolkit train` takes: the runner's section of the Job
TRAIN_OVERRIDES = {
    "steps": ("training", "steps", Training),
    "lr": ("training", "lr", Training),
    "warmup": ("training", "warmup_steps", Training),
    "data": ("training", "data", Training),
    "seed": ("training", "seed", Training),
    "grad_clip": ("training", "grad_clip", Training),
    "eval_every": ("training", "eval_every", Training),
    "checkpoint_every": ("training", "checkpoint_every", Training),
    "bucket_cap_mb": ("training", "bucket_cap_mb", Training),
    "num_workers": ("training", "num_workers", Training),
    "fp32_norm": ("training", "fp32_norm", Training),
    "loss_scale": ("training", "loss_scale", Training),
    "init_from": ("training", "init_from", Training),
}
_BOOLEAN = {
    "overlap_ep_comm",
    "fp8_dispatch",
    "tie_embeddings",
    "sp",
    "spot",
    "fp32_norm",
    "compile",
    "fp8",
    "fp8_all_gather",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_tp_comm",
    "expandable_segments",
}
_FLAG_OF_FIELD = {
    f"{sec}.{fld}" if sec else fld: "--" + flag.replace("_", "-")
    for flag, (sec, fld, _cls) in {**OVERRIDES, **TRAIN_OVERRIDES}.items()
}
_FLAG_OF_FIELD.update(
    {
        "cluster.count": "--gpus",
        "cluster.accelerator": "--gpus",
        "model.params": "--params",
        "model.preset": "--model",
        "hf_config": "--hf-config",
        "job file": "--config",
        "catalog file": "--catalog",
    }
)


def _allowed(cls, name) -> str:
    """The choices of a Literal field (also inside `Literal[...] | None`), as argparse shows them."""
    values, hint = [], get_type_hints(cls)[name]
    if get_origin(hint) is tuple:
        return "A,B,..."
    for arg in get_args(hint):
        if get_origin(arg) is Literal:
            values.extend(get_args(arg))
        elif get_origin(arg) is tuple:  # (stage_layers, lora targets: comma-separated)
            return "A,B,..."
        elif arg is not type(None):
            values.append(arg)
    return "{" + ",".join(str(v) for v in values) + "}" if values and not isinstance(values[0], type) else ""


ALIASES = {
    # the serving engines' and their benchmarks' names (vLLM, SGLang, TensorRT-LLM)
    "max_num_seqs": ("--max-running-requests", "--max-batch-size"),
    "max_batched_tokens": ("--max-num-batched-tokens", "--chunked-prefill-size", "--max-num-tokens"),
    "rate": ("--request-rate",),
    "spec_tokens": ("--num-speculative-tokens",),
    "requests": ("--num-prompts",),
    "lengths": ("--dataset-name",),
    "range_ratio": ("--random-range-ratio",),
    "tp": ("--tensor-model-parallel-size",),
    "pp": ("--pipeline-model-parallel-size",),
    "vpp": ("--virtual-pipeline-model-parallel-size",),
    "cp": ("--context-parallel-size",),
    "ep": ("--expert-model-parallel-size",),
    "etp": ("--expert-tensor-parallel-size",),
    "pipeline_layout": ("--pipeline-model-parallel-layout",),
    "overlap_ep_comm": ("--overlap-moe-expert-parallel-comm",),
    "dispatcher": ("--moe-token-dispatcher-type",),
    "moment_dtype": ("--exp-avg-dtype",),
    "micro_batch": ("--micro-batch-size",),
    "global_batch": ("--global-batch-size",),
    "compile": ("--compile.enable",),  # torchtitan's
}
"""Megatron-Core's (and torchtitan's) names of our flags, accepted as they are (a Megatron command line's layout
pastes in)."""


def add_job_args(est: argparse.ArgumentParser, extra: dict | None = None) -> None:
    src = est.add_argument_group("model (one of)")
    src.add_argument("--model", metavar="PRESET", help="catalog preset, e.g. gpt3-175b, llama2-7b")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its folder) on disk")
    src.add_argument("--params", metavar="N", help="a size-only model of N parameters")
    est.add_argument("--config", metavar="JOB.yaml", help="start from a job file; flags override it")
    for flag, (sec, fld, cls) in {**OVERRIDES, **(extra or {})}.items():
        options = ("--" + flag.replace("_", "-"), *ALIASES.get(flag, ()))
        where = field_help(cls, fld, f"{sec}.{fld}" if sec else fld)
        if flag == "fp8":  # --fp8, --fp8 mxfp8 (a recipe), --no-fp8
            est.add_argument(*options, nargs="?", const=True, default=None, metavar="RECIPE", help=where)
            est.add_argument("--no-fp8", dest="fp8", action="store_const", const=False, help="no FP8 matmuls")
        elif flag in _BOOLEAN:
            est.add_argument(*options, action=argparse.BooleanOptionalAction, default=None, help=where)
        else:
            est.add_argument(*options, metavar=_allowed(cls, fld) or "X", default=None, help=where)
    est.add_argument("--gpus", metavar="COUNTxNAME", help="accelerators, e.g. 8xA100-80GB or 1024xH100-SXM")
    est.add_argument(
        "--catalog",
        metavar="FILE",
        action="append",
        default=[],
        help="YAML file with your own accelerator/offer/preset rows (repeatable)",
    )
    est.add_argument("--write-job", metavar="PATH", help="save the resolved job as YAML")
    est.add_argument("--json", action="store_true", help="print one JSON object")


def parse_gpus(text: str) -> tuple[int, str]:
    """'1024xA100-80GB' -> (1024, 'A100-80GB')."""
    match = re.fullmatch(r"\s*(\d+)\s*[x×*]\s*(\S+)\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise SpecError("--gpus", text, "expected COUNTxNAME, e.g. 8xA100-80GB")
    return int(match.group(1)), match.group(2)


def job_from_args(args, catalog) -> Job:
    """Job file (if any), then model source, then every flag given, in that order."""
    data = {}
    if args.config:
        data = read_yaml(args.config, what="job file") or {}
        if not isinstance(data, dict):
            raise SpecError("job file", args.config, "expected a mapping with sections model, batch, ...")
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    sources = [
        (flag, value)
        for flag, value in (("--model", args.model), ("--hf-config", args.hf_config), ("--params", args.params))
        if value is not None
    ]
    if len(sources) > 1:
        raise SpecError(sources[1][0], sources[1][1], f"give one model source; {sources[0][0]} is given too")
    if sources:
        key = {"--model": "preset", "--hf-config": "hf_config", "--params": "params"}[sources[0][0]]
        data["model"] = {key: sources[0][1]}
    for flag, (sec, fld, _cls) in {**OVERRIDES, **TRAIN_OVERRIDES}.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag == "fp8" and isinstance(value, str):  # --fp8 mxfp8: FP8 with that recipe
            data.setdefault("precision", {})["fp8_recipe"] = value
            value = True
        if flag in ("lora_targets", "stage_layers", "recompute_modules"):  # comma-separated lists
            value = [t.strip() for t in str(value).split(",") if t.strip()]
        if sec:
            section = data.setdefault(sec, {})
            if not isinstance(section, dict):
                raise SpecError(sec, section, "expected a mapping")
            section[fld] = value
        else:
            data[fld] = value
    if getattr(args, "finetune", None) is not None and getattr(args, "workload", None) is None:
        data.setdefault("workload", "finetune")  # --finetune full is a fine-tune, not pretraining
    if args.gpus:
        count, name = parse_gpus(args.gpus)
        data.setdefault("cluster", {}).update(count=count, accelerator=name)
    if "model" not in data:
        raise SpecError(
            "model",
            None,
            "no model given: use --model PRESET, --hf-config PATH, --params N, "
            "--layers/--hidden/--heads, or --config job.yaml",
        )
    return Job.from_dict(data, catalog)


def flag_hint(err: SpecError) -> str:
    flag = _FLAG_OF_FIELD.get(err.field)
    return f"{flag}: {err}" if flag and not str(err).startswith(flag) else str(err)


def fixed_axes(args) -> set[str]:
    """Layout axes the user fixed on the command line or in the job file: the search leaves them alone."""
    fixed = {axis.name for axis in AXES if getattr(args, axis.name, None) is not None}
    # an MoE's dispatcher and overlap are searched too (toolkit.plan.moe_options) unless given
    options = {"dispatcher": ("moe", "dispatcher"), "ep_comm": ("overlap", "ep_comm")}
    fixed |= {name for name, (_, key) in options.items() if getattr(args, OPTION_FLAGS[name], None) is not None}
    if args.config:
        data = read_yaml(args.config, what="job file") or {}
        fixed |= {axis.name for axis in AXES if axis.name in (data.get(axis.section) or {})}
        fixed |= {name for name, (section, key) in options.items() if key in (data.get(section) or {})}
    return fixed


OPTION_FLAGS = {"dispatcher": "dispatcher", "ep_comm": "overlap_ep_comm"}
"""The argparse names of the searched MoE options."""


def cpu_precision(args, job: Job) -> Job:
    """Without a GPU, a run whose precision nobody chose trains in fp32: this CPU's bf16 autocast runs 20-30x
    slower (the README's example: 124 tokens/s against 2,370 in fp32). Said in one line; --precision overrides."""
    from ..launch.device import has_gpu

    given = getattr(args, "precision", None) is not None
    if args.config and not given:
        given = "precision" in (read_yaml(args.config, "--config") or {})
    if given or has_gpu() or job.precision.mode == "fp32":
        return job
    print(
        f"toolkit {args.command}: no GPU here: precision fp32 (this CPU's bf16 autocast runs 20-30x slower); "
        f"--precision {job.precision.mode or 'amp-bf16'} to run that mode anyway",
    )
    return job.replace(precision=dataclasses.replace(job.precision, mode="fp32"))


def training_job(args, catalog) -> Job:
    """The job of a command that runs or measures a training step: a serving job is refused in one line."""
    job = job_from_args(args, catalog)
    if job.workload == "inference":
        raise SpecError(
            "workload",
            "inference",
            f"`toolkit {args.command}` works on a training step; a serving job is estimated (`toolkit estimate`), "
            "planned (`toolkit plan`) and run (`toolkit generate`)",
        )
    return job
