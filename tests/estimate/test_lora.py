"""LoRA fine-tuning: frozen base, trainable adapters; states, activations and peak against the trace."""

import itertools

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.estimate.states import adapter_params_per_layer
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory

TINY_GPT = {"layers": 3, "hidden": 48, "heads": 6, "vocab": 101, "seq_len": 20, "max_positions": 32, "ffn": 100}
TINY_LLAMA = dict(TINY_GPT, mlp="swiglu", norm="rmsnorm", position="rope", bias="none", kv_heads=2)


def job(model, targets, mode="amp-bf16", att="flash", b=3, accum=1, rank=4):
    return Job.from_dict(
        {
            "model": model,
            "batch": {"micro_batch": b, "global_batch": b * accum},
            "precision": {"mode": mode},
            "memory": {"program": "cpu", "attention": att},
            "finetune": {"method": "lora", "rank": rank, "targets": targets},
        }
    ).resolve()[0]


TARGETS = (("q", "v"), ("o", "down"), ("up", "down"), ("q", "k", "v", "o", "up", "down"))
# A covering slice of block style x mode x targets x kernel (48 cases): every target set on both block styles,
# every mode with two target sets, both kernels on each (block style, mode).
CASES = [
    (arch, mode, TARGETS[(2 * i + k) % 4], ("flash", "eager")[(i + k) % 2])
    for i, (arch, mode) in enumerate(itertools.product(("gpt", "llama"), ("fp32", "amp-bf16", "pure-bf16")))
    for k in (0, 1)
]


@pytest.mark.parametrize("arch, mode, targets, att", CASES, ids=["/".join(map(str, c)) for c in CASES])
def test_lora_activations_match_trace_to_the_byte(arch, mode, targets, att):
    model = TINY_GPT if arch == "gpt" else TINY_LLAMA
    j = job(model, list(targets), mode=mode, att=att)
    assert float(memory_estimate(j).activations_bytes) == trace_memory(j).activations_bytes


@pytest.mark.parametrize(
    "arch, method, mode, rec, dropout, att",
    [
        ("gpt", "lora", "amp-bf16", "full", 0.0, "flash"),
        ("llama", "lora", "pure-bf16", "none", 0.1, "eager"),
        ("gpt", "lora", "amp-bf16", "none", 0.1, "flash"),
        ("llama", "qlora", "mixed-bf16", "full", 0.1, "flash"),
        ("gpt", "lora", "fp32", "selective", 0.1, "eager"),
        ("llama", "qlora", "amp-bf16", "selective", 0.0, "eager"),
    ],
)
def test_lora_with_recompute_and_dropout_match_the_trace(arch, method, mode, rec, dropout, att):
    """Full recompute keeps each block's input, selective the attention core's inputs; dropout keeps a mask
    only where its input needs a gradient."""
    model = (
        {"preset": "gpt2", "layers": 2, "hidden": 384, "heads": 6, "seq_len": 128, "max_positions": 128}
        if arch == "gpt"
        else {"preset": "llama2-7b", "layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 1536, "seq_len": 128}
    )
    j = Job.from_dict(
        {
            "model": dict(model, vocab=8000, dropout=dropout),
            "batch": {"micro_batch": 2},
            "precision": {"mode": mode},
            "memory": {"program": "cpu", "attention": att, "recompute": rec},
            "finetune": {"method": method, "rank": 8, "targets": ["q", "v", "down"]},
        }
    ).resolve()[0]
    traced, est = trace_memory(j), memory_estimate(j)
    assert float(est.activations_bytes) == traced.activations_bytes
    assert float(est.peak_bytes) == pytest.approx(traced.peak_bytes, rel=0.03)


def test_lora_states_and_peak():
    small = {
        "preset": "llama2-7b",
        "layers": 3,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "ffn": 688,
        "seq_len": 256,
        "vocab": 1000,
    }
    j = job(small, ["q", "k", "v", "o", "up", "gate", "down"], b=2, rank=8)
    traced, model = trace_memory(j), memory_estimate(j)
    adapters = 3 * adapter_params_per_layer(j)
    assert adapters == 3 * 8 * (2 * (256 + 256) + 2 * (256 + 128) + 3 * (256 + 688))  # r·(in + out): q,o; k,v; MLP
    assert model.grads_bytes == traced.grads_bytes == adapters * 4  # fp32 grads, adapters only
    assert float(model.optimizer_bytes) == pytest.approx(traced.optimizer_bytes, rel=1e-3)
    assert float(model.peak_bytes) == pytest.approx(traced.peak_bytes, rel=0.03)


def test_article_case_lora_on_a_24gb_card(catalog):
    """The seed article's 'fine-tune on 2-4 RTX 4090': Llama-2-7B in bf16 with LoRA fits one 24 GiB card
    at a short sequence; full fine-tuning does not come close."""
    base = {
        "model": {"preset": "llama2-7b", "seq_len": 512},
        "precision": {"mode": "pure-bf16"},
        "batch": {"micro_batch": 1, "global_batch": 1},
        "cluster": {"accelerator": "RTX-4090", "count": 1},
    }
    lora = Job.from_dict({**base, "finetune": {"method": "lora", "rank": 16, "targets": ["q", "v"]}}, catalog)
    full = Job.from_dict(base, catalog)
    from toolkit.estimate import estimate

    assert estimate(lora, catalog)["memory"]["fits"] is True
    assert estimate(full, catalog)["memory"]["fits"] is False


@pytest.mark.parametrize(
    "change, field",
    [
        ({"finetune": {"method": "lora", "targets": ["gate"]}}, "finetune.targets"),
        ({"finetune": {"method": "lora", "targets": []}}, "finetune.targets"),
    ],
)
def test_unmodelled_or_impossible_lora_is_refused(change, field):
    data = {"model": TINY_GPT, "finetune": {"method": "lora"}, **change}
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        Job.from_dict(data).resolve()
