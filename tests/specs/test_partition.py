"""`parallel.partition` splits a pipeline as DeepSpeed's PipelineModule does (toolkit.specs.partition), checked
against DeepSpeed itself: its PipelineModule over the runner's modules (record_ds_partition.py) and, at BLOOM's
size, its balancing function."""

import json
import sys
from pathlib import Path

import pytest

from toolkit.specs import Job, SpecError
from toolkit.specs.job import ModelSpec
from toolkit.specs.partition import balanced_parts, layer_list, partition_blocks

HERE = Path(__file__).parent


def test_blocks_per_stage_are_those_deepspeeds_pipeline_module_gives():
    """Against DeepSpeed's own boundaries, recorded by its PipelineModule over the runner's modules
    (ds_partition.json: `LOCAL_RANK=0 python tests/specs/record_ds_partition.py tests/specs/ds_partition.json`,
    DeepSpeed 0.19.8; importing DeepSpeed in a test costs 30-50 s, so the recording is kept)."""
    recorded = json.loads((HERE / "ds_partition.json").read_text())
    sys.path.insert(0, str(HERE))
    from record_ds_partition import CASES

    checked = 0
    for name, (fields, pp, method) in CASES.items():
        blocks = recorded[name]["blocks"]
        if min(blocks) < 1:  # DeepSpeed leaves a stage without a block: refused, with the reason
            with pytest.raises(SpecError, match="without a block"):
                partition_blocks(ModelSpec(**fields), pp, method)
        else:
            assert partition_blocks(ModelSpec(**fields), pp, method) == blocks, name
            checked += 1
    assert checked >= 5 and len({tuple(r["blocks"]) for r in recorded.values()}) >= 6  # the cases differ


def test_bloom_balances_as_deepspeed_does_at_full_size():
    """BLOOM-176B on 12 stages of tp 4: the parameters method, weights of 3.6e8 to 9e8 per entry."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.utils import partition_balanced

    bloom = ModelSpec(layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048, position="rope")
    weights = [n for _name, n in layer_list(bloom, tp=4)]
    assert balanced_parts(tuple(float(w) for w in weights), 12) == [int(p) for p in partition_balanced(weights, 12)]
    assert partition_blocks(bloom, 12, "type:transformer|embedding", tp=4) == [5] + [6] * 10 + [5]


def _job(**parallel):
    return Job.from_dict(
        {
            "model": {"layers": 10, "hidden": 64, "heads": 4, "vocab": 3000, "seq_len": 32},
            "parallel": {"pp": 4, "backend": "deepspeed", **parallel},
            "precision": {"mode": "mixed-bf16"},
        }
    ).resolve()


def test_a_job_with_a_partition_resolves_to_its_stage_layers_and_refuses_bad_ones():
    job, notes = _job(partition="type:transformer")
    assert job.parallel.stage_layers == (3, 3, 2, 2)
    assert Job.from_dict(job.to_dict()).resolve()[0].parallel == job.parallel  # a resolved job resolves again
    assert any("type:transformer partition" in note for note in notes)
    for fields, match in (
        ({"partition": "typo"}, "use one of"),
        ({"partition": "type:conv"}, "matches none"),
        ({"partition": "parameters", "stage_layers": [2, 3, 3, 2]}, "lists \\[2, 3, 3, 2\\]; keep one"),
        ({"partition": "uniform", "vpp": 2, "pp": 2}, "vpp 1"),
        ({"partition": "uniform"}, "without a block"),
    ):
        with pytest.raises(SpecError, match=match):
            _job(**fields)
