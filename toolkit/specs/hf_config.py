"""Build a ModelSpec from a Hugging Face `config.json` on disk (no hub access).

Named model types (HF_MODEL_TYPES) are read with what their transformers code builds from the keys:
Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4 (phi3), Gemma 3, GPT-2 and GPT-NeoX; the Mixtures of Experts of Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3 (latent attention), Kimi-K2, GLM-4.5/4.6/4.7 (glm4_moe), MiniMax-M2,
Llama 4 and gpt-oss. A multimodal config (Gemma 3, Llama 4, Kimi-K2.5, Qwen3-VL, Qwen3.5) is read from its
`text_config`: the language model is priced, the vision tower is not. Multi-token-prediction layers
(num_nextn_predict_layers, mtp_*) are not part of the main model and are left out, as the published totals leave
them out.

Any other model_type is read as a Llama-style decoder (RMSNorm, gated SiLU MLP, rotary positions) from the standard
keys (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
vocab_size, max_position_embeddings, tie_word_embeddings) with DeepSeek-style expert and latent-attention keys
where it has them; what a config says that this cannot price is refused in one line naming the key.

Refused everywhere, because the estimator cannot price it: linear-attention or state-space layers (`layer_types`
other than full/sliding/chunked attention: Qwen3.5, Qwen3-Next), DeepSeek Sparse Attention's indexer (`index_topk`:
GLM-5, DeepSeek-V3.2) and encoder-decoders.

Approximations that keep the parameter count exact: dense layers interleaved with the expert layers (Llama 4
Maverick's interleave_moe_layer_step, Qwen's mlp_only_layers / decoder_sparse_step, DeepSeek's moe_layer_freq) are
priced as ModelSpec.dense_layers, which the pipeline split puts first; Llama 4's chunked attention is priced as
full attention (the same up to its 8192-token chunk). One that does not: Gemma 3's pre- and post-feedforward
norms, two weights of `hidden` per block beyond ModelSpec's two norms (0.003 % of Gemma 3 27B), are not counted.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecError
from .model import ModelSpec
from .yamlio import read_json

__all__ = ["model_from_hf_config", "HF_MODEL_TYPES"]

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "phi3"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss"}
_FRONTIER_MOE = {"kimi_k2", "glm4_moe", "minimax_m2", "llama4_text"}
_GEMMA = {"gemma3_text"}
_DEEPSEEK_LIKE = {"deepseek_v2", "deepseek_v3", "kimi_k2"}
_WRAPPERS = {"gemma3", "llama4", "kimi_k25"}  # (multimodal: read from their text_config)
_ALIASES = {"qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe"}  # (Qwen3-VL's language models)
# (the first ten keep their order: what an unsupported config is told starts as it always did)
HF_MODEL_TYPES = (*sorted(_LLAMA_LIKE - {"qwen3", "phi3"} | _MOE), "gpt2", "gpt_neox")
HF_MODEL_TYPES += tuple(sorted({"qwen3", "phi3"} | _FRONTIER_MOE | _GEMMA | _WRAPPERS))

_STANDARD_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_ATTENTION_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}
_GEMMA3_DEFAULTS = {  # transformers' Gemma3TextConfig defaults, which Google's configs lean on
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "sliding_window": 4096,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


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
    where = str(path)
    name = cfg.get("_name_or_path") or path.parent.name or cfg.get("model_type")
    cfg = _language_model(cfg, where)
    kind = _ALIASES.get(cfg.get("model_type"), cfg.get("model_type"))
    if kind == "gpt2":
        return _gpt2(cfg, name, where, seq_len)
    if kind == "gpt_neox":
        return _gpt_neox(cfg, name, where, seq_len)
    _refuse_unpriceable(cfg, kind, where)
    if kind in _WRAPPERS:
        raise SpecError("hf_config", where, f"a {kind} config needs its `text_config` (the language model)")
    if kind not in HF_MODEL_TYPES:
        if not all(k in cfg for k in _STANDARD_KEYS):
            missing = next(k for k in _STANDARD_KEYS if k not in cfg)
            raise SpecError(
                "hf_config",
                where,
                f"model_type {kind!r} is not supported; supported: {', '.join(HF_MODEL_TYPES)}, and any "
                f"decoder-only config with the keys {', '.join(_STANDARD_KEYS)} (this one has no `{missing}`)",
            )
        _refuse_unknown(cfg, kind, where)
    if kind in _GEMMA:
        cfg = {**_GEMMA3_DEFAULTS, **cfg}
    return ModelSpec(name=name, **_decoder_fields(cfg, kind, where, seq_len))


def _language_model(cfg: dict, where: str) -> dict:
    """A multimodal config's language model: its `text_config`, which takes the outer tie_word_embeddings (Qwen3.5
    keeps it there) when it has none of its own."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, dict):
        raise SpecError("hf_config", where, "`text_config` must be a JSON object")
    if "model_type" not in text:
        text = {**text, "model_type": {"gemma3": "gemma3_text", "llama4": "llama4_text"}.get(cfg.get("model_type"))}
    if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in text:
        text = {**text, "tie_word_embeddings": cfg["tie_word_embeddings"]}
    return text


