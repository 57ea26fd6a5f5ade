"""What a GPU holds beyond the tensors (toolkit.estimate.device), checked against published nvidia-smi readings,
the process groups torch really creates, and the planner's and doctor's use of it."""

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.gpu_memory_published import EMBEDDING_SLOTS, bloom, titan
from benchmarks.gpu_memory_published import _catalog as published_catalog
from toolkit.estimate.device import assumptions_for, comm_groups
from toolkit.estimate.report import estimate
from toolkit.plan import search
from toolkit.plan.doctor import diagnose_job
from toolkit.specs import Job
from toolkit.specs.catalog import load_catalog

GIB = 2**30

# BigScience's BLOOM-176B layout search on A100-80GB, nvidia-smi of the busiest node (bigscience
# train/tr11-176B-ml/chronicles-prequel.md): a slice of benchmarks/gpu_memory_published.py over depths,
# micro-batches, tp and the BF16 optimizer
BLOOM_MEASURED = [
    (bloom(14336, 72, 64, 4, 8, 12, 1), 29),
    (bloom(14336, 72, 64, 4, 8, 12, 8), 69),
    (bloom(14336, 72, 64, 24, 8, 2, 1, 2016), 65),
    (bloom(14336, 72, 64, 8, 2, 24, 1), 44),
    (bloom(14336, 70, 64, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"), 59),
]


@pytest.mark.parametrize("job, measured_gib", BLOOM_MEASURED, ids=[f"{m}GiB" for _, m in BLOOM_MEASURED])
def test_device_peak_is_within_the_benchmarks_max_of_what_nvidia_smi_showed(job, measured_gib):
    """docs/fit.md claims max 14.9 % over benchmarks/gpu_memory_published.py's 57 rows; these five read
    -3.4 % to +8.6 %, held to that claim."""
    est = estimate(Job.from_dict(job), published_catalog())["memory"]
    assert est["device_peak_bytes"] / GIB == pytest.approx(measured_gib, rel=0.15)
    assert est["fits"]
    # the tensors alone fall short of the reading: what the device holds beside them is not noise
    assert est["peak_bytes"] / GIB < measured_gib * 0.9


@pytest.mark.parametrize(
    "job, published",
    [
        (bloom(14336, 72, 64, 32, 2, 6, 1), "OOM"),
        (bloom(14336, 72, 64, 48, 8, 1, 1, 2016), "OOM"),
        (bloom(12288, 100, 64, 16, 4, 6, 1, partition=EMBEDDING_SLOTS, grads="fp32"), "OOM"),
        (bloom(14336, 72, 64, 24, 8, 2, 2, 2016), "76 GiB"),
    ],
)
def test_published_out_of_memory_layouts_do_not_fit_and_the_fullest_run_does(job, published):
    assert estimate(Job.from_dict(job), published_catalog())["memory"]["fits"] is (published != "OOM")


def test_torchtitans_405b_pipeline_fits_once_fsdp_gathers_float8():
    """torchtitan's Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, 1F1B, Float8 with FSDP's float8 all-gather: 82.5 GiB
    reserved on a 96 GB H100 (benchmarks/llama3_h100_202412_torchtitan.md, table 5). Gathering the stage's blocks
    in bf16 would call it out of memory."""
    layout = dict(preset="llama3-405b", seq=8192, mb=4, gbs=256, dp=8, tp=8, pp=8, fp8=True)
    float8 = estimate(Job.from_dict(titan(**layout, fp8_all_gather=True)), published_catalog())["memory"]
    bf16 = estimate(Job.from_dict(titan(**layout)), published_catalog())["memory"]
    assert float8["fits"] and not bf16["fits"]
    assert float8["reserved_peak_bytes"] / GIB == pytest.approx(82.5, rel=0.1)


def test_bf16_optimizer_adds_four_unsharded_bytes_per_parameter():
    """BigScience on DeepSpeed's BF16 optimizer: 'additional memory usage is 4 bytes x params and it's not
    sharded across gpus' (against the bf16-accumulating ZeRO-1 it replaced). ZeRO-1 also keeps its reduce bucket,
    which the BF16 optimizer does not; a 25 MB one here, not the rows' 1 GB default, leaves the gradients' term."""
    layout = dict(h=14336, layers=70, heads=64, dp=8, tp=4, pp=12, mb=2, partition=EMBEDDING_SLOTS)
    small_bucket = {"training": {"bucket_cap_mb": 25.0}}
    bf16_opt = estimate(Job.from_dict({**bloom(**layout, grads="fp32"), **small_bucket}))
    zero1 = estimate(Job.from_dict({**bloom(**layout), **small_bucket}))
    params = bf16_opt["model"]["params_per_device"]
    assert bf16_opt["memory"]["grads_bytes"] - zero1["memory"]["grads_bytes"] == pytest.approx(4 * params, rel=0.01)
    assert bf16_opt["memory"]["peak_bytes"] - zero1["memory"]["peak_bytes"] >= 4 * params * 0.99


def _held(**changes):
    job = Job.from_dict(
        {
            "model": {"preset": "llama2-7b"},
            "batch": {"micro_batch": 1},
            "parallel": {"zero": 3, **changes.pop("parallel", {})},
            "memory": {"recompute": "full", **changes.pop("memory", {})},
            "cluster": {"accelerator": changes.pop("accelerator", "A100-80GB"), "count": 8},
        }
    )
    return estimate(job)["memory"]


def test_each_term_moves_the_way_its_cause_does():
    plain, expandable = _held(), _held(memory={"expandable_segments": True})
    assert plain["peak_bytes"] < plain["reserved_peak_bytes"] < plain["device_peak_bytes"]
    assert plain["peak_bytes"] == expandable["peak_bytes"]
    assert plain["peak_bytes"] < expandable["reserved_peak_bytes"] < plain["reserved_peak_bytes"]
    two_d = _held(parallel={"tp": 2})
    assert two_d["device_terms"]["comm_bytes"] > plain["device_terms"]["comm_bytes"]
    tpu = _held(accelerator="TPU-v4")  # XLA plans its buffers: no allocator pool, no NCCL
    assert tpu["device_peak_bytes"] == tpu["reserved_peak_bytes"] == tpu["peak_bytes"]
    assert estimate(Job.from_dict({"model": {"preset": "gpt2"}}))["memory"]["device_peak_bytes"] is None


def test_process_groups_are_those_torch_creates_for_the_mesh():
    """A rank of a DeviceMesh belongs to the world group and one group per mesh dimension (a 1-D mesh over the
    world reuses the world group): counted on a fake 8-rank process group, one rank traced."""
    meshes = [
        ((8,), ("dp",), {"dp": 8}),
        ((4, 2), ("dp", "tp"), {"dp": 4, "tp": 2}),
        ((2, 2, 2), ("dp", "cp", "tp"), {"dp": 2, "cp": 2, "tp": 2}),
    ]
    script = textwrap.dedent("""
        import sys
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
        for shape, names in eval(sys.argv[1]):
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            print(len({id(mesh.get_group(n)) for n in names} | {id(dist.group.WORLD)}))
            dist.destroy_process_group()
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, repr([m[:2] for m in meshes])], capture_output=True, text=True, check=True
    ).stdout.split()
    for (_shape, _names, layout), torch_count in zip(meshes, map(int, out), strict=True):
        job = Job.from_dict(
            {"model": {"preset": "llama2-7b"}, "parallel": layout, "cluster": {"accelerator": "A100-80GB", "count": 8}}
        ).resolve()[0]
        # (with cp the gradients reduce over dp × cp, which takes the place of the mesh's plain dp group)
        assert comm_groups(job)[0] == torch_count, (layout, torch_count)


def test_deepspeeds_pipeline_engine_communicates_on_the_groups_counted():
    """A first-stage rank of DeepSpeed's pipeline engine (dp 2 x tp 2 x pp 2, tied embeddings, bf16 ZeRO-1, clipping)
    runs collectives on six groups, recorded on 8 gloo ranks by record_ds_groups.py (ds_groups.json: `torchrun
    --nproc-per-node 8 tests/estimate/record_ds_groups.py tests/estimate/ds_groups.json`, DeepSpeed 0.19.8; 8 ranks
    importing DeepSpeed take about a minute of make test's budget, so the recording is kept): Megatron's
    tensor-parallel group and DeepSpeed's own slice group over the same ranks, the replica's model-parallel group,
    dp, the tied embedding's group and the pipe group (the last two over the same two ranks). The estimate counts
    those and the world group, which Megatron-DeepSpeed's training loop barriers on (megatron/training.py,
    print_datetime)."""
    recorded = json.loads(Path(__file__).with_name("ds_groups.json").read_text())
    assert sorted(map(len, recorded)) == [2, 2, 2, 2, 2, 4]
    job = Job.from_dict(
        {
            "model": {"layers": 4, "hidden": 64, "heads": 4, "vocab": 64, "seq_len": 8},
            "precision": {"mode": "mixed-bf16"},
            "batch": {"micro_batch": 1, "global_batch": 4},
            "parallel": {"dp": 2, "tp": 2, "pp": 2, "zero": 1, "backend": "deepspeed"},
            "cluster": {"accelerator": "A100-80GB", "count": 8},
        }
    ).resolve()[0]
    assert comm_groups(job)[0] == len(recorded) + 1


def test_nccl_opens_the_channels_its_logs_show_and_a_communicator_holds_what_was_measured():
    """Channels: 24 on 8 x A100 SXM4 (NVIDIA/nccl-tests#100's log, `Channel 23/24`), 32 on 8 x H100 (NVIDIA/nccl#1685);
    two over PCIe (NVIDIA/nccl-tests#228). One communicator on A100: NVIDIA/nccl#964 measured 544 MB (2 ranks) and
    688 MB (4 ranks) on rank 0 of 4 x A100 with NVLink, through torch, after one all-reduce. The model's ring and tree
    connections give less than either, by under a third (the 16 channels it assumed before gave 308 MB, 43 % under
    the smaller)."""
    cat = load_catalog()
    channels = {
        name: assumptions_for(cat.accelerator(name)).comm_channels
        for name in ("A100-80GB", "A100-40GB", "H100-SXM", "RTX-4090")
    }
    assert channels == {"A100-80GB": 24, "A100-40GB": 24, "H100-SXM": 32, "RTX-4090": 2}
    one = assumptions_for(cat.accelerator("A100-80GB")).comm_group_bytes
    assert 688e6 * 2 / 3 < one < 544e6


def test_pipeline_ranks_talk_to_their_neighbours():
    def peers(pp, vpp=1):
        job = Job.from_dict(
            {
                "model": {"preset": "llama2-7b"},
                "parallel": {"pp": pp, "vpp": vpp},
                "cluster": {"accelerator": "A100-80GB", "count": pp},
            }
        ).resolve()[0]
        return int(comm_groups(job)[1])

    assert (peers(1), peers(2), peers(4), peers(2, vpp=2)) == (0, 1, 2, 2)


def test_a_job_that_fits_only_without_fragmentation_gets_expandable_segments_first():
    cat = load_catalog()
    base = Job.from_dict(
        {
            "model": {"preset": "llama2-7b"},
            "batch": {"micro_batch": 2},
            "parallel": {"zero": 3},
            "memory": {"recompute": "selective"},
            "cluster": {"accelerator": "A100-80GB", "count": 8},
        }
    )
    plain = estimate(base, cat)["memory"]
    with_segments = estimate(base.replace(memory=dataclasses.replace(base.memory, expandable_segments=True)), cat)[
        "memory"
    ]
    between = (plain["device_peak_bytes"] + with_segments["device_peak_bytes"]) / 2
    tight = base.replace(memory=dataclasses.replace(base.memory, headroom_fraction=1 - between / 80 / GIB))
    report = diagnose_job(tight, cat)
    assert not report["fits"]
    assert report["fixes"][0]["change"].startswith("expandable segments") and report["fixes"][0]["fits"]


def test_the_planner_lists_only_layouts_whose_device_peak_fits():
    job = Job.from_dict({"model": {"preset": "llama2-7b"}, "tokens": 1e9})
    result = search(job, load_catalog(), gpus=(8, "A100-80GB"), top=5)
    assert result["plans"]
    for plan in result["plans"]:
        assert plan["peak_bytes"] < plan["reserved_peak_bytes"] < plan["device_peak_bytes"] <= plan["usable_bytes"]
    best = result["plans"][0]
    lay = best["layout"]
    single = estimate(
        Job.from_dict(
            {
                "model": {"preset": "llama2-7b"},
                "tokens": 1e9,
                "batch": {"micro_batch": lay["micro_batch"], "global_batch": best["global_batch"]},
                "parallel": {k: lay[k] for k in ("dp", "tp", "pp", "vpp", "sp", "zero", "offload")},
                "memory": {"recompute": lay["recompute"]},
                "cluster": {"accelerator": "A100-80GB", "count": 8},
            }
        )
    )
    assert single["memory"]["device_peak_bytes"] == pytest.approx(best["device_peak_bytes"], rel=1e-9)
