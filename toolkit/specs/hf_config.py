"""Build a ModelSpec from a Hugging Face `config.json` on disk (no hub access).

Understands the keys of Llama, Mistral, Qwen2, GPT-2 and GPT-NeoX configs, and the Mixtures of Experts of
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3 (with their latent attention) and gpt-oss.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecError
from .model import ModelSpec
from .yamlio import read_json

__all__ = ["model_from_hf_config", "HF_MODEL_TYPES"]

_LLAMA_LIKE = {"llama", "mistral", "qwen2"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss"}
HF_MODEL_TYPES = (*sorted(_LLAMA_LIKE | _MOE), "gpt2", "gpt_neox")


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
    if kind in _LLAMA_LIKE | _MOE:
        return ModelSpec(name=name, **_decoder_fields(cfg, kind, where, seq_len))
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


def _decoder_fields(cfg: dict, kind: str, where: str, seq_len: int | None) -> dict:
    """A Llama-style decoder (RMSNorm, SwiGLU, rotary positions), with its Mixture of Experts where it has one."""
    hidden = _get(cfg, "hidden_size", where)
    heads = _get(cfg, "num_attention_heads", where)
    head_dim = cfg.get("head_dim")
    fields = dict(
        layers=_get(cfg, "num_hidden_layers", where),
        hidden=hidden,
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim if head_dim not in (None, hidden // heads) else None,
        ffn=_get(cfg, "intermediate_size", where),
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        bias=_bias(cfg, kind),
        vocab=_get(cfg, "vocab_size", where),
        seq_len=seq_len or cfg.get("max_position_embeddings", 4096),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6 if kind not in ("olmoe", "gpt_oss") else 1e-5)),
    )
    if kind == "qwen3_moe":
        fields["qk_norm"] = "head"
    if kind == "olmoe":
        fields["qk_norm"] = "full"
    if kind == "gpt_oss":
        fields["attention_sinks"] = True
    if kind in ("deepseek_v2", "deepseek_v3"):
        fields.update(
            attention_kind="mla",
            kv_heads=None,
            head_dim=_get(cfg, "qk_nope_head_dim", where),
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_get(cfg, "kv_lora_rank", where),
            rope_head_dim=_get(cfg, "qk_rope_head_dim", where),
            v_head_dim=_get(cfg, "v_head_dim", where),
        )
    if kind in _MOE:
        fields.update(_moe_fields(cfg, kind, where))
    fields.update(_sliding_window(cfg))
    return fields


def _sliding_window(cfg: dict) -> dict:
    """The window and how many layers take it: `layer_types` where the config lists them (gpt-oss), else every layer
    where a window is set and in use (Mistral 7B v0.1; Qwen2's configs carry one with use_sliding_window false)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if types:
        return {"sliding_window": int(window), "sliding_layers": sum(t == "sliding_attention" for t in types)}
    return {"sliding_window": int(window)}


def _bias(cfg: dict, kind: str) -> str:
    if kind == "qwen2" or (kind == "qwen2_moe" and cfg.get("qkv_bias", True)):
        return "qkv"
    return "all" if cfg.get("attention_bias") else "none"


def _moe_fields(cfg: dict, kind: str, where: str) -> dict:
    """The Mixture-of-Experts fields of a Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 or gpt-oss config."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not experts:
        raise SpecError(
            "hf_config",
            where,
            f"a {kind} config needs its number of experts (num_local_experts, num_experts or n_routed_experts)",
        )
    fields = {"experts": experts, "experts_per_token": _get(cfg, "num_experts_per_tok", where)}
    coefficient = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha"))
    if kind == "deepseek_v3":  # (its sequence-wise loss is DeepSeek-V3's "extremely small" complement)
        coefficient = cfg.get("aux_loss_alpha", 0.0)
    if coefficient is not None:
        fields["balance_loss"] = float(coefficient)
    if kind in ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"):
        fields["expert_ffn"] = _get(cfg, "moe_intermediate_size", where)
    if kind == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        fields.update(
            shared_experts=1, shared_expert_ffn=cfg["shared_expert_intermediate_size"], shared_expert_gate=True
        )
    if kind in ("qwen2_moe", "qwen3_moe") and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise SpecError(
            "hf_config",
            where,
            "dense layers between the sparse ones (mlp_only_layers, decoder_sparse_step > 1) are not modelled",
        )
    if kind in ("deepseek_v2", "deepseek_v3"):
        fields.update(
            shared_experts=cfg.get("n_shared_experts") or 0,
            dense_layers=cfg.get("first_k_dense_replace", 0),
            router="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
        )
        if cfg.get("moe_layer_freq", 1) != 1:
            raise SpecError("hf_config", where, "moe_layer_freq other than 1 is not modelled")
    if kind == "gpt_oss":
        fields.update(router_bias=True, expert_bias=True)
    return fields
