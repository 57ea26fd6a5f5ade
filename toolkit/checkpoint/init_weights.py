"""Start training from existing weights: a local Hugging Face folder or one of our own runs.

    training: {init_from: path/to/Llama-folder}      # config.json + *.safetensors, no hub access
    training: {init_from: runs/pretrain}             # newest valid checkpoint of a toolkit run

Hugging Face names are mapped onto the runner's GPT (Llama, Mistral, Qwen2: q/k/v/o_proj,
gate/up/down_proj, RMSNorm; GPT-2: its fused Conv1D c_attn split into q, k, v and transposed).
Every tensor must find its place with the right shape, and every weight of the model must be
filled; anything else is refused with the names that do not fit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ..specs.errors import SpecError
from ..specs.hf_names import hf_to_ours
from .files import latest_checkpoint

__all__ = ["load_initial_weights", "hf_state_dict"]

_GPT2_SKIP = re.compile(r"(?:transformer\.)?h\.\d+\.attn\.(?:bias|masked_bias)")  # causal-mask buffers


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecError(
            "training.init_from",
            str(folder),
            "holds no *.safetensors files (only safetensors weights "
            "are read; convert .bin files with transformers first)",
        )
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def hf_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The checkpoint in `folder` renamed (and for GPT-2 split and transposed) to the runner's GPT names."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    kind = config.get("model_type")
    if kind not in ("llama", "mistral", "qwen2", "gpt2"):
        raise SpecError(
            "training.init_from",
            str(folder),
            f"model_type {kind!r}: the runner loads llama, mistral, qwen2 and gpt2 weights",
        )
    scaling = config.get("rope_scaling") or {}
    if kind != "gpt2" and scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise SpecError(
            "training.init_from",
            str(folder),
            f"uses rope_scaling {scaling.get('rope_type')!r}, which the runner's GPT does not implement",
        )
    out, unknown = {}, []
    for name, tensor in _read_safetensors(folder).items():
        if kind == "gpt2" and _GPT2_SKIP.fullmatch(name):
            continue
        if kind == "gpt2" and re.fullmatch(r"(?:transformer\.)?h\.\d+\.attn\.c_attn\.(weight|bias)", name):
            layer = re.search(r"h\.(\d+)\.", name).group(1)
            kind_of = name.rsplit(".", 1)[1]
            parts = tensor.chunk(3, dim=-1)  # Conv1D: (in, 3·out) -> q, k, v
            for letter, part in zip("qkv", parts):
                out[f"blocks.{layer}.attn.{letter}.{kind_of}"] = part.t().contiguous() if kind_of == "weight" else part
            continue
        new = hf_to_ours(kind, name)
        if new is None:
            unknown.append(name)
            continue
        gpt2_conv = kind == "gpt2" and new.endswith("weight") and (".attn.o." in new or ".mlp." in new)
        out[new] = tensor.t().contiguous() if gpt2_conv else tensor
    if unknown:
        raise SpecError(
            "training.init_from",
            str(folder),
            f"has tensors the runner's GPT has no place for: "
            f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}",
        )
    return out


def _checkpoint_weights(folder: Path, checkpoint: dict, own: dict) -> dict[str, torch.Tensor]:
    """The model's weights from a run's checkpoint: in its .pt, or (a run on several ranks) in the step's DCP folder,
    read whole in this process whatever layout wrote it (DCP re-cuts the shards)."""
    if checkpoint.get("model") is not None:
        return checkpoint["model"]
    record = checkpoint.get("dcp")
    if not record:
        raise SpecError("training.init_from", str(folder), "its newest checkpoint holds no model weights")
    import torch.distributed.checkpoint as dcp

    from .sharded import MODEL

    reader = dcp.FileSystemReader(folder / record["dir"])
    saved = set(reader.read_metadata().state_dict_metadata)
    wanted = {MODEL + name: torch.empty_like(tensor) for name, tensor in own.items() if MODEL + name in saved}
    dcp.load(wanted, storage_reader=reader, no_dist=True)
    return {name[len(MODEL) :]: tensor for name, tensor in wanted.items()}


@torch.no_grad()
def load_initial_weights(model: nn.Module, source: str | Path) -> str:
    """Fill `model` (before LoRA or FP32 norms are applied) from `source`; returns what was loaded."""
    source = Path(source)
    if (source / "config.json").exists():
        state, what = hf_state_dict(source), f"Hugging Face weights from {source}"
    elif source.is_dir():
        folder = source / "checkpoints" if (source / "checkpoints").is_dir() else source
        checkpoint, path, _problems = latest_checkpoint(folder)
        if checkpoint is None:
            raise SpecError("training.init_from", str(source), "holds neither config.json nor a valid checkpoint")
        state, what = _checkpoint_weights(folder, checkpoint, model.state_dict()), f"the weights of {path}"
    else:
        raise SpecError("training.init_from", str(source), "no such folder")
    own = model.state_dict()
    if model.spec.tie_embeddings:
        state.setdefault("head.weight", state.get("tok.weight"))
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or extra or wrong:
        detail = "; ".join(
            f"{label}: {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("unexpected", extra), ("shape", wrong))
            if items
        )
        raise SpecError(
            "training.init_from",
            str(source),
            f"does not fit the job's model ({detail}); give the model as `hf_config` of the same folder",
        )
    for name, tensor in own.items():
        tensor.copy_(state[name])
    return what