def _refuse_unpriceable(cfg: dict, kind: str, where: str) -> None:
    """Refuse in one line what the estimator cannot price, naming the key that says so."""
    if cfg.get("is_encoder_decoder"):
        raise SpecError(
            "hf_config", where, f"`is_encoder_decoder` is true ({kind}): only decoder-only models are priced"
        )
    types = cfg.get("layer_types") or []
    others = sorted({t for t in types if t not in _ATTENTION_LAYERS})
    if others:
        counts = ", ".join(f"{sum(t == o for t in types)} {o!r}" for o in others)
        raise SpecError(
            "hf_config",
            where,
            f"`layer_types` has {counts} layers ({kind}): only softmax attention layers (full, sliding or chunked) "
            "are priced; linear-attention and state-space layers have other weights and costs",
        )
    if "index_topk" in cfg or "index_n_heads" in cfg:
        raise SpecError(
            "hf_config",
            where,
            f"`index_topk` = {cfg.get('index_topk')} ({kind}): DeepSeek Sparse Attention's indexer (index_n_heads = "
            f"{cfg.get('index_n_heads')}, index_head_dim = {cfg.get('index_head_dim')}) and its top-k attention are "
            "not priced",
        )
    mamba = [k for k in ("hybrid_override_pattern", "mamba_d_state", "ssm_state_size", "mamba_num_heads") if k in cfg]
    if mamba:
        raise SpecError("hf_config", where, f"`{mamba[0]}` ({kind}): state-space (Mamba) layers are not priced")


def _refuse_unknown(cfg: dict, kind: str, where: str) -> None:
    """What an unlisted model_type's standard keys leave open and the Llama-style reading would misprice."""
    act = cfg.get("hidden_act", cfg.get("hidden_activation"))
    if act not in ("silu", "swish"):
        raise SpecError(
            "hf_config",
            where,
            f"`hidden_act` = {act!r} in a {kind} config: an unlisted model_type is read as a gated-SiLU (SwiGLU) "
            "decoder, and this one's MLP may be a plain or a gated GELU",
        )
    if "rms_norm_eps" not in cfg:
        raise SpecError(
            "hf_config",
            where,
            f"a {kind} config without `rms_norm_eps`: an unlisted model_type is read as an RMSNorm decoder, and this "
            "one's norm (with or without a bias) is unknown",
        )
    if cfg.get("position_embedding_type", "rope") not in ("rope", "rotary"):
        raise SpecError(
            "hf_config", where, f"`position_embedding_type` = {cfg['position_embedding_type']!r}: not priced here"
        )
    if bool(cfg.get("attention_bias")) != bool(cfg.get("mlp_bias")):
        key = "attention_bias" if cfg.get("attention_bias") else "mlp_bias"
        raise SpecError(
            "hf_config",
            where,
            f"`{key}` alone in a {kind} config: which projections carry biases is model-specific (ModelSpec.bias: "
            "all, q/k/v only, or none)",
        )
    for key in ("use_qk_norm", "qk_layernorm", "qk_norm"):
        if cfg.get(key):
            raise SpecError(
                "hf_config", where, f"`{key}` in a {kind} config: the q/k norms' shape (per head or whole) is unknown"
            )
    if cfg.get("shared_expert_intermediate_size") and not cfg.get("n_shared_experts"):
        raise SpecError(
            "hf_config",
            where,
            f"`shared_expert_intermediate_size` in a {kind} config: whether a gate scales the shared expert "
            "(as in Qwen2-MoE) is model-specific",
        )


