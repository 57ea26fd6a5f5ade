"""A training run as a Hugging Face folder, so a fine-tune leaves the toolkit the way its weights came in:

    toolkit export --hf runs/tuned hf/tuned     # model.safetensors, config.json, generation_config.json, tokenizer

`transformers.AutoModelForCausalLM.from_pretrained("hf/tuned")` then generates what `toolkit generate --init-from
runs/tuned` generates. The names are those `--init-from` reads (toolkit/checkpoint/init_weights.py), the other way
round: Llama's q/k/v/o_proj, gate/up/down_proj and RMSNorms (Qwen2 where only q, k and v carry biases), GPT-2's
Conv1D layers (transposed; q, k and v joined into c_attn). The weights come in as numpy arrays by the runner's GPT
names (toolkit.serve.run.run_weights reads the checkpoint), so this module needs no torch. What Llama, Qwen2 and
GPT-2 cannot express (a Mixture of Experts, LayerNorm with rotary positions, GPT-2 without biases, ...) is refused
in one line, before any weight is read.

Which tokenizer goes with a run's weights is decided here too, for the export and for `toolkit generate --prompt`:
the run's data's (index.json), else its --init-from folder's tokenizer.json, else bytes (the demo corpus).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np

from ..specs import Job, SpecError
from ..specs.hf_names import ours_to_hf
from ..specs.model import ModelSpec

__all__ = [
    "RunTokenizer",
    "check_run",
    "hf_family",
    "hf_config",
    "hf_tensors",
    "run_tokenizer",
    "weights_tokenizer",
    "write_hf_folder",
    "HfExport",
]

RUN_JOB = "job.yaml"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
"""What a Hugging Face model folder keeps of its tokenizer; those present are copied."""

_GPT2_QKV = re.compile(r"blocks\.(\d+)\.attn\.([qkv])\.(weight|bias)")
_FAMILIES = "Llama (rmsnorm + swiglu + rope) and GPT-2 (layernorm + gelu + learned positions) models, not this mix"


@dataclasses.dataclass(frozen=True)
class RunTokenizer:
    source: str
    """`bytes`, or what toolkit.train.documents.load_tokenizer read: a tokenizer.json, a folder holding one, or a
    hub name."""
    eos_id: int | None = None
    """The end-of-document id the data was packed with (None: documents simply joined)."""


@dataclasses.dataclass(frozen=True)
class HfExport:
    path: Path
    files: list[str]
    notes: list[str]
    """What the folder lacks and how to add it (a tokenizer not on this machine, ids that are bytes)."""


def check_run(run: str | Path) -> Job:
    """The run's job, once its folder, job.yaml, weights and shape are fit for export (each refusal one line)."""
    folder = Path(run)
    if not folder.is_dir():
        raise SpecError("--hf", str(run), "no such folder; give a `toolkit train --out` folder")
    if not (folder / RUN_JOB).is_file():
        raise SpecError("--hf", str(run), f"holds no {RUN_JOB}: not a `toolkit train --out` folder")
    job = Job.from_yaml(folder / RUN_JOB)
    if job.finetune.method in ("lora", "qlora"):
        raise SpecError(
            "--hf",
            str(run),
            f"holds {job.finetune.method} adapters over frozen weights, which export does not merge yet; "
            "fine-tune with --finetune full to export",
        )
    hf_family(job.model)
    if not list((folder / "checkpoints").glob("step_*.pt")):
        raise SpecError(
            "--hf",
            str(run),
            "holds no checkpoint yet (checkpoints/step_*.pt): let the run finish, or give --checkpoint-every N",
        )
    return job


