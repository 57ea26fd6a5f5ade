"""Property-based tests (issue 17 item 1): any flag combination `estimate`, `doctor`, `plan` and (on tiny shapes)
`trace` accept, odd values included, either answers or is refused in one line naming the field, with exit code 2:
never a traceback. And for generated jobs (LoRA and QLoRA included) the planner's layout grid estimates every layout
as that layout's own Job does, to the byte, and refuses exactly what Job.resolve refuses.

CI runs the derandomised profile (same examples every run, no example database written); `HYPOTHESIS_PROFILE=dev`
explores new ones. A failing example is printed by hypothesis as the argv that broke it.
"""

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.cli import main
from toolkit.specs import load_catalog

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=60_000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    deadline=60_000,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CATALOG = load_catalog()
PRESETS = sorted(CATALOG.presets) + ["gpt-5", "llama2-7", ""]  # unknown and empty names too
ACCELERATORS = [a.name for a in CATALOG.accelerators.values()] + ["A100", "B200", "a100-80gb", "TPU"]
OFFERS = sorted(CATALOG.offers) + ["p9.huge"]
COUNTS = st.sampled_from([-8, 0, 1, 2, 3, 8, 12, 64, 512, 4096])
SMALL_INTS = st.sampled_from([-1, 0, 1, 2, 3, 4, 8, 16])


def _flag(name: str, values) -> st.SearchStrategy:
    return st.one_of(st.just([]), values.map(lambda v: [name, str(v)]))


def _switch(name: str) -> st.SearchStrategy:
    return st.sampled_from([[], [name]])


MODEL = st.one_of(
    st.sampled_from(PRESETS).map(lambda p: ["--model", p]),
    st.tuples(
        st.sampled_from([-2, 0, 1, 2, 24, 80]),
        st.sampled_from([-64, 0, 48, 64, 1000, 4096]),
        st.sampled_from([0, 1, 3, 4, 6, 32]),
    ).map(lambda t: ["--layers", str(t[0]), "--hidden", str(t[1]), "--heads", str(t[2])]),
    st.sampled_from(["7e9", "1.3b", "-5", "0", "lots"]).map(lambda n: ["--params", n]),
)

