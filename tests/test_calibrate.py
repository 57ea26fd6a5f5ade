"""`toolkit calibrate`: a profile of this machine that the catalog takes, and a run compared with the step-time
model on it. How close the model comes is benchmarks/steptime_accuracy.py's to say, on a quiet machine: beside
another test worker, two threads per op on two busy cores measure element-wise kernels 100x slower than alone.
The tests that time a cost against a reference are marked `quiet`, and `make test` runs them after the rest."""

import dataclasses
import statistics

import pytest
import yaml

from toolkit.cli import main
from toolkit.estimate import estimate
from toolkit.estimate.hardware import hardware_for
from toolkit.specs import Job, load_catalog
from toolkit.trace.report import compare_run

SMALL = {
    "model": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
    "batch": {"micro_batch": 2, "global_batch": 8},
    "precision": {"mode": "fp32"},
    "training": {"steps": 8, "warmup_steps": 1, "num_workers": 0, "checkpoint_every": 0},
}


def test_a_calibrated_profile_models_a_real_run(tmp_path, capfd, monkeypatch):
    """A run calibrated, then compared. Calibrate measures CPU cores over gloo: on a host with GPUs (here one that
    says it has them) it says so and its CPU row stays a CPU's (no compute hidden behind communication)."""
    import torch

    from toolkit.train.data import ensure_demo_corpus
    from toolkit.train.launch import prepare_run
    from toolkit.train.loop import run_training

    run, profile = tmp_path / "run", tmp_path / "profile.yaml"
    data = dict(SMALL, training=dict(SMALL["training"], data=str(ensure_demo_corpus(tmp_path / "cache"))))
    run_training(prepare_run(Job.from_dict(data), run, 1), run, progress=False)  # one rank, in this process
    capfd.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        assert main(["calibrate", "--config", str(run / "job.yaml"), "--out", str(profile)]) == 0
    out, err = capfd.readouterr()  # (the file descriptors: the profiler's own lines would show here)
    assert "matmuls" in out and "NCCL collectives are not calibrated yet" in err
    assert len(out.strip().splitlines()) == 2 and len(err.strip().splitlines()) == 1, (out, err)
    row = yaml.safe_load(profile.read_text())["accelerators"][0]
    assert row["source"].startswith("measured on ") and row["as_of"]
    catalog = load_catalog(profile)  # a catalog row like any other, with its figures' source
    job, _ = Job.from_yaml(run / "job.yaml").resolve(catalog)
    hw = hardware_for(job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=1)), catalog)
    assert hw.assumptions.gemm_fraction == 1.0 and hw.assumptions.comm_overlaps_compute is False
    assert 1e6 < hw.peak_flops < 1e13 and hw.assumptions.op_overhead_s > 0, row  # (a loaded CPU measures low)
    step = compare_run(run, [profile], trace=False)["time"]["step_s"]
    modelled = estimate(job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=1)), catalog)
    assert step["measured"] > 0 and step["estimate"] == pytest.approx(modelled["time"]["step_s"]), (step, row)
    assert step["error"] == pytest.approx((step["estimate"] - step["measured"]) / step["measured"])


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--nproc", "0", "--out", "p.yaml"], "--nproc = 0: must be 1 or more"),
        (["--out", "/no/such/folder/p.yaml"], "its folder /no/such/folder does not exist"),
        (["--config", "missing.yaml", "--out", "p.yaml"], "missing.yaml"),
    ],
)
def test_bad_calibrate_input_is_one_line(capsys, argv, expect):
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


@pytest.mark.quiet
def test_a_tensor_parallel_job_calibrates_its_collectives_on_two_ranks(tmp_path):
    """On 2 gloo ranks a tp 2 job's profile carries the measured fixed cost of a tensor-parallel collective (one of
    the job's blocks under the runner's DTensor plan, against its share unparallelized), and the model prices the
    job's collectives with it."""
    import dataclasses

    from toolkit.calibrate import calibrate
    from toolkit.estimate.steptime import step_time

    job = Job.from_dict(dict(SMALL, parallel={"tp": 2}))
    profile = tmp_path / "profile.yaml"
    row = calibrate(job, 2, profile)["accelerators"][0]
    fixed_s = row["assumptions"]["tp_collective_s"]
    assert 1e-6 < fixed_s < 1.0 and row["link_bw_bytes_per_s"] > 0, row
    catalog = load_catalog(profile)
    placed, _ = job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=2)).resolve(catalog)
    hw = hardware_for(placed, catalog)
    slower = dataclasses.replace(hw.assumptions, tp_collective_s=2 * fixed_s)  # the measured figure is the one used
    assert step_time(placed, hw, slower).tp_comm_s > step_time(placed, hw).tp_comm_s > 0