def hf_family(spec: ModelSpec) -> str:
    """llama, qwen2 or gpt2: the Hugging Face model that computes what the runner's GPT of `spec` computes."""
    for field, value, allowed in (
        ("model.experts", spec.experts, 0),
        ("model.attention_kind", spec.attention_kind, "standard"),
        ("model.qk_norm", spec.qk_norm, "none"),
        ("model.attention_sinks", spec.attention_sinks, False),
        ("model.sliding_window", spec.sliding_window, None),
    ):
        if value != allowed:
            raise SpecError(field, value, "export --hf writes dense Llama, Qwen2 and GPT-2 models; this one it cannot")
    style = (spec.norm, spec.mlp, spec.position)
    if style == ("rmsnorm", "swiglu", "rope"):
        return "qwen2" if spec.bias == "qkv" else "llama"
    if style != ("layernorm", "gelu", "learned"):
        raise SpecError("model", f"{spec.norm} + {spec.mlp} + {spec.position}", f"export --hf writes {_FAMILIES}")
    for field, value, allowed in (
        ("model.bias", spec.bias, "all"),
        ("model.kv_heads", spec.kv_heads_, spec.heads),
        ("model.head_dim", spec.head_dim_, spec.hidden // spec.heads),
    ):
        if value != allowed:
            raise SpecError(field, value, f"GPT-2 needs {allowed} here, the only form its config can say")
    return "gpt2"


def hf_config(spec: ModelSpec, family: str, eos_id: int | None, dtype: str) -> dict:
    """config.json for `family`: the keys toolkit.specs.hf_config reads back into the same ModelSpec."""
    common = {"vocab_size": spec.vocab, "tie_word_embeddings": spec.tie_embeddings, "torch_dtype": dtype}
    common.update(bos_token_id=None, eos_token_id=eos_id)  # (None: not the class's defaults, ids of other tokenizers)
    if family == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_layer": spec.layers,
            "n_embd": spec.hidden,
            "n_head": spec.heads,
            "n_inner": spec.ffn_,
            "n_positions": spec.max_positions_,
            "activation_function": "gelu_new",  # (the runner's GELU is the tanh approximation)
            "layer_norm_epsilon": spec.norm_eps,
            **{key: spec.dropout for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")},
            **common,
        }
    config = {
        "architectures": ["Qwen2ForCausalLM" if family == "qwen2" else "LlamaForCausalLM"],
        "model_type": family,
        "num_hidden_layers": spec.layers,
        "hidden_size": spec.hidden,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads_,
        "head_dim": spec.head_dim_,
        "intermediate_size": spec.ffn_,
        "hidden_act": "silu",
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "attention_dropout": spec.dropout,
        **common,
    }
    if family == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.layers)
    else:
        config.update(attention_bias=spec.bias == "all", mlp_bias=spec.bias == "all")
    return config


def hf_tensors(spec: ModelSpec, family: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The runner's GPT weights under `family`'s names (a tied head is the embedding: written once, as HF does)."""
    out, qkv = {}, {}
    for name, array in weights.items():
        if name == "head.weight" and spec.tie_embeddings:
            continue
        if family == "gpt2" and (match := _GPT2_QKV.fullmatch(name)):
            qkv[(match.group(1), match.group(3), match.group(2))] = array
            continue
        new = ours_to_hf(family, name)
        if new is None:
            raise SpecError("--hf", name, f"a tensor of the run that a {family} model has no place for")
        conv = family == "gpt2" and new.endswith("weight") and (".attn." in new or ".mlp." in new)
        out[new] = array.T if conv else array  # (GPT-2's Conv1D keeps its weight as in × out)
    for layer, kind in sorted({(layer, kind) for layer, kind, _ in qkv}):
        parts = [qkv[(layer, kind, letter)] for letter in "qkv"]
        joined = np.concatenate([p.T for p in parts], axis=1) if kind == "weight" else np.concatenate(parts)
        out[f"transformer.h.{layer}.attn.c_attn.{kind}"] = joined
    return {name: np.ascontiguousarray(array) for name, array in out.items()}


def _hf_eos(folder: Path) -> int | None:
    """A Hugging Face folder's end-of-text id (config.json's eos_token_id; the first of a list)."""
    config = folder / "config.json"
    eos = json.loads(config.read_text()).get("eos_token_id") if config.is_file() else None
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def _data_tokenizer(data: str) -> RunTokenizer | None:
    index = Path(data) / "index.json"
    if not index.is_file():
        return None
    recorded = json.loads(index.read_text())
    return RunTokenizer(recorded.get("tokenizer", "bytes"), recorded.get("eos_id"))


def run_tokenizer(run: str | Path) -> RunTokenizer | None:
    """The tokenizer a run trained with, as toolkit.train chose it: its data's, else its --init-from folder's
    tokenizer.json, else bytes (the demo corpus). None: the run's data folder is gone."""
    job = Job.from_yaml(Path(run) / RUN_JOB)
    if job.training.data:
        return _data_tokenizer(job.training.data)
    source = job.training.init_from
    if source and (Path(source) / "tokenizer.json").is_file():
        return RunTokenizer(str(source), _hf_eos(Path(source)))
    return RunTokenizer("bytes")


