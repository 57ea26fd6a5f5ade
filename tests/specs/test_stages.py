"""Uneven pipeline stages and context parallelism: the split rule against the runs that used it, the one-line
refusals, and the planner choosing them where they help."""

import dataclasses

import numpy as np
import pytest

from toolkit.cli import main
from toolkit.plan import search
from toolkit.specs import Job, load_catalog
from toolkit.specs.stages import chunk_layers, rank_layers, stage_layer_counts, uneven_fits


def test_llama3_and_bloom_splits():
    """Llama 3 405B: 126 layers, pp 16 × vpp 2, "one Transformer layer fewer on the first and the last stage"
    (Dubey et al. 2024, §3.3.2). BLOOM-176B: 70 blocks on 12 stages with its two embeddings counted as layers
    ('type:transformer|embedding', tr11-176B-ml.slurm), so 6 units a stage and 5 blocks on the first and last."""
    assert rank_layers(126, 16, 2) == [7] + [8] * 14 + [7]
    assert chunk_layers(126, 16, 2) == [3] + [4] * 30 + [3]
    assert rank_layers(70, 12) == [5] + [6] * 10 + [5]
    assert rank_layers(96, 8) == [12] * 8  # equal stages stay equal
    assert rank_layers(31, 4) == [8, 8, 8, 7]  # one short: the last gives it up


def test_grid_counts_equal_the_listed_split():
    pp, vpp = np.array([2, 3, 4, 5, 6, 7, 8, 16]), np.array([1, 2, 1, 2, 1, 2, 1, 1])
    layers = 30
    first, middle, last = stage_layer_counts(layers, pp, vpp)
    for i in np.flatnonzero(uneven_fits(layers, pp, vpp)):
        ranks = rank_layers(layers, int(pp[i]), int(vpp[i]))
        assert (first[i], last[i]) == (ranks[0], ranks[-1]) and sum(ranks) == layers
        assert middle[i] == max(ranks[1:-1] or [ranks[0]])


@pytest.mark.parametrize(
    "argv, expect",
    [
        (
            ["--pp", "4", "--stage-layers", "3,4,4"],
            "needs pp × vpp = 4 entries of at least 1 layer summing to model.layers = 12; for example [3, 3, 3, 3]",
        ),
        (["--pp", "16"], "12 layers on pp × vpp = 16 chunks leave a chunk without a layer, even with the embedding"),
        (["--cp", "5"], "2 × cp must divide model.seq_len = 1024"),
        (["--cp", "16"], "tp × pp × cp = 16 does not divide cluster.count = 8"),
    ],
)
def test_bad_split_or_cp_is_one_line(capsys, argv, expect):
    assert main(["estimate", "--model", "gpt2", "--gpus", "8xA100-80GB", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_a_listed_split_is_estimated_as_given(capsys):
    assert main(["estimate", "--model", "gpt2", "--gpus", "4xA100-80GB", "--pp", "4", "--stage-layers", "2,4,4,2"]) == 0
    assert "pipeline ranks hold 2, 4, 4, 2 layers" in capsys.readouterr().out


def test_the_planner_uses_cp_where_sequences_are_long():
    """Llama 3 405B at 128K tokens, 128 sequences on 16,384 H100s (its long-context stage ran cp 16): the batch
    does not split over every device, yet the search runs, and every top plan splits sequences; at 8K the planner
    does not try cp at all, and it plans 126 layers on 16 stages."""
    catalog = load_catalog()
    long = Job.from_dict(
        {
            "model": {"preset": "llama3-405b", "seq_len": 131072},
            "precision": {"mode": "mixed-bf16"},
            "batch": {"global_batch": 128},
            "tokens": 1e12,
        },
        catalog,
    )
    plans = search(long, catalog, gpus=(16384, "H100-SXM"), top=5)["plans"]
    assert plans and all(p["layout"]["cp"] > 1 for p in plans)
    short = Job.from_dict(
        {"model": {"preset": "llama3-405b"}, "precision": {"mode": "mixed-bf16"}, "tokens": 1e12}, catalog
    )
    plans = search(short, catalog, gpus=(16384, "H100-SXM"), top=5, fixed={"micro_batch"})["plans"]
    assert plans and all(p["layout"]["cp"] == 1 for p in plans)
    uneven = short.replace(parallel=dataclasses.replace(short.parallel, pp=16))  # 126 layers: 8 on 14 ranks, 7 on 2
    plans = search(uneven, catalog, gpus=(16384, "H100-SXM"), top=5, fixed={"pp", "micro_batch"})["plans"]
    assert plans and all(p["layout"]["pp"] == 16 for p in plans)
    for plan in plans:  # its top plans' pipelines are run through the schedule simulator too
        pipe = plan["pipeline"]
        assert pipe["simulated_s"] == pytest.approx(pipe["closed_form_s"], rel=0.03) and 0 < pipe["bubble_fraction"] < 1


def test_deepseek_v3s_61_layers_take_megatrons_layout_on_32_chunks():
    """pp 8 × vpp 4 over 61 layers: the embedding and the loss count as a layer each (Megatron-Core's accounting),
    the last chunk holds the loss alone, every rank holds at least one layer, and the string Megatron would be
    given for it parses back to the same chunks."""
    from toolkit.specs.pipeline_layout import layout_string, parse_layout
    from toolkit.specs.stages import chunk_layers, rank_layers

    chunks = chunk_layers(61, 8, 4)
    assert chunks == [1] + [2] * 30 + [0] and sum(chunks) == 61
    assert min(rank_layers(61, 8, 4)) >= 1
    assert layout_string(chunks) == "Et|(tt|)*30,L"
    assert parse_layout("Et|(tt|)*30,L", 61, 32) == (chunks, 0)


def test_megatrons_layout_string_is_read_and_bad_ones_refused_in_one_line(capsys):
    """A layout as Megatron-Core's docs write them (DeepSeek-V3's with its MTP layer), and what is wrong with a
    bad one named."""
    from toolkit.specs.pipeline_layout import parse_layout

    counts, mtp = parse_layout("Et*3|(tt|)*29,m|L", 61, 32)
    assert (counts[0], counts[1], counts[-2], counts[-1], mtp) == (3, 2, 0, 0, 1)
    argv = ["estimate", "--model", "gpt2", "--gpus", "8xA100-80GB", "--pp", "4"]
    assert main([*argv, "--pipeline-model-parallel-layout", "Ett|ttt|ttt|ttttL"]) == 0
    assert "pipeline ranks hold 2, 3, 3, 4 layers" in capsys.readouterr().out
    assert main([*argv, "--pipeline-layout", "Ett|ttt|ttt|tttL"]) == 2
    assert "holds 11 transformer layers; the model has 12" in capsys.readouterr().err