def _gpt2(cfg: dict, name: str, where: str, seq_len: int | None) -> ModelSpec:
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


def _gpt_neox(cfg: dict, name: str, where: str, seq_len: int | None) -> ModelSpec:
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


def _tied(cfg: dict, kind: str) -> bool:
    """Whether the output head is the embedding. An absent key means the config class's default: False for the
    Llama-style classes named here, True for Gemma and for an unlisted model_type (transformers' PretrainedConfig
    default, which save_pretrained leaves out)."""
    if "tie_word_embeddings" in cfg:
        return bool(cfg["tie_word_embeddings"])
    return kind in _GEMMA or kind not in HF_MODEL_TYPES


def _decoder_fields(cfg: dict, kind: str, where: str, seq_len: int | None) -> dict:
    """A Llama-style decoder (RMSNorm, gated MLP, rotary positions), with its Mixture of Experts where it has one."""
    hidden = _get(cfg, "hidden_size", where)
    heads = _get(cfg, "num_attention_heads", where)
    head_dim = cfg.get("head_dim")
    rope = cfg.get("rope_parameters") or {}
    fields = dict(
        layers=_get(cfg, "num_hidden_layers", where),
        hidden=hidden,
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim if head_dim not in (None, hidden // heads) else None,
        ffn=_get(cfg, "intermediate_size", where),
        mlp="swiglu",  # (Gemma's GELU-tanh-gated MLP has the same three matrices)
        norm="rmsnorm",
        position="rope",
        bias=_bias(cfg, kind),
        vocab=_get(cfg, "vocab_size", where),
        seq_len=seq_len or cfg.get("max_position_embeddings", 4096),
        tie_embeddings=_tied(cfg, kind),
        dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        rope_theta=float(cfg.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else 0) or 1e4),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6 if kind not in ("olmoe", "gpt_oss") else 1e-5)),
    )
    fields.update(_qk_norm(cfg, kind))
    if kind == "gpt_oss":
        fields["attention_sinks"] = True
    if kind in _DEEPSEEK_LIKE or ("kv_lora_rank" in cfg and kind not in HF_MODEL_TYPES):
        fields.update(
            attention_kind="mla",
            kv_heads=None,
            head_dim=_get(cfg, "qk_nope_head_dim", where),
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_get(cfg, "kv_lora_rank", where),
            rope_head_dim=_get(cfg, "qk_rope_head_dim", where),
            v_head_dim=_get(cfg, "v_head_dim", where),
        )
    if _experts(cfg):
        fields.update(_moe_fields(cfg, kind, where, fields["layers"]))
    elif kind in _MOE | _FRONTIER_MOE:
        _experts(cfg, kind, where)  # (refuses: a Mixture-of-Experts type without its experts)
    fields.update(_sliding_window(cfg, kind, fields["layers"]))
    return fields


def _qk_norm(cfg: dict, kind: str) -> dict:
    """RMSNorm on queries and keys: per head (Qwen3, Gemma 3, GLM-4.5 with use_qk_norm), over the whole projection
    (OLMoE, MiniMax-M2's per_layer). Llama 4's use_qk_norm is a weightless L2 norm: nothing to count."""
    if kind in ("qwen3", "qwen3_moe") or kind in _GEMMA or (kind == "glm4_moe" and cfg.get("use_qk_norm")):
        return {"qk_norm": "head"}
    if kind == "olmoe":
        return {"qk_norm": "full"}
    if kind == "minimax_m2" and cfg.get("use_qk_norm", True):
        return {"qk_norm": "full" if cfg.get("qk_norm_type", "per_layer") == "per_layer" else "head"}
    return {}


