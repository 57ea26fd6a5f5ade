"""Training data: text files -> memory-mapped token shards -> a deterministic, resumable stream.

    toolkit data prepare notes/*.txt --out data/notes     # writes train_*.bin, val_*.bin, index.json
    toolkit data prepare --demo --out data/demo            # the Python reference manual + this project
    toolkit data prepare a.jsonl b.parquet --tokenizer models/mine --mix 0.7,0.3 --out data/mix

Tokens are bytes (vocabulary 256) unless a Hugging Face tokenizer is given (toolkit.train.documents reads the
inputs and packs documents with its end-of-document id). Shards hold uint16 tokens, uint32 past 65,536 ids. The sampler cuts each split into
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
from .documents import Tokenizer, load_tokenizer, mix, pack, read_documents

if TYPE_CHECKING:
    import torch

__all__ = [
    "prepare",
    "demo_sources",
    "ensure_demo_corpus",
    "model_tokenizer",
    "TokenShards",
    "StepSampler",
    "make_loader",
    "BYTE_VOCAB",
]

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


def prepare(
    sources: list[tuple[str, str | list[str]]],
    out_dir: str | Path,
    val_fraction: float = 0.05,
    tokenizer: Tokenizer | None = None,
    weights: list[float] | None = None,
) -> dict:
    """Tokenise (name, text or documents) pairs into shards under `out_dir`: each source's documents packed with the
    tokenizer's end-of-document id between them (toolkit.train.documents; bytes by default); the last
    `val_fraction` of every source goes to the held-out split, so both splits see every kind of text; with
    `weights`, the sources' training tokens are mixed in those shares. Returns the index."""
    if not sources:
        raise SpecError("data prepare", "no input", "give at least one text file (or --demo)")
    if not 0.0 < val_fraction < 0.5:
        raise SpecError("--val-fraction", val_fraction, "must lie in (0, 0.5)")
    tok = tokenizer or load_tokenizer("bytes")
    dtype = np.uint16 if tok.vocab <= 2**16 else np.uint32
    train, val = [], []
    for _name, docs in sources:
        ids = pack([docs] if isinstance(docs, str) else docs, tok)
        cut = len(ids) - int(len(ids) * val_fraction)
        train.append(ids[:cut])
        val.append(ids[cut:])
    if weights:
        train = mix(train, weights)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = {
        "format": 1,
        "tokenizer": tok.name,
        "vocab": tok.vocab,
        "eos_id": tok.eos_id,
        "dtype": np.dtype(dtype).name,
        "sources": [name for name, _ in sources],
        "weights": weights,
        "splits": {
            "train": _write_split(out, "train", np.concatenate(train).astype(dtype)),
            "val": _write_split(out, "val", np.concatenate(val).astype(dtype)),
        },
    }
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    tmp.replace(out / INDEX)  # the index appears last: a half-written folder has none
    return index


def read_sources(paths: list[str], field: str = "text") -> list[tuple[str, list[str]]]:
    """Each path as one source of documents (toolkit.train.documents.read_documents: text, a folder of .txt/.md,
    jsonl, parquet, a saved dataset), with a clear error for a bad path or field."""
    return [(raw, list(read_documents(raw, field))) for raw in paths]


def model_tokenizer(job) -> str | None:
    """The tokenizer of the weights a job starts from: its training.init_from folder's tokenizer.json (a Hugging
    Face model folder), else None (bytes)."""
    source = job.training.init_from
    return source if source and (Path(source) / "tokenizer.json").is_file() else None


def ensure_demo_corpus(cache_dir: str | Path, tokenizer: str | None = None) -> Path:
    """The demo corpus under `cache_dir`, prepared on first use (under a second for bytes), with `tokenizer` where
    given (one folder per tokenizer file). Safe when several ranks ask at once: each writes a private folder and the
    first rename wins."""
    name = "demo-corpus"
    if tokenizer is not None:
        text = (Path(tokenizer) / "tokenizer.json").read_bytes()
        name += "-" + hashlib.sha256(text).hexdigest()[:12]
    out = Path(cache_dir) / name
    if not (out / INDEX).exists():
        private = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        prepare(demo_sources(), private, tokenizer=load_tokenizer(tokenizer))
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
        dtype = np.dtype(self.index.get("dtype", "uint16"))
        self.seq_len = seq_len
        self.shards, self.starts = [], [0]
        for shard in self.index["splits"][split]:
            path = folder / shard["file"]
            if not path.exists() or path.stat().st_size != dtype.itemsize * shard["tokens"]:
                raise SpecError("training.data", str(path), "is missing or truncated; prepare the folder again")
            windows = max((shard["tokens"] - 1) // seq_len, 0)
            if windows:
                self.shards.append(np.memmap(path, dtype=dtype, mode="r"))
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
        worker_init_fn=_leave_sigterm_to_the_rank,
        **extra,
    )


def _leave_sigterm_to_the_rank(_worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM: a scheduler's `kill -- -PGID` reaches it with its rank, and a worker that
    died of it would fail the rank's step (torch raises "DataLoader worker ... killed by signal") before the rank
    could finish the step and checkpoint. The worker still exits with its rank: on the loader's shutdown, or when it
    sees its parent gone."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _collate(windows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    batch = torch.stack(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
