"""Analytic memory model against the fake-tensor trace of the real program, over a matrix of jobs.

    .venv/bin/python benchmarks/memory_accuracy.py          # full matrix (a few minutes)
    .venv/bin/python benchmarks/memory_accuracy.py --quick  # every 4th configuration
    .venv/bin/python benchmarks/memory_accuracy.py --only /tp  # the rows whose name contains /tp

Each row: the analytic and traced peak per device, the error, the phase the model puts
the peak in, and the activation error in bytes. Headline figures come last; int8 rows are
reported apart (their peak on explicit attention ops is not modelled yet).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

from provenance import provenance

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory

RESULTS = Path(__file__).parent / "results" / "memory_accuracy.json"
TINY = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "max_positions": 64}  # ~0.1M
SMALL_GPT = {"preset": "gpt2", "layers": 4, "hidden": 384, "heads": 6, "seq_len": 256, "max_positions": 256}  # ~27M
SMALL_LLAMA = {
    "preset": "llama2-7b",
    "layers": 4,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 2,
    "ffn": 1376,
    "seq_len": 512,
}  # ~28M
GPT2 = {"preset": "gpt2"}  # 124M
LLAMA_7B_LAYERS = {"preset": "llama2-7b", "layers": 2}  # 7B-scale layers, 0.66B


def matrix() -> list[tuple[str, dict]]:
    """(name, job dict) pairs covering every option the analytic model has."""
    rows = []

    def add(
        name,
        model,
        mode="amp-bf16",
        b=2,
        accum=1,
        rec="none",
        att="flash",
        opt="adamw",
        impl=None,
        momentum=0.9,
        dropout=None,
        dp=1,
        zero=0,
        lora=None,
        compress="none",
        tp=1,
        sp=False,
        pp=1,
        schedule="1f1b",
        method="lora",
        vpp=1,
        bucket_mb=25.0,
        grads="param",
        offload="none",
        backend=None,
    ):
        if dropout is not None:
            model = dict(model, dropout=dropout)
        finetune = {"method": method, "rank": 8, "targets": lora} if lora else {}
        rows.append(
            (
                name,
                {
                    "model": model,
                    "batch": {"micro_batch": b, "global_batch": b * accum * dp},
                    "precision": {"mode": mode, "grad_dtype": grads},
                    "optimizer": {"name": opt, "impl": impl, "momentum": momentum},
                    "parallel": {
                        "zero": zero,
                        "offload": offload,
                        "tp": tp,
                        "sp": sp,
                        "pp": pp,
                        "vpp": vpp,
                        "schedule": schedule,
                        "backend": backend,
                    },
                    "cluster": {"count": dp * tp * pp},
                    "finetune": finetune,
                    "training": {"bucket_cap_mb": bucket_mb},
                    "memory": {"recompute": rec, "attention": att, "program": "cpu", "act_compress": compress},
                },
            )
        )

    # every precision x recompute on both block styles
    for (mname, model), mode, rec in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)),
        ("fp32", "amp-bf16", "amp-fp16", "pure-bf16", "mixed-bf16"),
        ("none", "selective", "selective-op", "full"),
    ):
        add(f"{mname}/{mode}/{rec}", model, mode=mode, rec=rec)
    # attention kernels and dropout
    for (mname, model), att, drop in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("flash", "eager"), (0.0, 0.1)
    ):
        add(f"{mname}/{att}/dropout{drop}", model, att=att, dropout=drop)
    # optimizers and their implementations
    for opt, impl in itertools.product(("adamw", "adam", "sgd"), ("for-loop", "foreach")):
        add(f"llama/{opt}/{impl}", SMALL_LLAMA, opt=opt, impl=impl, rec="full")
    add("llama/sgd-plain", SMALL_LLAMA, opt="sgd", momentum=0.0)
    # bitsandbytes' 8-bit AdamW, traced on real tensors (it reads its states while stepping)
    add("llama/adamw-8bit/amp-bf16", SMALL_LLAMA, opt="adamw-8bit", b=1)
    add("llama-v1000/adamw-8bit/mixed-bf16", dict(SMALL_LLAMA, vocab=1000), mode="mixed-bf16", opt="adamw-8bit", b=1)
    add("gpt-v1000/adamw-8bit/fp32/full", dict(SMALL_GPT, vocab=1000), mode="fp32", opt="adamw-8bit", b=2, rec="full")
    # micro-batch size and gradient accumulation
    for b, accum in ((1, 1), (4, 1), (1, 4), (8, 2)):
        add(f"gpt/b{b}/accum{accum}", SMALL_GPT, b=b, accum=accum)
    # sizes: tiny to 7B-scale layers
    add("tiny/fp32", TINY, mode="fp32", b=4)
    add("tiny/eager-dropout", TINY, att="eager", dropout=0.1)
    # tiny width, eager scores and full recompute: the attention core's s x s tensors outweigh the weights
    add(
        "tiny-wide-seq/eager/full",
        dict(TINY, hidden=128, vocab=1000, seq_len=128, max_positions=128),
        att="eager",
        rec="full",
    )
    add("gpt2-124m/amp", GPT2, b=2)
    add("gpt2-124m/full", GPT2, b=8, rec="full")
    add("gpt2-124m/pure-bf16-eager", GPT2, mode="pure-bf16", att="eager", b=2)
    add("llama7b-layers/amp-b1", LLAMA_7B_LAYERS, b=1)
    add("llama7b-layers/full-b2", LLAMA_7B_LAYERS, b=2, rec="full")
    # a whole 70B model on fake tensors: ~1.1 TB "used" in a few GiB of RSS (tests trace its layers, 4 deep)
    add("llama2-70b/mixed-bf16/full-b1", {"preset": "llama2-70b"}, mode="mixed-bf16", b=1, rec="full")
    add("llama7b-layers/mixed-selective", LLAMA_7B_LAYERS, mode="mixed-bf16", b=1, rec="selective")
    # Megatron's fp32 main gradients: a persistent fp32 buffer the 16-bit gradients are added into
    add("gpt/mixed-bf16/fp32-grads/none", SMALL_GPT, mode="mixed-bf16", grads="fp32")
    add(
        "llama/mixed-fp16/fp32-grads/selective/accum2",
        SMALL_LLAMA,
        mode="mixed-fp16",
        grads="fp32",
        rec="selective",
        accum=2,
    )
    add(
        "llama-v1000/mixed-bf16/fp32-grads/full/foreach",
        dict(SMALL_LLAMA, vocab=1000),
        mode="mixed-bf16",
        grads="fp32",
        rec="full",
        impl="foreach",
        b=1,
    )
    add("llama7b-layers/mixed-bf16/fp32-grads/full", LLAMA_7B_LAYERS, mode="mixed-bf16", grads="fp32", b=1, rec="full")
    # small vocabularies: the peak moves from the loss into the backward layers or the optimizer step
    for (mname, model), rec, b, accum in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("none", "full"), (1, 4), (1, 2)
    ):
        add(f"{mname}-v1000/{rec}/b{b}/accum{accum}", dict(model, vocab=1000), rec=rec, b=b, accum=accum)
    add("llama-v1000/mixed/full/foreach", dict(SMALL_LLAMA, vocab=1000), mode="mixed-bf16", rec="full", impl="foreach")
    add(
        "llama-v1000/pure-bf16/selective/eager",
        dict(SMALL_LLAMA, vocab=1000),
        mode="pure-bf16",
        rec="selective",
        att="eager",
        b=4,
    )
    # LoRA: frozen base, adapters on chosen projections
    for (mname, model), mode, targets, vocab in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)),
        ("amp-bf16", "pure-bf16", "mixed-bf16"),
        (["q", "v"], ["q", "k", "v", "o", "up", "down"]),
        (32000, 1000),
    ):
        add(f"{mname}-v{vocab}/lora-{'+'.join(targets)}/{mode}", dict(model, vocab=vocab), mode=mode, lora=targets)
    add("llama7b-layers/lora-qv/pure-bf16", LLAMA_7B_LAYERS, mode="pure-bf16", b=1, lora=["q", "v"])
    # LoRA and QLoRA with full recompute and dropout
    for (mname, model), method, rec, drop in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("lora", "qlora"), ("none", "selective", "full"), (0.0, 0.1)
    ):
        if rec == "none" and drop == 0.0:
            continue
        add(
            f"{mname}-v8000/{method}-qvdown/{rec}/dropout{drop}",
            dict(model, vocab=8000),
            dropout=drop,
            rec=rec,
            lora=["q", "v", "down"],
            method=method,
        )
    # QLoRA: NF4 base matrices (toolkit.program.qlora), adapters on top
    for (mname, model), mode, targets, vocab in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)),
        ("amp-bf16", "pure-bf16", "mixed-bf16"),
        (["q", "v"], ["q", "k", "v", "o", "up", "down"]),
        (32000, 1000),
    ):
        add(
            f"{mname}-v{vocab}/qlora-{'+'.join(targets)}/{mode}",
            dict(model, vocab=vocab),
            mode=mode,
            lora=targets,
            method="qlora",
        )
    add("llama7b-layers/qlora-qv/amp-bf16", LLAMA_7B_LAYERS, b=1, lora=["q", "v"], method="qlora")
    # torch's ZeRO-1 (ZeroRedundancyOptimizer: whole tensors per rank) on a fake process group
    for (mname, model), mode, impl in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("fp32", "amp-bf16", "pure-bf16"), ("for-loop", "foreach")
    ):
        add(f"{mname}/zero1-dp8/{mode}/{impl}", model, mode=mode, impl=impl, dp=8, zero=1)
    # FSDP2 (torch ZeRO-2/3) on a fake process group of 8 ranks
    for (mname, model), mode, zero, rec in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("fp32", "amp-bf16", "pure-bf16"), (2, 3), ("none", "full")
    ):
        add(f"{mname}/fsdp-zero{zero}/{mode}/{rec}", model, mode=mode, rec=rec, dp=8, zero=zero)
    for (mname, model), zero, rec, b in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), (2, 3), ("none", "full"), (1, 4)
    ):
        add(f"{mname}-v1000/fsdp-zero{zero}/{rec}/b{b}", dict(model, vocab=1000), rec=rec, b=b, dp=8, zero=zero)
    # FSDP2 accumulating gradients over micro-batches, and with CPU offload (device and host bytes apart)
    for (mname, model), mode, zero in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("amp-bf16", "pure-bf16"), (2, 3)
    ):
        if mname == "gpt" and mode == "amp-bf16":  # (the benchmark's 10 minutes)
            continue
        add(
            f"{mname}-v1000/fsdp-zero{zero}/{mode}/full/b1/accum2",
            dict(model, vocab=1000),
            mode=mode,
            rec="full",
            b=1,
            accum=2,
            dp=8,
            zero=zero,
        )
    for (mname, model), mode, zero in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)), ("fp32", "amp-bf16", "pure-bf16"), (2, 3)
    ):
        if zero == 2 and mname == "llama":  # a real vocabulary: the loss is the peak
            add(f"{mname}/fsdp-offload-zero2/{mode}/none", model, mode=mode, dp=8, zero=2, offload="params")
        elif zero == 3:  # a small one: the backward is
            add(
                f"{mname}-v1000/fsdp-offload-zero3/{mode}/full/b1/accum2",
                dict(model, vocab=1000),
                mode=mode,
                rec="full",
                b=1,
                accum=2,
                dp=8,
                zero=3,
                offload="params",
            )
    # tensor parallelism (torch's DTensor plan) on a fake process group, with and without sequence parallelism
    untied_gpt = dict(SMALL_GPT, tie_embeddings=False)
    for mode, rec in itertools.product(("fp32", "amp-bf16", "amp-fp16", "pure-bf16"), ("none", "selective", "full")):
        add(f"gpt/tp2/{mode}/{rec}", untied_gpt, mode=mode, rec=rec, tp=2)
        add(f"llama/tp2-sp/{mode}/{rec}", SMALL_LLAMA, mode=mode, rec=rec, tp=2, sp=True)
    add("gpt/tp2/amp-bf16/selective-op/eager", untied_gpt, att="eager", rec="selective-op", tp=2)
    add("llama/tp2-sp/amp-bf16/selective-op", SMALL_LLAMA, rec="selective-op", tp=2, sp=True)
    add("llama/tp4-sp/eager-dropout", dict(SMALL_LLAMA, kv_heads=4), att="eager", dropout=0.1, tp=4, sp=True)
    add("llama-v1000/tp2/b4/accum2", dict(SMALL_LLAMA, vocab=1000), b=4, accum=2, tp=2)
    add("llama7b-layers/tp4-sp/b1", LLAMA_7B_LAYERS, b=1, tp=4, sp=True)
    add("llama7b-layers/tp8-sp/full-b2", LLAMA_7B_LAYERS, b=2, rec="full", tp=8, sp=True)
    # tensor parallelism inside FSDP2 (torchtitan's 2-D layout: a dp x tp mesh) on a fake process group
    for mode, zero, rec in itertools.product(("fp32", "amp-bf16", "pure-bf16"), (2, 3), ("none", "full")):
        add(
            f"llama/2d-tp2-sp-dp4-zero{zero}/{mode}/{rec}",
            SMALL_LLAMA,
            mode=mode,
            rec=rec,
            tp=2,
            sp=True,
            dp=4,
            zero=zero,
        )
    for zero, rec in itertools.product((2, 3), ("none", "selective")):
        add(f"gpt/2d-tp2-dp4-zero{zero}/amp-fp16/{rec}", untied_gpt, mode="amp-fp16", rec=rec, tp=2, dp=4, zero=zero)
    add("llama/2d-tp2-sp-dp4-zero3/amp-bf16/selective-op", SMALL_LLAMA, rec="selective-op", tp=2, sp=True, dp=4, zero=3)
    add("llama-v1000/2d-tp2-dp8-zero3/b4/accum2", dict(SMALL_LLAMA, vocab=1000), b=4, accum=2, tp=2, dp=8, zero=3)
    for zero in (2, 3):  # a small vocabulary: the peak moves into the backward layers
        add(
            f"llama-v1000/2d-tp2-sp-dp4-zero{zero}/full/b4",
            dict(SMALL_LLAMA, vocab=1000),
            b=4,
            rec="full",
            tp=2,
            sp=True,
            dp=4,
            zero=zero,
        )
    add("llama7b-layers/2d-tp4-sp-dp8-zero3/b1", LLAMA_7B_LAYERS, b=1, tp=4, sp=True, dp=8, zero=3)
    add("llama7b-layers/2d-tp8-sp-dp4-zero2/full-b2", LLAMA_7B_LAYERS, b=2, rec="full", tp=8, sp=True, dp=4, zero=2)
    # pipelines: torch's schedules on real gloo ranks (one process per stage), the busiest stage
    llama_v8000 = dict(SMALL_LLAMA, vocab=8000, seq_len=256)  # (real compute: the short sequence keeps it quick)
    # (no amp-fp16 here: these stages compute for real, and CPU fp16 matmuls are slow; fake-tensor rows cover it)
    for mode, rec, schedule in itertools.product(
        ("fp32", "amp-bf16", "pure-bf16"), ("none", "full"), ("1f1b", "gpipe")
    ):
        if mode == "fp32" and rec == "none":  # (slow real fp32 compute; the full-recompute rows cover it)
            continue
        add(
            f"llama-v8000/pp2-{schedule}/{mode}/{rec}",
            llama_v8000,
            mode=mode,
            rec=rec,
            accum=4,
            pp=2,
            schedule=schedule,
        )
    add("llama-s256/pp4-1f1b/m4", dict(SMALL_LLAMA, seq_len=256), accum=4, pp=4)
    add("llama-v1000/pp2-1f1b/selective/b4", dict(SMALL_LLAMA, vocab=1000), rec="selective", b=4, accum=4, pp=2)
    add("llama-v1000/pp2-1f1b/selective-op/b4", dict(SMALL_LLAMA, vocab=1000), rec="selective-op", b=4, accum=4, pp=2)
    # FSDP2 stages over dp (ZeRO-2/3 under pipelines: torchtitan's program), 4 gloo ranks
    add("llama/pp2-dp2-fsdp-zero2/amp-bf16/m4", SMALL_LLAMA, accum=4, pp=2, dp=2, zero=2)
    add(
        "llama-v1000/pp2-vpp2-dp2-fsdp-zero3/selective-op/m4",
        dict(SMALL_LLAMA, vocab=1000),
        rec="selective-op",
        accum=4,
        pp=2,
        vpp=2,
        dp=2,
        zero=3,
    )
    add(
        "llama-v1000/pp2-dp2-fsdp-zero3/fp32/full/m2",
        dict(SMALL_LLAMA, vocab=1000),
        mode="fp32",
        rec="full",
        accum=2,
        pp=2,
        dp=2,
        zero=3,
    )
    add("llama-v1000/pp4-gpipe/m4", dict(SMALL_LLAMA, vocab=1000), accum=4, pp=4, schedule="gpipe")
    # interleaved 1F1B (torch's ScheduleInterleaved1F1B: each rank runs vpp chunks), and a middle stage
    llama8_v1000 = dict(SMALL_LLAMA, layers=8, vocab=1000, seq_len=256)
    add("llama-v8000/pp2-vpp2/amp-bf16/none/m4", llama_v8000, accum=4, pp=2, vpp=2)
    add("llama-v8000/pp2-vpp2/amp-bf16/none/m2", llama_v8000, accum=2, pp=2, vpp=2)  # one round: m = pp
    add(
        "llama-v1000/pp2-vpp2/pure-bf16/full/m8",
        dict(SMALL_LLAMA, vocab=1000),
        mode="pure-bf16",
        rec="full",
        accum=8,
        pp=2,
        vpp=2,
    )
    add("llama8-v1000/pp2-vpp4/pure-bf16/full/m8", llama8_v1000, mode="pure-bf16", rec="full", accum=8, pp=2, vpp=4)
    add("llama8-v1000/pp4-vpp2/pure-bf16/full/m8", llama8_v1000, mode="pure-bf16", rec="full", accum=8, pp=4, vpp=2)
    add(
        "llama8-v8000/pp2-vpp4/amp-bf16/selective/m4",
        dict(llama8_v1000, vocab=8000),
        rec="selective",
        accum=4,
        pp=2,
        vpp=4,
    )
    add("llama8-v1000/pp4-1f1b/pure-bf16/full/m8", llama8_v1000, mode="pure-bf16", rec="full", accum=8, pp=4)
    # DeepSpeed's ZeRO (mixed-bf16): DeepSpeed itself on real gloo ranks (small models: it reads tensor values)
    ds_llama = dict(SMALL_LLAMA, seq_len=256)
    add("gpt/ds-zero1/mixed-bf16/none", SMALL_GPT, mode="mixed-bf16", dp=2, zero=1)
    add("llama-s256/ds-zero1/mixed-bf16/full/accum2", ds_llama, mode="mixed-bf16", rec="full", accum=2, dp=2, zero=1)
    add(
        "gpt/ds-zero2/mixed-bf16/selective/accum2", SMALL_GPT, mode="mixed-bf16", rec="selective", accum=2, dp=2, zero=2
    )
    add("llama-s256/ds-zero2/mixed-bf16/none/dp4", ds_llama, mode="mixed-bf16", dp=4, zero=2, bucket_mb=4.0)
    add(
        "llama-v1000/ds-zero2/mixed-bf16/full/foreach",
        dict(ds_llama, vocab=1000),
        mode="mixed-bf16",
        rec="full",
        impl="foreach",
        dp=2,
        zero=2,
    )
    add("gpt/ds-zero3/mixed-bf16/none", SMALL_GPT, mode="mixed-bf16", dp=2, zero=3)
    add("llama-s256/ds-zero3/mixed-bf16/full/accum2", ds_llama, mode="mixed-bf16", rec="full", accum=2, dp=2, zero=3)
    add(
        "llama-v1000/ds-zero3/mixed-bf16/selective/b4/dp4",
        dict(ds_llama, vocab=1000),
        mode="mixed-bf16",
        rec="selective",
        b=4,
        dp=4,
        zero=3,
        bucket_mb=4.0,
    )
    # DeepSpeed's BF16 optimizer (fp32 gradient accumulation at ZeRO-1): its fp32 buffer, and its all-reduce's cast
    add("gpt/ds-bf16opt/mixed-bf16/none", SMALL_GPT, mode="mixed-bf16", grads="fp32", dp=2, zero=1, backend="deepspeed")
    add(
        "llama-s256/ds-bf16opt/mixed-bf16/full/accum2",
        ds_llama,
        mode="mixed-bf16",
        grads="fp32",
        rec="full",
        accum=2,
        dp=2,
        zero=1,
        backend="deepspeed",
    )
    # DeepSpeed's ZeRO-Offload: fp32 states, gradients and the step on the host
    add("gpt/ds-zero2-offload/mixed-bf16/none", SMALL_GPT, mode="mixed-bf16", dp=2, zero=2, offload="optimizer")
    add(
        "llama-s256/ds-zero1-offload/mixed-bf16/full/accum2",
        ds_llama,
        mode="mixed-bf16",
        rec="full",
        accum=2,
        dp=2,
        zero=1,
        offload="optimizer",
    )
    add(
        "llama-v1000/ds-zero2-offload/mixed-bf16/full/accum2/dp4",
        dict(ds_llama, vocab=1000),
        mode="mixed-bf16",
        rec="full",
        accum=2,
        dp=4,
        zero=2,
        bucket_mb=4.0,
        offload="optimizer",
    )
    add(
        "llama-s256/ds-zero3-offload/mixed-bf16/selective/accum2",
        ds_llama,
        mode="mixed-bf16",
        rec="selective",
        accum=2,
        dp=2,
        zero=3,
        offload="optimizer",
    )
    # int8 saved activations (the runner's hooks, traced): flash attention, and the explicit-attention path
    for (mname, model), mode, rec in itertools.product(
        (("gpt", SMALL_GPT), ("llama", SMALL_LLAMA)),
        ("fp32", "amp-bf16", "pure-bf16", "mixed-bf16"),
        ("none", "selective"),
    ):
        add(f"{mname}/int8/{mode}/{rec}", model, mode=mode, rec=rec, compress="int8")
    add("gpt/int8-eager/amp-bf16", SMALL_GPT, att="eager", compress="int8")
    add("llama/int8-dropout/amp-bf16", SMALL_LLAMA, dropout=0.1, compress="int8")
    # long sequences, where int8's estimate reads lowest (tests/trace/test_int8.py's 1024-token job)
    long = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 256, "seq_len": 1024, "max_positions": 1024}
    add("gpt-s1024/int8/amp-bf16", long, b=4, compress="int8")
    add("gpt-s1024/int8-eager/amp-bf16", long, b=4, att="eager", compress="int8")
    return rows


PEAK_GROUPS = [  # (label, which row names belong, report the median too)
    ("replicated", lambda name: not any(k in name for k in ("fsdp", "int8", "/tp", "/pp", "/2d", "/ds-")), False),
    ("fsdp", lambda name: "fsdp" in name, True),
    ("deepspeed zero", lambda name: "/ds-zero" in name, False),
    ("tensor-parallel", lambda name: "/tp" in name, False),
    ("tp x fsdp", lambda name: "/2d" in name, False),
    ("qlora", lambda name: "qlora" in name, False),
    ("pipeline", lambda name: "/pp" in name, True),
    ("pipeline x fsdp", lambda name: "/pp" in name and "fsdp" in name, False),
]


def run(rows) -> tuple[list[float], list, list[float], list[dict]]:
    errors, act_errors, host_errors, records = [], [], [], []
    print(f"{'configuration':36} {'traced MiB':>11} {'model MiB':>11} {'error':>8} {'s':>5}  phase")
    for name, data in rows:
        job, _ = Job.from_dict(data).resolve()
        start = time.perf_counter()
        traced, model = trace_memory(job), memory_estimate(job)
        seconds = time.perf_counter() - start
        error = (model.peak_bytes - traced.peak_bytes) / traced.peak_bytes
        errors.append(abs(error))
        act_errors.append(
            abs(model.activations_bytes - traced.activations_bytes) / traced.activations_bytes
            if traced.activations_bytes
            else None
        )  # (a pipeline stage has no single boundary)
        if traced.host_bytes:  # offload: what stays in host memory
            host_errors.append(abs(model.host_bytes - traced.host_bytes) / traced.host_bytes)
        records.append(
            {
                "name": name,
                "traced_peak_bytes": float(traced.peak_bytes),
                "modelled_peak_bytes": float(model.peak_bytes),
                "error": float(error),
                "activations_error": None if act_errors[-1] is None else float(act_errors[-1]),
            }
        )
        print(
            f"{name:36} {traced.peak_bytes / 2**20:11.1f} {model.peak_bytes / 2**20:11.1f} "
            f"{100 * error:+7.2f}% {seconds:5.1f}  {model.peak_phase}"
        )
    return errors, act_errors, host_errors, records


def main() -> None:
    rows = matrix()
    if "--quick" in sys.argv:
        rows = rows[::4]
    if "--only" in sys.argv:  # --only SUBSTRING: the rows whose name contains it
        part = sys.argv[sys.argv.index("--only") + 1]
        rows = [row for row in rows if part in row[0]]
    start = time.perf_counter()
    errors, act_errors, host_errors, records = run(rows)
    int8_flash = [e for (name, _), e in zip(rows, errors) if "/int8/" in name]
    int8_explicit = [e for (name, _), e in zip(rows, errors) if "int8-" in name]
    int8_act = [e for (name, _), e in zip(rows, act_errors) if "int8" in name and e is not None]
    print()
    print(f"configurations: {len(rows)}")
    print(f"seconds: {time.perf_counter() - start:.0f}")
    measured = [e for e in act_errors if e is not None]
    if measured:
        print(f"activations max error: {100 * max(measured):.3f} %")
    for label, belongs, with_median in PEAK_GROUPS:
        chosen = [e for (name, _), e in zip(rows, errors) if belongs(name)]
        if chosen and with_median:
            print(f"{label} peak median error: {100 * statistics.median(chosen):.2f} %")
        if chosen:
            print(f"{label} peak max error: {100 * max(chosen):.2f} %")
    if host_errors:
        print(f"offload host bytes max error: {100 * max(host_errors):.2f} %")
    if int8_act:
        print(f"int8 activations max error: {100 * max(int8_act):.3f} %")
    if int8_flash:
        print(f"int8 peak max error (flash attention): {100 * max(int8_flash):.2f} %")
    if int8_explicit:
        print(f"int8 peak max error (explicit attention, not modelled): {100 * max(int8_explicit):.2f} %")
    others = [e for (name, _), e in zip(rows, errors) if "int8" not in name]
    if len(rows) == len(matrix()):  # the whole matrix: its figures are the docs' (docs/accuracy.md)
        write_results(rows, errors, act_errors, host_errors, records)
    print(f"peak median error (without int8): {100 * statistics.median(others):.2f} %")
    print(f"peak max error (without int8): {100 * max(others):.2f} %")


def write_results(rows, errors, act_errors, host_errors, records) -> None:
    """benchmarks/results/memory_accuracy.json: each family's peak errors, activations, host bytes, int8, and every
    row (its traced and modelled peak, signed error)."""

    def stats(chosen):
        return {"rows": len(chosen), "median_abs_error": statistics.median(chosen), "max_abs_error": max(chosen)}

    groups = {
        label: stats(chosen)
        for label, belongs, _ in PEAK_GROUPS
        if (chosen := [e for (name, _), e in zip(rows, errors) if belongs(name)])
    }
    int8 = {
        "flash attention": [e for (name, _), e in zip(rows, errors) if "/int8/" in name],
        "explicit attention (not modelled)": [e for (name, _), e in zip(rows, errors) if "int8-" in name],
    }
    data = {
        **provenance(),
        "benchmark": "benchmarks/memory_accuracy.py",
        "configurations": len(rows),
        "peak": {**groups, "all but int8": stats([e for (name, _), e in zip(rows, errors) if "int8" not in name])},
        "int8_peak": {k: stats(v) for k, v in int8.items() if v},
        "activations": stats([e for e in act_errors if e is not None]),
        "offload_host_bytes": stats(host_errors) if host_errors else None,
        "rows": records,
    }
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
