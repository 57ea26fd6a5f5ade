"""Token shards and the sampler: exact bytes on disk, the same samples per step on 1 or 2 ranks, resumable."""

import json

import numpy as np
import pytest

from toolkit.specs import SpecError
from toolkit.train.data import StepSampler, TokenShards, make_loader, prepare, read_sources


@pytest.fixture
def folder(tmp_path):
    texts = [("a", "hello world, " * 200), ("b", "ünïcödé text " * 150)]
    prepare(texts, tmp_path / "d", val_fraction=0.1)
    return tmp_path / "d", texts


def test_shards_hold_the_utf8_bytes_train_head_and_val_tail(folder):
    path, texts = folder
    index = json.loads((path / "index.json").read_text())
    train = np.fromfile(path / index["splits"]["train"][0]["file"], dtype=np.uint16)
    val = np.fromfile(path / index["splits"]["val"][0]["file"], dtype=np.uint16)
    raw = [t.encode() for _, t in texts]
    cuts = [len(r) - int(len(r) * 0.1) for r in raw]
    assert train.tobytes() == np.frombuffer(raw[0][: cuts[0]] + raw[1][: cuts[1]], np.uint8).astype(np.uint16).tobytes()
    assert bytes(val.astype(np.uint8)) == raw[0][cuts[0] :] + raw[1][cuts[1] :]
    assert index["vocab"] == 256


def test_window_is_inputs_plus_one_shifted_target(folder):
    data = TokenShards(folder[0], "train", seq_len=16)
    assert len(data) == (data.index["splits"]["train"][0]["tokens"] - 1) // 16
    w0, w1 = data[0], data[1]
    assert w0.shape == (17,) and w0[16] == w1[0]  # windows overlap by the one target token


def _steps(windows, world, start, end, seed=7, gb=8, mb=2):
    per_step = {}
    for rank in range(world):
        sampler = StepSampler(windows, gb, mb, rank, world, seed, start, end)
        batches = list(sampler)
        accum = gb // (mb * world)
        for s in range(end - start):
            per_step.setdefault(start + s, []).extend(i for b in batches[s * accum : (s + 1) * accum] for i in b)
    return {s: sorted(v) for s, v in per_step.items()}


def test_one_and_two_ranks_take_the_same_samples_each_step():
    assert _steps(50, 1, 0, 20) == _steps(50, 2, 0, 20)


def test_resuming_at_step_k_replays_the_tail_exactly():
    full = list(StepSampler(50, 8, 2, 0, 1, 7, 0, 20))
    tail = list(StepSampler(50, 8, 2, 0, 1, 7, 12, 20))
    assert tail == full[12 * 4 :]


def test_each_epoch_visits_every_window_once_in_a_new_order():
    flat = [i for b in StepSampler(40, 8, 2, 0, 1, 3, 0, 10) for i in b]  # 80 samples = 2 epochs
    assert sorted(flat[:40]) == list(range(40)) == sorted(flat[40:])
    assert flat[:40] != flat[40:]


def test_loader_with_workers_yields_the_sampler_order(folder):
    data = TokenShards(folder[0], "train", seq_len=16)
    sampler = StepSampler(len(data), 4, 2, 0, 1, 1, 0, 3)
    expected = [b for b in StepSampler(len(data), 4, 2, 0, 1, 1, 0, 3)]
    for (x, y), ids in zip(make_loader(data, sampler, num_workers=1, prefetch=2), expected):
        assert x.tolist() == [data[i][:-1].tolist() for i in ids]
        assert y.tolist() == [data[i][1:].tolist() for i in ids]


def test_bad_folders_are_named(tmp_path, folder):
    with pytest.raises(SpecError, match="no index.json"):
        TokenShards(tmp_path, "train", 16)
    with pytest.raises(SpecError, match="shorter than one sequence"):
        TokenShards(folder[0], "val", 100_000)
    shard = next(folder[0].glob("train_*.bin"))
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(SpecError, match="truncated"):
        TokenShards(folder[0], "train", 16)
    with pytest.raises(SpecError, match="no such file"):
        read_sources([str(tmp_path / "missing.txt")])