def _sliding_window(cfg: dict, kind: str, layers: int) -> dict:
    """The window and how many layers take it: `layer_types` where the config lists them (gpt-oss, newer Gemma 3),
    Gemma 3's sliding_window_pattern (every sixth layer global), else every layer where a window is set and in use
    (Mistral 7B v0.1; Qwen2's configs carry one with use_sliding_window false)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if types:
        return {"sliding_window": int(window), "sliding_layers": sum(t == "sliding_attention" for t in types)}
    if kind in _GEMMA:
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return {"sliding_window": int(window), "sliding_layers": sum(bool((i + 1) % pattern) for i in range(layers))}
    return {"sliding_window": int(window)}


def _bias(cfg: dict, kind: str) -> str:
    if kind == "qwen2" or (kind == "qwen2_moe" and cfg.get("qkv_bias", True)):
        return "qkv"
    if kind == "glm4_moe":  # (GLM's attention_bias is on q, k and v; o_proj has none)
        return "qkv" if cfg.get("attention_bias") else "none"
    return "all" if cfg.get("attention_bias") else "none"


def _experts(cfg: dict, kind: str | None = None, where: str = "") -> int:
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if kind is not None and not experts:
        raise SpecError(
            "hf_config",
            where,
            f"a {kind} config needs its number of experts (num_local_experts, num_experts or n_routed_experts)",
        )
    return experts


def _dense_layers(cfg: dict, kind: str, layers: int) -> int:
    """How many blocks keep a dense MLP. ModelSpec has them first (DeepSeek's first_k_dense_replace); a model that
    interleaves them (Llama 4 Maverick, Qwen's mlp_only_layers or decoder_sparse_step, DeepSeek's moe_layer_freq) has
    the same parameters, the count being what the totals need."""
    if kind == "llama4_text":
        step = int(cfg.get("interleave_moe_layer_step", 1) or 1)
        moe = cfg.get("moe_layers")
        moe = set(moe) if moe is not None else set(range(step - 1, layers, step))
        return layers - len(moe & set(range(layers)))
    first = int(cfg.get("first_k_dense_replace", 0) or 0)
    freq = int(cfg.get("moe_layer_freq", 1) or 1)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    sparse = [i for i in range(layers) if i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only]
    return layers - len(sparse)


def _moe_fields(cfg: dict, kind: str, where: str, layers: int) -> dict:
    """The Mixture-of-Experts fields: Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 and Kimi-K2, GLM-4.5, MiniMax-M2,
    Llama 4, gpt-oss, or an unlisted type's DeepSeek-style keys."""
    fields = {"experts": _experts(cfg, kind, where), "experts_per_token": _get(cfg, "num_experts_per_tok", where)}
    coefficient = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha"))
    loss_free = kind in ("deepseek_v3", "kimi_k2", "glm4_moe", "minimax_m2") or cfg.get("topk_method") == "noaux_tc"
    if loss_free:  # (its sequence-wise loss is DeepSeek-V3's "extremely small" complement)
        coefficient = cfg.get("aux_loss_alpha", cfg.get("router_aux_loss_coef", 0.0))
        fields["router"] = "sigmoid"
    elif cfg.get("scoring_func") == "sigmoid":
        fields["router"] = "sigmoid"
    if coefficient is not None:
        fields["balance_loss"] = float(coefficient)
    if cfg.get("n_group") and cfg.get("topk_group") and cfg["topk_group"] < cfg["n_group"]:
        # node-limited routing: a token's experts in at most topk_group of n_group groups, one group a node as
        # DeepSeek-V3 trains them (§2.1.2: "at most 4 nodes")
        fields["max_nodes_per_token"] = int(cfg["topk_group"])
    if "moe_intermediate_size" in cfg:
        fields["expert_ffn"] = cfg["moe_intermediate_size"]
    elif kind in ("qwen2_moe", "qwen3_moe") or kind in _DEEPSEEK_LIKE or kind == "glm4_moe":
        fields["expert_ffn"] = _get(cfg, "moe_intermediate_size", where)
    if kind == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        fields.update(
            shared_experts=1, shared_expert_ffn=cfg["shared_expert_intermediate_size"], shared_expert_gate=True
        )
    elif cfg.get("n_shared_experts"):
        fields["shared_experts"] = int(cfg["n_shared_experts"])
    if kind == "llama4_text":  # one shared expert as wide as a routed one; dense layers of intermediate_size_mlp
        fields.update(
            shared_experts=1,
            expert_ffn=_get(cfg, "intermediate_size", where),
            ffn=cfg.get("intermediate_size_mlp") or cfg["intermediate_size"],
        )
    if kind == "minimax_m2" and cfg.get("shared_intermediate_size"):
        raise SpecError("hf_config", where, "`shared_intermediate_size` > 0: MiniMax's shared expert is not modelled")
    dense = _dense_layers(cfg, kind, layers)
    if dense:
        fields["dense_layers"] = dense
    if kind == "gpt_oss":
        fields.update(router_bias=True, expert_bias=True)
    return fields