def weights_tokenizer(job: Job, given: str | None = None) -> RunTokenizer:
    """The tokenizer text goes through for a job's weights (`toolkit generate --prompt`): `given` (--tokenizer), else
    that of the --init-from run or folder, else that of --data; none of them is refused with the ways to give one."""
    source = job.training.init_from
    if given:
        found = RunTokenizer(given, _hf_eos(Path(given)) if Path(given).is_dir() else None)
    elif source and (Path(source) / RUN_JOB).is_file():
        found = run_tokenizer(source)
    elif source and (Path(source) / "tokenizer.json").is_file():
        found = RunTokenizer(str(source), _hf_eos(Path(source)))
    else:
        found = _data_tokenizer(job.training.data) if job.training.data else None
    if found is None:
        raise SpecError(
            "",
            None,
            "--prompt: no tokenizer for the text: give --tokenizer (a tokenizer.json, a model folder holding one, or bytes), "
            "or --init-from a run or model folder whose tokenizer is known",
        )
    return found


def _copy_tokenizer(tok: RunTokenizer | None, out: Path) -> tuple[list[str], list[str]]:
    """(files copied into `out`, notes): the tokenizer's own files, where they are on this machine."""
    if tok is None:
        return [], ["the run's data folder is gone, so its tokenizer is unknown: add the tokenizer's files by hand"]
    if tok.source == "bytes":
        return [], ["the run's token ids are UTF-8 bytes (ids 0-255): no tokenizer files"]
    source = Path(tok.source)
    if not source.exists():
        return [], [
            f"tokenizer {tok.source!r} is not a file or folder here: add it with "
            f"AutoTokenizer.from_pretrained({tok.source!r}).save_pretrained({str(out)!r})"
        ]
    if source.is_file():  # (a tokenizer.json by any name: transformers looks for this one)
        shutil.copyfile(source, out / "tokenizer.json")
        return ["tokenizer.json"], []
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, out / name)
    return copied, []


def write_hf_folder(run: str | Path, job: Job, weights: dict[str, np.ndarray], out: str | Path) -> HfExport:
    """Write `weights` (the run's, by the runner's GPT names) as a Hugging Face folder at `out`."""
    from safetensors.numpy import save_file

    out = Path(out)
    if out.resolve() == Path(run).resolve() or (out / RUN_JOB).is_file():
        raise SpecError("--out", str(out), "is a run folder; give a new folder for the Hugging Face files")
    family = hf_family(job.model)
    tensors = hf_tensors(job.model, family, weights)
    tok = run_tokenizer(run)
    eos_id = tok.eos_id if tok is not None else None
    dtype = str(next(iter(tensors.values())).dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(job.model, family, eos_id, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    copied, notes = _copy_tokenizer(tok, out)
    files = ["model.safetensors", "config.json", "generation_config.json", *copied]
    return HfExport(out, files, notes)
