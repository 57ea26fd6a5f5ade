"""The runner's GPT names against Hugging Face's, one table a family read both ways: `--init-from` renames a Hugging
Face checkpoint onto the runner's GPT (toolkit.checkpoint.init_weights), `export --hf` renames a run back
(toolkit.export.hf). GPT-2's fused c_attn (q, k and v in one Conv1D) is split and joined by those modules.

    hf_to_ours("llama", "model.layers.3.self_attn.q_proj.weight")   # "blocks.3.attn.q.weight"
    ours_to_hf("gpt2", "blocks.0.mlp.up.weight")                    # "transformer.h.0.mlp.c_fc.weight"
"""

from __future__ import annotations

import re
from functools import cache

__all__ = ["NAMES", "hf_to_ours", "ours_to_hf"]

NAMES = {
    "llama": (
        ("model.embed_tokens.weight", "tok.weight"),
        ("model.norm.weight", "norm.weight"),
        ("lm_head.weight", "head.weight"),
        ("model.layers.{layer}.self_attn.{qkvo}_proj.{part}", "blocks.{layer}.attn.{qkvo}.{part}"),
        ("model.layers.{layer}.mlp.{mlp}_proj.{part}", "blocks.{layer}.mlp.{mlp}.{part}"),
        ("model.layers.{layer}.input_layernorm.weight", "blocks.{layer}.norm1.weight"),
        ("model.layers.{layer}.post_attention_layernorm.weight", "blocks.{layer}.norm2.weight"),
    ),
    "gpt2": (
        ("transformer.wte.weight", "tok.weight"),
        ("transformer.wpe.weight", "pos.weight"),
        ("transformer.ln_f.{part}", "norm.{part}"),
        ("lm_head.weight", "head.weight"),
        ("transformer.h.{layer}.ln_1.{part}", "blocks.{layer}.norm1.{part}"),
        ("transformer.h.{layer}.ln_2.{part}", "blocks.{layer}.norm2.{part}"),
        ("transformer.h.{layer}.attn.c_proj.{part}", "blocks.{layer}.attn.o.{part}"),
        ("transformer.h.{layer}.mlp.c_fc.{part}", "blocks.{layer}.mlp.up.{part}"),
        ("transformer.h.{layer}.mlp.c_proj.{part}", "blocks.{layer}.mlp.down.{part}"),
    ),
}
"""(Hugging Face name, runner's name) by family; Mistral and Qwen2 use Llama's names."""

FIELDS = {"layer": r"\d+", "qkvo": "[qkvo]", "mlp": "gate|up|down", "part": "weight|bias"}


@cache
def _compiled(family: str, to_ours: bool) -> tuple:
    """(pattern, target template) pairs of `family` in one direction."""
    pairs = []
    for hf, ours in NAMES["gpt2" if family == "gpt2" else "llama"]:
        source, target = (hf, ours) if to_ours else (ours, hf)
        pattern = re.escape(source)
        for name, regex in FIELDS.items():
            pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{regex})")
        pairs.append((re.compile(pattern), target))
    return tuple(pairs)


def _rename(family: str, name: str, to_ours: bool) -> str | None:
    for pattern, target in _compiled(family, to_ours):
        if match := pattern.fullmatch(name):
            return target.format(**match.groupdict())
    return None


def hf_to_ours(family: str, name: str) -> str | None:
    """The runner's name of a Hugging Face tensor (GPT-2's may lack the `transformer.` prefix), or None."""
    if family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        name = "transformer." + name
    return _rename(family, name, to_ours=True)


def ours_to_hf(family: str, name: str) -> str | None:
    """The Hugging Face name of one of the runner's tensors, or None."""
    return _rename(family, name, to_ours=False)
