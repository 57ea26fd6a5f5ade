"""Own data for `toolkit data prepare`: documents read from text, jsonl, parquet or a local Hugging Face dataset,
tokenized with a Hugging Face tokenizer (or as bytes), packed with an end-of-document token between documents, and
several sources mixed by weight.

    tok = load_tokenizer("models/mine")                  # a tokenizer.json, or a folder holding one
    docs = read_documents("notes.jsonl", field="text")   # one document a line
    ids = pack(docs, tok)                                # documents joined by tok.eos_id

What is missing (a file, a field, pyarrow for parquet, `datasets` for a saved dataset, the network for a hub name)
is refused in one line naming the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..specs.errors import SpecError

__all__ = ["Tokenizer", "load_tokenizer", "read_documents", "pack", "mix", "TEXT_SUFFIXES"]

TEXT_SUFFIXES = (".txt", ".md")


@dataclass
class Tokenizer:
    name: str
    vocab: int
    eos_id: int | None
    """The end-of-document id packing puts between documents (None: documents are simply joined)."""
    _encode: object = None

    def encode(self, text: str) -> list[int]:
        if self._encode is None:  # bytes
            return list(text.encode("utf-8"))
        return self._encode(text)


def load_tokenizer(spec: str | None) -> Tokenizer:
    """`bytes` (or None): UTF-8 bytes, vocabulary 256; a tokenizer.json file or a folder holding one (a Hugging Face
    model folder); else a hub name, fetched by the `tokenizers` library where the network allows."""
    if spec in (None, "bytes"):
        return Tokenizer("bytes", 256, None)
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise SpecError("--tokenizer", spec, "needs the `tokenizers` package: pip install tokenizers") from None
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise SpecError("--tokenizer", spec, "holds no tokenizer.json (save one with tokenizer.save_pretrained)")
    if path.is_file():
        tok = HFTokenizer.from_file(str(path))
        name = str(Path(spec))
    else:
        try:
            tok = HFTokenizer.from_pretrained(spec)
        except Exception as err:  # offline, or no such repository
            raise SpecError(
                "--tokenizer",
                spec,
                f"is no file or folder here, and the hub could not give it ({type(err).__name__}); "
                "give a tokenizer.json or a local model folder",
            ) from None
        name = spec
    return Tokenizer(name, tok.get_vocab_size(), _eos_id(tok, path), lambda text: tok.encode(text).ids)


def _eos_id(tok, path: Path) -> int | None:
    """The end-of-text id: the folder's tokenizer_config.json `eos_token`, else a token named like one."""
    config = path.parent / "tokenizer_config.json"
    names = []
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        names.append(eos.get("content") if isinstance(eos, dict) else eos)
    names += ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]"]
    for name in names:
        if name and tok.token_to_id(name) is not None:
            return tok.token_to_id(name)
    return None


def read_documents(raw: str, field: str = "text") -> Iterator[str]:
    """The documents of one source: a text file (one document), a folder of .txt/.md files (one each), a .jsonl
    file (the `field` of each line), a .parquet file (its `field` column) or a saved Hugging Face dataset folder
    (`save_to_disk`: its `field`)."""
    path = Path(raw)
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        yield from _saved_dataset(path, field)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        if not files:
            raise SpecError("data prepare", raw, "folder holds no .txt or .md files (nor a saved dataset)")
        for f in files:
            yield f.read_text(encoding="utf-8", errors="replace")
    elif not path.is_file():
        raise SpecError("data prepare", raw, "no such file or folder")
    elif path.suffix == ".jsonl":
        yield from _jsonl(path, field)
    elif path.suffix == ".parquet":
        yield from _parquet(path, field)
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SpecError("data prepare", f"{path}:{number}", "is not one JSON object a line") from None
            if not isinstance(record, dict) or field not in record:
                raise SpecError("--field", field, f"is not a key of {path} line {number}; give --field NAME")
            yield str(record[field])


def _parquet(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError("data prepare", str(path), "parquet needs pyarrow: pip install pyarrow") from None
    table = pq.read_table(path)
    if field not in table.column_names:
        raise SpecError("--field", field, f"is not a column of {path} ({', '.join(table.column_names)})")
    yield from (str(v) for v in table.column(field).to_pylist())


def _saved_dataset(path: Path, field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise SpecError("data prepare", str(path), "a saved dataset needs `datasets`: pip install datasets") from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        data = data["train"] if "train" in data else next(iter(data.values()))
    if field not in data.column_names:
        raise SpecError("--field", field, f"is not a column of {path} ({', '.join(data.column_names)})")
    yield from (str(v) for v in data[field])


def pack(documents: list[str], tok: Tokenizer) -> np.ndarray:
    """The documents' tokens end to end, tok.eos_id after each (the boundary a model learns to stop at)."""
    ids: list[int] = []
    for doc in documents:
        ids += tok.encode(doc)
        if tok.eos_id is not None:
            ids.append(tok.eos_id)
    return np.asarray(ids, dtype=np.int64)


def mix(streams: list[np.ndarray], weights: list[float]) -> list[np.ndarray]:
    """Each source's tokens resized so that its share of the total is its weight: a source repeats (whole passes,
    then a head) or is cut; the total stays the sources' own."""
    if len(weights) != len(streams):
        raise SpecError(
            "--mix", ",".join(map(str, weights)), f"gives {len(weights)} weights for {len(streams)} sources"
        )
    if any(w <= 0 for w in weights):
        raise SpecError("--mix", ",".join(map(str, weights)), "weights must be positive")
    total = sum(len(s) for s in streams)
    out = []
    for stream, weight in zip(streams, weights):
        want = int(round(total * weight / sum(weights)))
        reps = -(-want // max(len(stream), 1))
        out.append(np.tile(stream, reps)[:want] if len(stream) else stream)
    return out
