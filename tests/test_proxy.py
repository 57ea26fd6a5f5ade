"""What the planner's Run starts: the job itself where this machine holds it, else a proxy that keeps the job's
kinds of parallelism, schedule, ZeRO stage, precision and recompute on at most four ranks, and says what it
scaled. (The proxy trains for real in notebooks/00_start_here and in the browser test.)"""

import itertools

import pytest

from toolkit.runs.proxy import LocalDevices, run_plan
from toolkit.specs import Job, SpecError

CPU = LocalDevices("cpu", 2)
H100 = LocalDevices("cuda", 8, 80 * 2**30, "NVIDIA H100 80GB HBM3")


def _job(**parallel):
    mode = parallel.pop("mode", "amp-bf16")
    recompute = parallel.pop("recompute", "none")
    count = parallel.pop("count", 64)
    return Job.from_dict(
        {
            "model": {"preset": "llama2-13b"},
            "precision": {"mode": mode},
            "memory": {"recompute": recompute},
            "parallel": parallel,
            "cluster": {"accelerator": "H100-SXM", "count": count},
        }
    )


LAYOUTS = [
    dict(tp=tp, pp=pp, zero=zero, vpp=vpp, sp=sp, schedule=schedule, mode=mode, recompute=recompute)
    for tp, pp, zero, vpp, sp, schedule, mode, recompute in itertools.product(
        (1, 2, 8),
        (1, 2, 4),
        (0, 1, 3),
        (1, 2),
        (False, True),
        ("1f1b", "gpipe"),
        ("amp-bf16", "fp32", "mixed-bf16"),
        ("none", "selective", "full"),
    )
    if not (vpp > 1 and pp == 1) and not (sp and tp == 1)
]


@pytest.mark.parametrize("layout", LAYOUTS[::7], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_a_proxy_keeps_what_the_job_is_made_of_on_at_most_four_ranks(layout):
    try:
        job, _ = _job(**layout).resolve()
    except SpecError as err:
        pytest.skip(f"the job itself is refused, so there is no proxy to check: {err}")
    plan = run_plan(job, CPU)
    if plan.job is None:  # refused: the reason is said in words, Run stays off
        assert plan.refusal and "not" in plan.text()
        return
    proxy, par, full = plan.job, plan.job.parallel, job.parallel
    assert plan.proxy and plan.nproc == proxy.devices <= 4
    assert (par.tp > 1) == (full.tp > 1) and (par.pp > 1) == (full.pp > 1)
    assert (par.vpp > 1) == (full.vpp > 1) and par.sp == full.sp
    assert (par.zero, par.schedule, par.offload) == (full.zero, full.schedule, full.offload)
    assert proxy.memory.recompute == job.memory.recompute
    assert proxy.precision.mode == job.precision.mode or any("precision" in c for c in plan.changes)
    assert proxy.model.layers <= 8 and proxy.model.hidden == 128 and proxy.grad_accum >= par.pp
    for name in ("dp", "tp", "pp", "vpp"):  # every degree it lowered is named
        if getattr(par, name) != getattr(full, name):
            assert any(c.startswith(f"{name} {getattr(full, name)} → {getattr(par, name)}") for c in plan.changes)
    Job.from_dict(proxy.to_dict()).resolve()  # what the launcher writes to launch.yaml reads back


def test_a_machine_that_holds_the_job_runs_it_as_planned_and_one_that_does_not_runs_a_proxy():
    job = Job.from_dict(
        {
            "model": {"preset": "llama2-7b"},
            "precision": {"mode": "amp-bf16"},
            "parallel": {"zero": 3},
            "cluster": {"accelerator": "H100-SXM", "count": 8},
        }
    )
    own = run_plan(job, H100)
    assert not own.proxy and own.nproc == 8 and own.job.model.layers == 32
    two = run_plan(job, LocalDevices("cuda", 2, 80 * 2**30, "H100"))
    assert two.proxy and two.nproc == 2 and "2 GPU(s) here; the job needs 8" in two.text()
    small = run_plan(job, LocalDevices("cuda", 8, 8 * 2**30, "RTX 3070"))
    assert small.proxy and "GiB per device; the RTX 3070 has 8.0 GiB" in small.text()
    cpu = run_plan(job, CPU)
    assert cpu.proxy and "no GPU here" in cpu.text() and "CPU process(es) over gloo" in cpu.text()


def test_a_layout_the_runner_does_not_train_is_refused_in_words_before_run():
    plan = run_plan(_job(mode="mixed-bf16", zero=3, offload="params"), CPU)  # ZeRO-Infinity: estimated only
    assert plan.job is None and "not available" in plan.text() and "ZeRO-Infinity" in plan.text()
    staged = run_plan(_job(pp=2, zero=3, offload="params"), CPU)  # FSDP2's offload under pipelines: runs
    assert staged.job is not None and staged.job.parallel.offload == "params" and staged.job.parallel.pp == 2
    megatron = run_plan(_job(tp=8, mode="mixed-bf16", count=64), CPU)  # estimated only: the proxy says so
    assert megatron.job.precision.mode == "amp-bf16" and any("Megatron" in c for c in megatron.changes)