@pytest.mark.quiet
def test_an_fsdp2_job_calibrates_its_collectives_on_two_ranks(tmp_path):
    """On 2 gloo ranks a ZeRO-2 (FSDP2) job's profile carries the measured cost of one FSDP2 collective beyond its
    bytes (the job's blocks sharded as the runner shards them, against the same blocks whole), and the model's
    gathers and reduce-scatters pay it: doubling it lengthens the step's data-parallel communication."""
    import dataclasses

    from toolkit.calibrate import calibrate
    from toolkit.estimate.steptime import step_time

    job = Job.from_dict(dict(SMALL, parallel={"zero": 2}))
    profile = tmp_path / "profile.yaml"
    row = calibrate(job, 2, profile)["accelerators"][0]
    fixed_s = row["assumptions"]["fsdp_collective_s"]
    # (a tensor-parallel collective's cost is measured too, as for every job: one profile prices every layout)
    assert 1e-6 < fixed_s < 1.0 and row["assumptions"]["tp_collective_s"] > 0, row
    catalog = load_catalog(profile)
    placed, _ = job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=2)).resolve(catalog)
    hw = hardware_for(placed, catalog)
    slower = dataclasses.replace(hw.assumptions, fsdp_collective_s=2 * fixed_s)
    assert step_time(placed, hw, slower).dp_comm_exposed_s > step_time(placed, hw).dp_comm_exposed_s > 0


@pytest.mark.quiet
def test_a_one_process_zero3_job_calibrates_what_fsdp2_costs_over_one_rank(tmp_path):
    """ZeRO-3 in one process is FSDP2 over one rank (toolkit.program.parallelize): nothing moves, yet every shard is
    copied out and every gradient through its reduce-scatter buffers, under FSDP2's hooks. Calibrate measures that
    per collective on a one-rank group it leaves behind it, and the one-rank step pays it (it had modelled the
    README's small GPT's ZeRO-3 step at 0.25 s against 0.42 s measured; benchmarks/steptime_accuracy.py judges
    the new figure)."""
    import torch

    from toolkit.calibrate import calibrate
    from toolkit.estimate.steptime import step_time

    job = Job.from_dict(dict(SMALL, parallel={"zero": 3}))
    profile = tmp_path / "profile.yaml"
    row = calibrate(job, 1, profile)["accelerators"][0]
    assert not torch.distributed.is_initialized()
    fixed_s = row["assumptions"]["fsdp_collective_s"]
    assert 1e-6 < fixed_s < 1.0, row
    catalog = load_catalog(profile)
    placed, _ = job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=1)).resolve(catalog)
    plain, _ = Job.from_dict(SMALL).replace(cluster=placed.cluster).resolve(catalog)
    hw = hardware_for(placed, catalog)
    sharded_s, plain_s = step_time(placed, hw), step_time(plain, hw)
    collectives = 3 * placed.model.layers * (placed.grad_accum or 1)  # two gathers and a reduce-scatter a block
    assert sharded_s.dp_comm_exposed_s >= collectives * fixed_s and plain_s.dp_comm_exposed_s == 0


