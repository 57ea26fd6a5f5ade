"""Build a ModelSpec from a Hugging Face `config.json` on disk (no hub access).

Understands the keys of Llama, Mistral, Qwen2, GPT-2 and GPT-NeoX configs.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecError
from .model import ModelSpec
from .yamlio import read_json

__all__ = ["model_from_hf_config", "HF_MODEL_TYPES"]

_LLAMA_LIKE = {"llama", "mistral", "qwen2"}
HF_MODEL_TYPES = (*sorted(_LLAMA_LIKE), "gpt2", "gpt_neox")


def _get(cfg: dict, key: str, path: str):
    if key not in cfg:
        raise SpecError("hf_config", path, f"has no `{key}` key, which a {cfg.get('model_type')} config needs")
    return cfg[key]


def model_from_hf_config(path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """Read `config.json` (or the folder holding it). `seq_len` defaults to the context length."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = read_json(path, what="hf_config")
    if not isinstance(cfg, dict):
        raise SpecError("hf_config", str(path), "expected a JSON object")
    kind = cfg.get("model_type")
    if kind not in HF_MODEL_TYPES:
        raise SpecError(
            "hf_config", str(path), f"model_type {kind!r} is not supported; supported: {', '.join(HF_MODEL_TYPES)}"
        )
    where = str(path)
    name = cfg.get("_name_or_path") or path.parent.name or kind
    if kind in _LLAMA_LIKE:
        hidden = _get(cfg, "hidden_size", where)
        heads = _get(cfg, "num_attention_heads", where)
        context = cfg.get("max_position_embeddings", 4096)
        return ModelSpec(
            name=name,
            layers=_get(cfg, "num_hidden_layers", where),
            hidden=hidden,
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") if cfg.get("head_dim") not in (None, hidden // heads) else None,
            ffn=_get(cfg, "intermediate_size", where),
            mlp="swiglu",
            norm="rmsnorm",
            position="rope",
            bias="qkv" if kind == "qwen2" else ("all" if cfg.get("attention_bias") else "none"),
            vocab=_get(cfg, "vocab_size", where),
            seq_len=seq_len or context,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        )
    if kind == "gpt2":
        hidden = _get(cfg, "n_embd", where)
        positions = _get(cfg, "n_positions", where)
        return ModelSpec(
            name=name,
            layers=_get(cfg, "n_layer", where),
            hidden=hidden,
            heads=_get(cfg, "n_head", where),
            ffn=cfg.get("n_inner") or 4 * hidden,
            mlp="gelu",
            norm="layernorm",
            position="learned",
            bias="all",
            vocab=_get(cfg, "vocab_size", where),
            seq_len=seq_len or positions,
            max_positions=positions,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            dropout=float(cfg.get("resid_pdrop", 0.0) or 0.0),
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        )
    # gpt_neox
    return ModelSpec(
        name=name,
        layers=_get(cfg, "num_hidden_layers", where),
        hidden=_get(cfg, "hidden_size", where),
        heads=_get(cfg, "num_attention_heads", where),
        ffn=_get(cfg, "intermediate_size", where),
        mlp="gelu",
        norm="layernorm",
        position="rope",
        bias="all",
        vocab=_get(cfg, "vocab_size", where),
        seq_len=seq_len or cfg.get("max_position_embeddings", 2048),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dropout=float(cfg.get("hidden_dropout", 0.0) or 0.0),
    )
