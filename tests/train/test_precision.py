"""Each precision mode keeps the dtypes it names and changes numerics where it should, and only there."""

import math

import pytest
import torch

from toolkit.program.precision import TORCH_DTYPES, MasterWeights
from toolkit.specs.precision import precision_plan
from toolkit.train.loop import TrainingStopped

# mode -> (weight dtype in the model, dtype of Adam's exp_avg, fp32 master copy kept)
MODES = {
    "fp32": (torch.float32, torch.float32, False),
    "amp-bf16": (torch.float32, torch.float32, False),
    "amp-fp16": (torch.float32, torch.float32, False),
    "mixed-bf16": (torch.bfloat16, torch.float32, True),
    "mixed-fp16": (torch.float16, torch.float32, True),
    "pure-bf16": (torch.bfloat16, torch.bfloat16, False),
}


@pytest.mark.parametrize("mode", MODES)
def test_mode_keeps_its_dtypes_and_trains(train, mode):
    records, state = train(precision={"mode": mode}, training={"steps": 3})
    weight, moment, master = MODES[mode]
    assert state["model"]["blocks.0.attn.q.weight"].dtype == weight
    first_state = next(iter(state["optimizer"]["state"].values()))  # (by parameter name; mixed-*: by index)
    assert first_state["exp_avg"].dtype == moment
    assert (state["master"] is not None) == master
    if master:
        assert state["master"][0].dtype == torch.float32
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]
    assert (records[0]["loss_scale"] is not None) == mode.endswith("fp16")
    # the torch-free plan the estimator reads its byte counts from says what the runner really holds
    plan = precision_plan(mode)
    assert TORCH_DTYPES[plan.weights] == state["model"]["blocks.0.attn.q.weight"].dtype
    assert TORCH_DTYPES[plan.optimizer_states] == first_state["exp_avg"].dtype
    assert plan.master_weights == (state["master"] is not None)
    assert plan.loss_scaling == (records[0]["loss_scale"] is not None)


def test_autocast_changes_the_numbers_fp32_does_not_round(train):
    fp32, _ = train("a", precision={"mode": "fp32"}, training={"steps": 2})
    bf16, _ = train("b", precision={"mode": "amp-bf16"}, training={"steps": 2})
    assert fp32[0]["loss"] != bf16[0]["loss"]
    assert abs(fp32[0]["loss"] - bf16[0]["loss"]) < 0.05


def test_fp16_overflow_skips_the_step_and_halves_the_scale(train):
    records, state = train(precision={"mode": "amp-fp16"}, training={"steps": 10, "loss_scale": 2.0**24})
    skipped = [r for r in records if r["skipped"]]
    assert records[0]["skipped"] and all(r["loss"] is None for r in skipped)  # 2^24 × gradients > 65504
    scales = [r["loss_scale"] for r in records]
    assert all(b == a / 2 for a, b, r in zip(scales, scales[1:], records) if r["skipped"])
    assert not all(r["skipped"] for r in records) and state["scaler"]["scale"] < 2.0**24
    assert records[-1]["step"] == 10 and state["skipped_total"] == len(skipped)


def test_divergence_stops_with_a_diagnosis(train):
    with pytest.raises(TrainingStopped, match=r"diverged .* lower training.lr"):
        train(precision={"mode": "fp32"}, training={"steps": 30, "lr": 1e4, "grad_clip": 0})


def test_master_weights_keep_updates_that_bf16_would_round_away():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    module = torch.nn.Module()
    module.w = w
    master = MasterWeights(module)
    opt = torch.optim.SGD(master.params, lr=1e-4)
    pure = torch.ones(4, dtype=torch.bfloat16)
    for _ in range(100):
        w.grad = -torch.ones(4, dtype=torch.bfloat16)
        master.grads_to_master()
        opt.step()
        master.master_to_model()
        pure += 1e-4  # what pure-bf16 does: 1 + 1e-4 rounds back to 1
    assert torch.equal(pure, torch.ones(4, dtype=torch.bfloat16))
    assert abs(master.params[0][0].item() - 1.01) < 1e-5
    assert w[0].item() == pytest.approx(1.0078125)  # the bf16 neighbour of 1.01


def test_fp32_main_gradients_accumulate_what_bf16_gradients_round_away():
    """Three micro-batches' gradients 1, 2^-9, 2^-9: a bf16 sum stays 1 (its step is 2^-7 there), the fp32 main
    gradient holds 1 + 2^-8; each 16-bit gradient is dropped once added, and the buffer outlives zero_grad."""

    def run(main_grads):
        module = torch.nn.Module()
        module.w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
        master = MasterWeights(module, main_grads=main_grads)
        for scale in (1.0, 2.0**-9, 2.0**-9):
            (module.w.float().sum() * scale).backward()
        master.grads_to_master()
        return module, master

    plain, plain_master = run(False)
    assert plain_master.params[0].grad[0].item() == 1.0
    module, master = run(True)
    assert module.w.grad is None
    assert master.params[0].grad[0].item() == 1.0 + 2.0**-8
    buffer = master.main_grads
    torch.optim.SGD(master.params, lr=0.1).zero_grad(set_to_none=True)
    master.zero_grad()
    assert master.params[0].grad.data_ptr() == buffer.data_ptr() and not buffer.any()


def test_fp32_main_gradients_train(train):
    records, state = train(
        precision={"mode": "mixed-bf16", "grad_dtype": "fp32"},
        batch={"micro_batch": 2, "global_batch": 8},
        training={"steps": 3},
    )
    assert state["master"][0].dtype == torch.float32
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]


@pytest.mark.parametrize("mode, changes", [("pure-bf16", True), ("mixed-bf16", True), ("amp-bf16", False)])
def test_fp32_norm_changes_training_with_16_bit_weights_only(train, mode, changes):
    plain, _ = train("plain", precision={"mode": mode}, training={"steps": 4})
    fp32, state = train("fp32", precision={"mode": mode}, training={"steps": 4, "fp32_norm": True})
    assert state["model"]["blocks.0.norm1.norm.weight"].dtype == torch.float32
    assert ([r["loss"] for r in plain] != [r["loss"] for r in fp32]) == changes


def test_8bit_adamw_trains_with_uint8_states(train):
    records, state = train(optimizer={"name": "adamw-8bit"}, training={"steps": 4})
    exp_avg = next(iter(state["optimizer"]["state"].values()))["__bnb_optimizer_quant_state__"][
        "state1"
    ]  # (bitsandbytes' packing)
    assert exp_avg.dtype == torch.uint8 and exp_avg.numel() == state["model"]["tok.weight"].numel()  # 256 x 64
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]
