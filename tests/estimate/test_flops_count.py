"""The exact FLOP count against torch's FlopCounterMode on the runner's GPT (eager attention)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from toolkit.estimate.flops import flops_per_token
from toolkit.program.model import GPT
from toolkit.specs import Job

LLAMA = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "vocab": 100,
    "seq_len": 32,
    "ffn": 160,
    "mlp": "swiglu",
    "norm": "rmsnorm",
    "position": "rope",
    "bias": "none",
    "tie_embeddings": False,
}
GPT2 = {"layers": 3, "hidden": 48, "heads": 6, "vocab": 90, "seq_len": 24, "max_positions": 24}
GPT2_DROPOUT = {**GPT2, "dropout": 0.1}  # its masks are saved: recompute cannot stop before the down projection


def counted(job: Job, batch: int = 3) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs that FlopCounterMode sees in a real step. One counter must
    span the whole step: checkpoint's recomputation is only seen by a mode that was active in forward."""
    model = GPT(job.model, attention="eager", recompute=job.memory.recompute)
    tokens = torch.randint(0, job.model.vocab, (batch, job.model.seq_len))
    with FlopCounterMode(display=False) as forward:
        model(tokens, tokens)
    with FlopCounterMode(display=False) as step:
        model(tokens, tokens).backward()
    return forward.get_total_flops(), step.get_total_flops()


@pytest.mark.parametrize("model", [LLAMA, GPT2, GPT2_DROPOUT], ids=["llama", "gpt2", "gpt2-dropout"])
@pytest.mark.parametrize("recompute", ["none", "selective", "selective-op", "full"])
def test_matches_flop_counter(model, recompute):
    job = Job.from_dict({"model": model, "memory": {"recompute": recompute, "attention": "eager"}}).resolve()[0]
    tokens = 3 * job.model.seq_len
    per_token = flops_per_token(job, causal=False)  # eager multiplies the whole score matrix
    forward, step = counted(job)
    assert forward == pytest.approx(per_token.forward * tokens, rel=0.01)
    # backward = 2 x forward, plus the recomputed forward work
    assert step == pytest.approx(per_token.hardware * tokens, rel=0.01)


def test_causal_convention_halves_attention_only():
    job = Job.from_dict({"model": LLAMA}).resolve()[0]
    causal, full = flops_per_token(job, causal=True), flops_per_token(job, causal=False)
    assert full.attention == 2 * causal.attention
    assert full.layer_matmuls == causal.layer_matmuls and full.head == causal.head


def test_close_to_six_n_plus_attention_for_gpt3(catalog):
    """The exact count and 6·N + causal attention agree for GPT-3 175B (N's embeddings ≈ the tied head)."""
    job = Job.from_dict({"model": {"preset": "gpt3-175b"}}, catalog).resolve(catalog)[0]
    exact = flops_per_token(job).model
    six_n = 6 * 174_604_259_328 + 6 * 96 * 2048 * 12288
    assert exact == pytest.approx(six_n, rel=0.002)


MOE = {
    **LLAMA,
    "experts": 8,
    "experts_per_token": 2,
    "expert_ffn": 48,
    "shared_experts": 1,
    "shared_expert_ffn": 40,
    "dense_layers": 1,
    "layers": 3,
}


@pytest.mark.parametrize("modules", [["moe"], ["shared_experts"], ["mlp"]])
def test_recompute_modules_rerun_what_the_module_forward_counts(modules):
    """Megatron's --recompute-modules reruns the listed modules' forward: the FLOPs priced for them equal what
    FlopCounterMode counts for those modules of the runner's GPT, run once forward."""
    from toolkit.estimate.flops import module_recompute_flops
    from toolkit.program.moe import MoE

    job = Job.from_dict({"model": MOE, "memory": {"recompute": "selective", "recompute_modules": modules}}).resolve()[0]
    model = GPT(job.model, attention="eager")
    tokens = 3 * job.model.seq_len
    x = torch.randn(3, job.model.seq_len, job.model.hidden)
    with FlopCounterMode(display=False) as counter:
        for block in model.blocks:
            mlp = block.mlp
            if "moe" in modules and isinstance(mlp, MoE):
                mlp(x)
            elif "shared_experts" in modules and isinstance(mlp, MoE):
                mlp.shared(x)
            elif "mlp" in modules and not isinstance(mlp, MoE):
                mlp(x)
    dense, experts = module_recompute_flops(job)
    assert (dense + experts) * tokens == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_lora_counts_no_weight_gradient_for_frozen_weights():
    """A LoRA step runs each frozen projection's input gradient only: the model FLOPs MFU divides by equal what
    FlopCounterMode counts in a real step of the runner's GPT with adapters (the rank-2 adapters' own products,
    about 1 % here, left out; and the first block's q, k, v input gradients, which autograd skips as nothing before
    them trains: 1/layers of those products), so MFU never reads above the matmul efficiency."""
    from toolkit.program.lora import apply_lora

    spec = {**LLAMA, "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 640}
    job = Job.from_dict(
        {"model": spec, "memory": {"attention": "eager"}, "finetune": {"method": "lora", "rank": 2}}
    ).resolve()[0]
    model = GPT(job.model, attention="eager")
    for p in model.parameters():
        p.requires_grad_(False)
    apply_lora(model, rank=2, alpha=4.0, targets=("q", "k", "v", "o"))
    tokens = torch.randint(0, job.model.vocab, (3, job.model.seq_len))
    with FlopCounterMode(display=False) as step:
        model(tokens, tokens).backward()
    per_token = flops_per_token(job, causal=False)
    assert step.get_total_flops() == pytest.approx(per_token.model * 3 * job.model.seq_len, rel=0.03)
