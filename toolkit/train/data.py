"""Training data: text files -> memory-mapped token shards -> a deterministic, resumable stream.

    toolkit data prepare notes/*.txt --out data/notes     # writes train_*.bin, val_*.bin, index.json
    toolkit data prepare --demo --out data/demo            # the Python reference manual + this project

Tokens are bytes (vocabulary 256): no tokenizer download, any text in any language. Shards hold
uint16 tokens so that a larger vocabulary fits the same format. The sampler cuts each split into
windows of seq_len + 1 tokens and visits them in a seeded random order, epoch after epoch; the
sample taken at any point depends only on (seed, global sample number). Position in the stream is
therefore one integer, the step, and resuming from a checkpoint replays exactly the same batches,
on any number of data-parallel ranks: step s always consumes global samples s·G ... s·G + G - 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..specs.errors import SpecError

if TYPE_CHECKING:
    import torch

__all__ = ["prepare", "demo_sources", "ensure_demo_corpus", "TokenShards", "StepSampler", "make_loader", "BYTE_VOCAB"]

BYTE_VOCAB = 256
INDEX = "index.json"
SHARD_TOKENS = 1 << 22  # 4 Mi tokens (8 MiB) per shard file


def demo_sources() -> list[tuple[str, str]]:
    """(name, text) of the demo corpus: the Python language reference that ships with every CPython
    (`pydoc_data.topics`, ~0.7 MB of English prose and code), in sorted topic order."""
    from pydoc_data.topics import topics

    return [(f"pydoc_data.topics[{key}]", topics[key]) for key in sorted(topics)]


def _write_split(out: Path, split: str, tokens: np.ndarray) -> list[dict]:
    shards = []
    for number, start in enumerate(range(0, max(len(tokens), 1), SHARD_TOKENS)):
        chunk = tokens[start : start + SHARD_TOKENS]
        name = f"{split}_{number:05d}.bin"
        chunk.tofile(out / name)
        shards.append({"file": name, "tokens": int(len(chunk)), "sha256": hashlib.sha256(chunk.tobytes()).hexdigest()})
    return shards


def prepare(sources: list[tuple[str, str]], out_dir: str | Path, val_fraction: float = 0.05) -> dict:
    """Tokenise (name, text) pairs into shards under `out_dir`; the last `val_fraction` of every source
    goes to the held-out split, so both splits see every kind of text. Returns the index."""
    if not sources:
        raise SpecError("data prepare", "no input", "give at least one text file (or --demo)")
    if not 0.0 < val_fraction < 0.5:
        raise SpecError("--val-fraction", val_fraction, "must lie in (0, 0.5)")
    train, val = [], []
    for _name, text in sources:
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
        cut = len(ids) - int(len(ids) * val_fraction)
        train.append(ids[:cut])
        val.append(ids[cut:])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = {
        "format": 1,
        "tokenizer": "bytes",
        "vocab": BYTE_VOCAB,
        "dtype": "uint16",
        "sources": [name for name, _ in sources],
        "splits": {
            "train": _write_split(out, "train", np.concatenate(train)),
            "val": _write_split(out, "val", np.concatenate(val)),
        },
    }
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    tmp.replace(out / INDEX)  # the index appears last: a half-written folder has none
    return index


def read_sources(paths: list[str]) -> list[tuple[str, str]]:
    """Text files (or folders of *.txt / *.md files) as (name, text), with a clear error for a bad path."""
    sources = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".md") and p.is_file())
            if not files:
                raise SpecError("data prepare", raw, "folder holds no .txt or .md files")
        elif path.is_file():
            files = [path]
        else:
            raise SpecError("data prepare", raw, "no such file or folder")
        sources += [(str(f), f.read_text(encoding="utf-8", errors="replace")) for f in files]
    return sources


def ensure_demo_corpus(cache_dir: str | Path) -> Path:
    """The demo corpus under `cache_dir`, prepared on first use (under a second). Safe when several
    ranks ask at once: each writes a private folder and the first rename wins."""
    out = Path(cache_dir) / "demo-corpus"
    if not (out / INDEX).exists():
        private = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        prepare(demo_sources(), private)
        try:
            os.rename(private, out)
        except OSError:  # another rank got there first
            shutil.rmtree(private, ignore_errors=True)
    return out


class TokenShards:
    """One split of a prepared folder as windows of seq_len + 1 tokens (inputs and shifted targets).
    Windows never cross a shard boundary; item i is a LongTensor of seq_len + 1 tokens. (A map-style dataset
    for torch's DataLoader; this module imports torch only when tensors are made, so that a job is checked
    before anything imports torch.)"""

    def __init__(self, folder: str | Path, split: str, seq_len: int):
        folder = Path(folder)
        index_path = folder / INDEX
        if not index_path.exists():
            raise SpecError(
                "training.data",
                str(folder),
                "holds no index.json; make it with `toolkit data prepare FILES --out FOLDER`",
            )
        self.index = json.loads(index_path.read_text())
        self.vocab = int(self.index["vocab"])
        self.seq_len = seq_len
        self.shards, self.starts = [], [0]
        for shard in self.index["splits"][split]:
            path = folder / shard["file"]
            if not path.exists() or path.stat().st_size != 2 * shard["tokens"]:
                raise SpecError("training.data", str(path), "is missing or truncated; prepare the folder again")
            windows = max((shard["tokens"] - 1) // seq_len, 0)
            if windows:
                self.shards.append(np.memmap(path, dtype=np.uint16, mode="r"))
                self.starts.append(self.starts[-1] + windows)
        if len(self) == 0:
            raise SpecError(
                "training.data", str(folder), f"its {split} split is shorter than one sequence of {seq_len + 1} tokens"
            )

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> torch.Tensor:
        import torch

        shard = int(np.searchsorted(self.starts, i, side="right")) - 1
        offset = (i - self.starts[shard]) * self.seq_len
        return torch.from_numpy(self.shards[shard][offset : offset + self.seq_len + 1].astype(np.int64))


class StepSampler:
    """Yields, for steps [start_step, end_step), this rank's micro-batches as lists of window indices.

    Step s uses global samples s·G + k for k < G, G the global batch; micro-batch m of rank r takes
    k = m·(dp·mb) + r·mb + j. Global sample g is window perm_e[g mod n] of epoch e = g div n, where
    perm_e is a permutation seeded by (seed, e). Hence 1 rank and 2 ranks see the same samples per step."""

    def __init__(
        self,
        windows: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world: int,
        seed: int,
        start_step: int,
        end_step: int,
    ):
        self.windows, self.global_batch, self.micro_batch = windows, global_batch, micro_batch
        self.rank, self.world, self.seed = rank, world, seed
        self.start_step, self.end_step = start_step, end_step
        self.accum = global_batch // (micro_batch * world)
        self._perm_epoch, self._perm = -1, None

    def _window(self, g: int) -> int:
        epoch = g // self.windows
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
            self._perm_epoch = epoch
        return int(self._perm[g % self.windows])

    def __len__(self) -> int:
        return (self.end_step - self.start_step) * self.accum

    def __iter__(self):
        for step in range(self.start_step, self.end_step):
            for m in range(self.accum):
                base = step * self.global_batch + m * self.world * self.micro_batch + self.rank * self.micro_batch
                yield [self._window(base + j) for j in range(self.micro_batch)]


def make_loader(dataset: TokenShards, sampler: StepSampler, num_workers: int, prefetch: int):
    """A DataLoader of (inputs, targets) micro-batches in the sampler's order, prefetched by workers."""
    import torch

    extra = {"prefetch_factor": prefetch, "persistent_workers": False} if num_workers else {}
    # its own generator: creating the iterator must not draw from the global RNG that dropout uses,
    # or a resumed run would see different dropout masks than an uninterrupted one
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_collate,
        generator=torch.Generator().manual_seed(sampler.seed),
        **extra,
    )


def _collate(windows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    batch = torch.stack(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
