"""Pruning, int8 activations, recompute, LoRA: each changes what it should and nothing else."""

import contextlib

import pytest
import torch

from toolkit.program.model import GPT
from toolkit.program.techniques import Int8Activations, Pruner
from toolkit.specs import Job, ModelSpec


def _block_weights(state):
    return {k: v for k, v in state.items() if k.startswith("blocks.") and v.dim() == 2}


def test_magnitude_pruning_holds_the_exact_global_sparsity_through_training(train):
    records, state = train(training={"steps": 4, "pruning": {"method": "magnitude", "sparsity": 0.6}})
    weights = _block_weights(state["model"])
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    total = sum(w.numel() for w in weights.values())
    assert zeros == int(0.6 * total)  # masks re-applied after every step
    assert (state["model"]["tok.weight"] == 0).sum() == 0  # embeddings are not pruned
    assert records[-1]["loss"] < records[0]["loss"]


def test_two_four_pruning_keeps_two_of_every_four_after_a_later_start(train):
    records, state = train(training={"steps": 4, "pruning": {"method": "2:4", "at_step": 2}})
    for w in _block_weights(state["model"]).values():
        assert ((w.view(w.shape[0], -1, 4) != 0).sum(-1) <= 2).all()


def test_pruning_changes_nothing_before_at_step(train):
    plain, _ = train("plain", training={"steps": 3})
    late, _ = train("late", training={"steps": 3, "pruning": {"method": "magnitude", "sparsity": 0.5, "at_step": 2}})
    assert [r["loss"] for r in plain[:2]] == [r["loss"] for r in late[:2]]
    assert plain[2]["loss"] != late[2]["loss"]


def test_magnitude_masks_drop_the_smallest_weights():
    w = torch.nn.Parameter(torch.tensor([[0.1, -5.0, 0.2, 3.0], [-0.05, 1.0, 0.3, -0.01]]))
    pruner = Pruner("magnitude", 0.5)
    pruner.compute([("w", w)])
    assert pruner.masks["w"].tolist() == [[False, True, False, True], [False, True, True, False]]


def _grads(compress: bool, dtype=torch.float32):
    torch.manual_seed(0)
    model = GPT(ModelSpec(layers=2, hidden=64, heads=4, vocab=256, seq_len=32), dtype=dtype)
    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(1))
    hooks = Int8Activations(model, min_numel=1024)
    hooks.active = compress
    with hooks if compress else contextlib.nullcontext():
        loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return torch.cat([p.grad.flatten().float() for p in model.parameters()]), hooks


def test_int8_activations_halve_bf16_bytes_and_keep_the_gradient():
    exact, _ = _grads(False, torch.bfloat16)
    approx, hooks = _grads(True, torch.bfloat16)
    assert hooks.packed_bytes <= 0.52 * hooks.original_bytes
    cosine = torch.nn.functional.cosine_similarity(exact, approx, dim=0)
    assert cosine > 0.999 and not torch.equal(exact, approx)


def _recorded_forward(batch: int):
    """One forward of a 1-layer model (vocab 100) under int8 hooks; returns (model, hooks, [(tensor, packed)])."""
    torch.manual_seed(0)
    model = GPT(ModelSpec(layers=1, hidden=64, heads=4, vocab=100, seq_len=16))
    hooks = Int8Activations(model, min_numel=1)
    seen = []
    pack = hooks._pack
    hooks._pack = lambda t: seen.append((t, pack(t))) or seen[-1][1]
    with hooks:
        model(torch.zeros(batch, 16, dtype=torch.long), torch.zeros(batch, 16, dtype=torch.long))
    return model, hooks, seen


def test_int8_leaves_weights_and_the_loss_alone():
    model, _hooks, seen = _recorded_forward(1)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert any(not isinstance(packed, torch.Tensor) for _, packed in seen)
    for t, packed in seen:
        compressed = not isinstance(packed, torch.Tensor)
        assert compressed != (t.untyped_storage().data_ptr() in params or not t.is_floating_point())
        assert t.shape[-1] != 100  # nothing from the vocabulary projection or the loss


@pytest.mark.parametrize("recompute", ["full", "selective", "selective-op"])
def test_recompute_keeps_the_numbers(train, recompute):
    plain, _ = train("plain", training={"steps": 2})
    again, _ = train("re", memory={"recompute": recompute, "attention": "eager"}, training={"steps": 2})
    eager, _ = train("eager", memory={"attention": "eager"}, training={"steps": 2})
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in eager], abs=1e-6)
    assert [r["loss"] for r in eager] == pytest.approx([r["loss"] for r in plain], abs=1e-4)


def test_the_articles_snippet_is_a_valid_job(train):
    job = Job.from_dict(
        {
            "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
            "training": {"gradient_checkpointing": True, "pruning": {"method": "magnitude", "sparsity": 0.6}},
        }
    )
    resolved, _ = job.resolve()
    assert resolved.memory.recompute == "full" and resolved.training.pruning.sparsity == 0.6
    records, _ = train(
        training={"steps": 2, "gradient_checkpointing": True, "pruning": {"method": "magnitude", "sparsity": 0.6}}
    )
    assert len(records) == 2


def test_lora_trains_only_the_adapters(train):
    records, state = train(finetune={"method": "lora", "rank": 4, "targets": ["q", "v"]}, training={"steps": 3})
    model = state["model"]
    torch.manual_seed(state["job"]["training"]["seed"])
    fresh = GPT(ModelSpec(layers=2, hidden=64, heads=4, vocab=256, seq_len=32)).state_dict()
    assert torch.equal(model["blocks.0.mlp.up.weight"], fresh["blocks.0.mlp.up.weight"])  # frozen
    assert torch.equal(
        model["blocks.1.attn.q.base.weight"], fresh["blocks.1.attn.q.weight"]
    )  # frozen under the adapter
    assert not torch.equal(model["blocks.0.attn.q.b"], torch.zeros_like(model["blocks.0.attn.q.b"]))  # B trained
    trained = {k for k in model if k.endswith((".a", ".b"))}
    assert trained == {f"blocks.{i}.attn.{p}.{ab}" for i in range(2) for p in "qv" for ab in "ab"}
    assert len(state["optimizer"]["state"]) == len(trained)


def test_int8_packs_a_tensor_saved_by_several_ops_once():
    """q, k and v each save the norm output (as their own view): one int8 copy, not three."""
    _model, hooks, seen = _recorded_forward(2)
    packed = [r for _t, r in seen if not isinstance(r, torch.Tensor)]
    norm_out = [r for r in packed if tuple(r[3]) == (32, 64)]  # (tokens, hidden) views of the norm output
    assert len(norm_out) >= 3 and len({id(r) for r in norm_out}) < len(norm_out)
    assert hooks.original_bytes == sum(r[4] * 4 for r in {id(r): r for r in packed}.values())