JOB_FLAGS = st.tuples(
    MODEL,
    _flag("--gpus", st.tuples(COUNTS, st.sampled_from(ACCELERATORS)).map(lambda t: f"{t[0]}x{t[1]}")),
    _flag(
        "--precision",
        st.sampled_from(["fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "mixed-fp16", "pure-bf16", "bf16", "fp64"]),
    ),
    _flag("--tp", SMALL_INTS),
    _flag("--pp", SMALL_INTS),
    _flag("--dp", SMALL_INTS),
    _flag("--vpp", SMALL_INTS),
    _flag("--zero", st.sampled_from([-1, 0, 1, 2, 3, 4])),
    _flag("--offload", st.sampled_from(["none", "optimizer", "params", "disk"])),
    _flag("--recompute", st.sampled_from(["none", "selective", "full", "some"])),
    _flag("--micro-batch", st.sampled_from([-1, 0, 1, 2, 8])),
    _flag("--global-batch", st.sampled_from([0, 1, 7, 64, 1024])),
    _flag("--seq", st.sampled_from([0, 128, 2048, 100000])),
    _flag("--dropout", st.sampled_from([0.0, 0.1, 2, -0.5])),
    _flag("--mfu", st.sampled_from([0, 0.4, 1.5])),
    _flag("--tokens", st.sampled_from(["1e9", "0", "-1", "many"])),
    _flag("--offer", st.sampled_from(OFFERS)),
    _flag("--finetune", st.sampled_from(["lora", "qlora", "full", "prefix"])),
    _flag("--lora-rank", st.sampled_from([0, 8, 16])),
    _flag("--lora-targets", st.sampled_from(["q,v", "q,k,v,o,up,down", "gate", ""])),
    _flag("--schedule", st.sampled_from(["1f1b", "gpipe", "zb"])),
    _flag("--backend", st.sampled_from(["torch", "deepspeed", "megatron", "jax"])),
    _switch("--fp8"),
    _switch("--sp"),
    _switch("--spot"),
).map(lambda parts: [arg for part in parts for arg in part])

LATER_FLAGS = st.tuples(  # the flags the runner, step-time and device-memory work added
    _flag("--cp", SMALL_INTS),
    _flag("--stage-layers", st.sampled_from(["5,6,6,5", "1,1", "0,4", "a,b", "-1,3"])),
    _flag("--kv-heads", st.sampled_from([0, 1, 2, 3, 8])),
    _flag("--grad-dtype", st.sampled_from(["param", "fp32", "fp16"])),
    _flag("--optimizer", st.sampled_from(["adamw", "sgd", "adamw-8bit", "lion"])),
    _flag("--act-compress", st.sampled_from(["none", "int8", "fp4"])),
    _flag("--attention", st.sampled_from(["flash", "eager"])),
    _flag("--headroom", st.sampled_from([0, 0.1, 1.5, -0.1])),
    _flag("--interruptions", st.sampled_from([0, 2.5, -1])),
    _flag("--gpus-per-node", st.sampled_from([0, 4, 8, 7])),
    _switch("--overlap-grad-reduce"),
    _switch("--no-overlap-param-gather"),
    _switch("--overlap-tp-comm"),
    _switch("--expandable-segments"),
).map(lambda parts: [arg for part in parts for arg in part])

ALL_FLAGS = st.tuples(JOB_FLAGS, LATER_FLAGS).map(lambda t: t[0] + t[1])


def _answers_or_refuses(argv: list[str], capsys) -> None:
    code = main(argv)  # anything but a SpecError would escape main() and fail the test
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0], (argv, err)
    else:
        assert out.strip(), argv


@settings(max_examples=40)
@given(flags=ALL_FLAGS)
def test_estimate_answers_or_refuses_in_one_line(flags, capsys):
    _answers_or_refuses(["estimate", *flags], capsys)


@settings(max_examples=30)
@given(flags=ALL_FLAGS)
def test_doctor_answers_or_refuses_in_one_line(flags, capsys):
    _answers_or_refuses(["doctor", *flags], capsys)


@settings(max_examples=20)
@given(
    flags=JOB_FLAGS,
    offers=st.lists(st.sampled_from(OFFERS), min_size=1, max_size=3, unique=True),
    max_gpus=st.sampled_from([0, 8, 64, 512]),
    objective=st.sampled_from(["time", "cost", "speed"]),
    runnable=_switch("--runnable"),
)
def test_plan_answers_or_refuses_in_one_line(flags, offers, max_gpus, objective, runnable, capsys):
    flags = [f for f in flags]
    if "--gpus" in flags:  # --offers plans over whole instances instead of a fixed cluster
        i = flags.index("--gpus")
        del flags[i : i + 2]
    _answers_or_refuses(
        [
            "plan",
            *flags,
            "--offers",
            ",".join(offers),
            "--max-gpus",
            str(max_gpus),
            "--objective",
            objective,
            *runnable,
        ],
        capsys,
    )


TINY_TRACE = st.tuples(
    st.sampled_from([1, 2, 3]).map(lambda n: ["--layers", str(n)]),
    st.sampled_from([(32, 4), (48, 3), (64, 4), (64, 0)]).map(lambda t: ["--hidden", str(t[0]), "--heads", str(t[1])]),
    st.just(["--vocab", "128", "--seq", "16"]),
    _flag("--precision", st.sampled_from(["fp32", "amp-bf16", "mixed-bf16", "pure-bf16"])),
    _flag("--tp", st.sampled_from([1, 2, 3])),
    _flag("--pp", st.sampled_from([1, 2])),
    _flag("--zero", st.sampled_from([0, 1, 2, 3])),
    _flag("--micro-batch", st.sampled_from([1, 2])),
    _flag("--global-batch", st.sampled_from([2, 4, 3])),
    _flag("--recompute", st.sampled_from(["none", "selective", "full"])),
    _flag("--finetune", st.sampled_from(["lora", "qlora"])),
    _flag("--dropout", st.sampled_from([0.1, 2])),
    _switch("--sp"),
).map(lambda parts: [arg for part in parts for arg in part])


@settings(max_examples=5)
@given(flags=TINY_TRACE)
def test_trace_on_tiny_shapes_answers_or_refuses_in_one_line(flags, capsys):
    """`toolkit trace` runs the real training step on fake tensors: any layout of a tiny model is traced or refused
    in one line (a tp that does not divide the heads, a pipeline deeper than the layers, ...)."""
    _answers_or_refuses(["trace", *flags], capsys)


# ---- the planner's grid against the single-job estimate, for generated jobs -------------------------------------

GRID_JOB = st.fixed_dictionaries(
    {
        "model": st.one_of(
            st.sampled_from(["llama2-7b", "gpt3-2.7b", "gpt2", "llama3-70b"]).map(lambda p: {"preset": p}),
            st.tuples(
                st.sampled_from([4, 12, 24]),
                st.sampled_from([256, 1024, 4096]),
                st.sampled_from([8, 16, 32]),
                st.sampled_from(["gelu", "swiglu"]),
                st.sampled_from([512, 2048]),
            ).map(
                lambda t: {"layers": t[0], "hidden": t[1], "heads": t[2], "mlp": t[3], "seq_len": t[4], "vocab": 32000}
            ),
        ),
        "precision": st.sampled_from(
            [
                ("fp32", "param", "torch"),
                ("amp-bf16", "param", "torch"),
                ("amp-fp16", "param", "torch"),
                ("pure-bf16", "param", "torch"),
                ("mixed-bf16", "param", "torch"),
                ("mixed-bf16", "fp32", "torch"),
                ("mixed-bf16", "param", "deepspeed"),
                ("mixed-fp16", "param", "deepspeed"),
                ("mixed-bf16", "fp32", "megatron"),
            ]
        ),  # (mode, main gradients, backend)
        "optimizer": st.sampled_from(["adamw", "sgd", "adamw-8bit"]).map(lambda n: {"name": n}),
        "finetune": st.one_of(
            st.just({}),
            st.tuples(
                st.sampled_from(["lora", "qlora"]),
                st.sampled_from([4, 16, 64]),
                st.sampled_from([["q", "v"], ["q", "k", "v", "o", "up", "down"]]),
            ).map(lambda t: {"method": t[0], "rank": t[1], "targets": t[2]}),
        ),
        "memory": st.tuples(st.sampled_from(["flash", "eager"]), st.sampled_from(["none", "int8"])).map(
            lambda t: {"attention": t[0], "act_compress": t[1]}
        ),
        "devices": st.sampled_from([8, 16, 64]),
        "global_batch": st.sampled_from([64, 96, 512]),
    }
)


@settings(max_examples=8)
@given(spec=GRID_JOB)
def test_the_grid_estimates_every_generated_job_as_the_job_itself_does(spec):
    """The planner ranks layouts from `layout_grid` over arrays; for every generated job (LoRA and QLoRA, 8-bit
    optimizers and int8 activations included) each layout's peak, activations and host bytes equal the estimate of
    that layout's own Job to the byte, and the grid refuses exactly what Job.resolve refuses."""
    import numpy as np

    from toolkit.estimate.grid import layout_grid
    from toolkit.estimate.memory import memory_estimate
    from toolkit.specs import Job, SpecError

    mode, grads, backend = spec["precision"]
    if spec["finetune"].get("method") == "qlora":  # (QLoRA computes in 16 bits: amp-bf16 on the torch backend)
        mode, grads, backend = "amp-bf16", "param", "torch"
    data = {
        "model": spec["model"],
        "precision": {"mode": mode, "grad_dtype": grads},
        "optimizer": spec["optimizer"],
        "finetune": spec["finetune"],
        "memory": spec["memory"],
        "parallel": {"backend": backend},
        "batch": {"micro_batch": 1, "global_batch": spec["global_batch"]},
        "cluster": {"accelerator": "H100-SXM", "count": spec["devices"]},
    }
    try:
        job, _ = Job.from_dict(data).resolve()
    except SpecError:
        return  # (the job itself is refused: nothing to lay out)
    grid = layout_grid(
        job,
        tp=[1, 2, 4],
        pp=[1, 2],
        zero=[0, 1, 3],
        micro_batch=[1, 2],
        recompute=["none", "selective", "full"],
        sp=[False, True],
        offload=["none", "optimizer"],
    )
    mem = memory_estimate(grid.job)
    checked = 0
    for i in range(len(grid)):
        layout = grid.layout(i)
        single = {
            **data,
            "parallel": {
                **data["parallel"],
                **{k: layout[k] for k in ("tp", "pp", "vpp", "sp", "zero", "offload", "dp")},
            },
            "batch": {"micro_batch": layout["micro_batch"], "global_batch": spec["global_batch"]},
            "memory": {**data["memory"], "recompute": layout["recompute"]},
        }
        try:
            one_job, _ = Job.from_dict(single).resolve()
        except SpecError:
            assert not grid.valid[i], layout
            continue
        assert grid.valid[i], layout
        one = memory_estimate(one_job)
        for name in ("peak_bytes", "activations_bytes", "host_bytes"):
            assert np.asarray(getattr(mem, name))[i] == float(getattr(one, name)), (name, layout, spec)
        checked += 1
    assert checked >= 1  # (the job's own layout, tp = pp = 1, is in the grid)