def test_in_model_matmul_flops_are_the_models_linear_layers_counted_by_torch():
    """The in-model rate's FLOPs come from the profiler's recorded shapes: over one training step of the job's
    model they must be forward and backward (3 products) of every linear layer torch holds, 2·tokens·in·out each,
    the tied head included; and attention's from the fused kernel's shapes, 3·2·2·b·h·s²·d/2 (causal)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from toolkit.calibrate.profile import kernel_totals
    from toolkit.program.model import GPT

    job = Job.from_dict(SMALL)
    model = GPT(job.model)
    tokens = torch.randint(0, job.model.vocab, (job.batch.micro_batch, job.model.seq_len))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(tokens, tokens).backward()
    totals = kernel_totals(prof)
    n = tokens.numel()
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    assert totals["matmul_flops"] == 3 * 2 * n * linear, totals
    m = job.model
    assert (
        totals["attention_flops"]
        == m.layers * 3 * 2 * 2 * job.batch.micro_batch * m.heads * m.seq_len**2 * m.head_dim_ / 2
    ), totals
    assert totals["matmul_s"] > 0 and totals["attention_s"] > 0


@pytest.mark.slow
def test_an_encoder_job_calibrates_its_matmuls_at_its_shapes():
    """The runner's GPT builds decoders only: an encoder job's rates come from its shapes alone, not a crash."""
    from toolkit.calibrate.profile import job_shapes, measure_rank

    job = Job.from_dict(dict(SMALL, model=dict(SMALL["model"], encoder=True))).resolve()[0]
    figures = measure_rank(job, 0, 1)
    assert figures["in_model"] is False and figures["shapes"] == [list(s) for s in job_shapes(job)]
    assert figures["matmul_flops"][0] > 0 and figures["gemm_half_size"] >= 0 and figures["attention_flops"] > 0


@pytest.mark.quiet
def test_a_thin_dimension_slows_a_product_as_the_fitted_half_size_says():
    """calibrate fits gemm_half_size to the job's products timed with their rows halved and doubled. The same size
    must predict products it was not fitted to, thin in their inner or outer dimension (32 and 64 wide against
    256), within 20 % of torch's timings of them, taken in the same rounds. Without the term every shape would run
    at one rate: a 32-wide product at the rate of a 256-wide one, nearly twice what a CPU measures."""
    import torch

    from toolkit.calibrate.kernels import half_size, matmul_flops, thin_shapes
    from toolkit.calibrate.profile import job_shapes
    from toolkit.estimate.steptime import thin_factor

    around = thin_shapes(job_shapes(Job.from_dict(SMALL).resolve()[0]))
    probes = [(256, 256, 256), (256, 32, 256), (256, 256, 64)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (beside another test worker, two threads a product on two cores thrash)
    try:
        rates = matmul_flops(around + probes, torch.float32, rounds=5)
    finally:
        torch.set_num_threads(threads)
    _rate, half = half_size(around, rates[: len(around)])
    square = rates[len(around)]
    for shape, rate in zip(probes[1:], rates[len(around) + 1 :]):
        predicted = thin_factor(*probes[0], half) / thin_factor(*shape, half)
        assert predicted == pytest.approx(rate / square, rel=0.2), (shape, half, rate / square)


@pytest.mark.parametrize("layers, attention", [(2, "flash"), (8, "flash"), (4, "eager")])
def test_op_units_scale_as_the_dispatcher_counts_tensor_operations(layers, attention):
    """The step-time model counts a micro-batch's fixed costs in op units; calibrate prices a unit by the tensor
    operations it stands for in the job's own model (about 3 for the runner's GPT: a linear's forward is a
    transpose and a product, its backward two products, a sum and an add). Counted on 4 layers, the units must
    then give what torch's dispatcher counts on 2 and 8 layers, and with an eager attention core (a third more
    operations a block): the per-layer count is the model's, not a fit. (Calibrate counts on up to 4 layers, as
    here.)"""
    import dataclasses

    import torch

    from toolkit.calibrate.kernels import dispatched_ops, ops_per_unit, rank_spec
    from toolkit.estimate.steptime import op_units
    from toolkit.program.model import GPT

    job = Job.from_dict(dict(SMALL, model=dict(SMALL["model"], layers=4))).resolve()[0]
    per_unit = ops_per_unit(job)
    assert 2 < per_unit < 6
    deeper = job.replace(
        model=dataclasses.replace(job.model, layers=layers), memory=dataclasses.replace(job.memory, attention=attention)
    )
    spec = dataclasses.replace(rank_spec(deeper), layers=layers)
    model = GPT(spec, attention=deeper.memory.attention)
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len))

    def step():
        model(tokens, tokens).backward()

    step()
    counted = dispatched_ops(step)
    assert float(op_units(deeper, layers, True)) * per_unit == pytest.approx(counted, rel=0.06)


@pytest.mark.quiet
def test_per_op_recompute_pays_for_its_dispatch_mode_as_torchs_profiler_sees_it():
    """A per-op-recompute region runs each tensor operation through torch's selective-checkpoint dispatch mode,
    in forward and in recompute; calibrate times the job's block checkpointed with and without that mode. Torch's
    profiler, an independent instrument, records the mode's own time (`PythonDispatchMode`) in the runner's
    per-op policy: the calibrated cost must be of its size (the profiler adds its own cost to each event, so it
    reads high; here 1.04 ms calibrated against 0.88 ms profiled), and the estimate charges it once per block
    per micro-batch under selective-op only."""
    from torch.profiler import ProfilerActivity, profile

    from toolkit.calibrate.kernels import block_run, rank_spec, selective_op_overhead_s
    from toolkit.estimate.hardware import Assumptions
    from toolkit.estimate.overhead import fixed_costs_s
    from toolkit.launch.determinism import pinned
    from toolkit.program.model import _every_other_matmul

    job = Job.from_dict(dict(SMALL, model=dict(SMALL["model"], hidden=256))).resolve()[0]
    with pinned(1, "cpu"):
        measured = selective_op_overhead_s(job)
        run, build = block_run(job, job.model.seq_len)
        block = build(rank_spec(job))
        run(block, checkpointed=True, context_fn=_every_other_matmul)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                run(block, checkpointed=True, context_fn=_every_other_matmul)
    mode_s = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "PythonDispatchMode") / 5e6
    assert 0.2 * mode_s < measured < 2 * mode_s, (measured, mode_s)
    a = Assumptions(selective_op_overhead_s=measured)
    per_op = job.replace(memory=dataclasses.replace(job.memory, recompute="selective-op"))
    full = job.replace(memory=dataclasses.replace(job.memory, recompute="full"))
    charged = fixed_costs_s(per_op, a, 2, 4, True) - fixed_costs_s(full, Assumptions(), 2, 4, True)
    assert charged == pytest.approx(2 * 4 * measured)


@pytest.mark.quiet
def test_a_checkpointed_region_costs_at_least_what_torchs_profiler_sees_outside_its_kernels():
    """torch's checkpoint runs Python around every region: its saved-tensor hooks pack and unpack, and the unpack
    reruns the forward with its own frames. Torch's profiler, an independent instrument, sees that work as time
    outside any tensor operation (self time of autograd's nodes and of other non-aten events), checkpointed
    against plain. Calibrate's cost, timed on the job's block, must cover it and stay of its size (the profiler
    does not see the rerun graph's recording inside the kernels' own time, so the cost reads higher: here
    0.6-1.5 ms against 0.5-0.7 ms). Tiny regions fitted and scaled by saved tensors, the earlier method, gave
    0.34 ms, half of what the profiler sees, and fail."""
    from torch.profiler import ProfilerActivity, profile

    from toolkit.calibrate.kernels import checkpoint_overhead_s, region_runs
    from toolkit.launch.determinism import pinned

    job = Job.from_dict(
        dict(SMALL, model=dict(SMALL["model"], hidden=256, heads=8, seq_len=128), memory={"recompute": "full"})
    ).resolve()[0]  # the README's small GPT's block
    outside_s = {"checkpointed": [], "plain": []}
    with pinned(1, "cpu"):
        measured = checkpoint_overhead_s(job)
        runs = region_runs(job)
        for name in outside_s:
            runs[name]()
        for _ in range(9):  # paired and alternating, as calibrate times them: a loaded machine's moments
            for name in outside_s:  # fall on both calls of a pair (five of one, then five of the other, once
                with profile(activities=[ProfilerActivity.CPU]) as prof:  # read -0.5 ms under CI's load)
                    runs[name]()
                outside_s[name].append(
                    sum(e.self_cpu_time_total for e in prof.key_averages() if not e.key.startswith("aten::")) / 1e6
                )
    hooks_s = statistics.median(c - p for c, p in zip(outside_s["checkpointed"], outside_s["plain"]))
    assert 0.8 * hooks_s < measured < 4 * hooks_s, (measured, hooks_s)


def test_a_rank_measuring_for_calibrate_prints_nothing():
    """calibrate's ranks drop their own output at the file-descriptor level (library warnings, the profiler's stages
    written by C++), so the console keeps calibrate's lines only."""
    import subprocess
    import sys

    script = (
        "import os, warnings\n"
        "from toolkit.trace.ranks import quiet_output\n"
        "with quiet_output():\n"
        "    print('python stdout', flush=True); warnings.warn('a library warning')\n"
        "    os.write(1, b'C stdout'); os.write(2, b'C stderr')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
