"""Megatron-Core's pipeline layout string (--pipeline-model-parallel-layout) as the chunks' layer counts.

    parse_layout("Et|(tt|)*30,L", layers=61, chunks=32)   # [1, 2, 2, ..., 2, 0]
    layout_string([1, 2, 2, 0])                          # "Et|(tt|)*2,L", as Megatron writes it

The string lists the pp × vpp chunks in model order, separated by "|": "E" is the embedding (first chunk only),
"t" a transformer layer, "m" a multi-token-prediction layer, "L" the loss and output layer (last chunk only);
"X*n" and "(...)*n" repeat, commas are cosmetic (Megatron-Core's pipeline_parallel_layout docs). A chunk may hold
no layer at all: DeepSeek-V3's 61 layers on 32 chunks end on a chunk holding the loss alone.
"""

from __future__ import annotations

import re

from .errors import SpecError

__all__ = ["parse_layout", "layout_string"]

_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT = re.compile(r"([EtmL|])\*(\d+)")


def _expand(text: str) -> str:
    """The string with every repetition written out and the cosmetic commas and spaces gone."""
    text = text.replace(",", "").replace(" ", "")
    while _GROUP.search(text):
        text = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), text)
    return _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout(text: str, layers: int, chunks: int) -> tuple[list[int], int]:
    """(transformer layers of each chunk, multi-token-prediction layers) of a layout string, checked against the
    model's layers and the pp × vpp chunks; a bad string is refused in one line that says what is wrong."""
    field = "parallel.pipeline_layout"
    flat = _expand(text)
    if set(flat) - set("EtmL|"):
        raise SpecError(field, text, "takes E, t, m, L, |, (...)*n and X*n only (Megatron-Core's layout string)")
    parts = flat.split("|")
    if parts and parts[-1] == "":  # (a trailing separator, as a repeated group leaves one)
        parts = parts[:-1]
    if len(parts) != chunks:
        raise SpecError(field, text, f"lists {len(parts)} chunks; pp × vpp = {chunks}")
    if flat.count("E") != 1 or "E" not in parts[0] or flat.count("L") != 1 or "L" not in parts[-1]:
        raise SpecError(field, text, "needs one E in the first chunk and one L in the last")
    counts = [part.count("t") for part in parts]
    if sum(counts) != layers:
        raise SpecError(field, text, f"holds {sum(counts)} transformer layers; the model has {layers}")
    return counts, flat.count("m")


def layout_string(counts: list[int]) -> str:
    """Megatron's string for chunks of `counts` layers, the embedding in the first and the loss in the last; runs
    of equal chunks between them written as a repeated group."""
    if len(counts) == 1:
        return "E" + "t" * counts[0] + "L"
    first, middle, last = counts[0], counts[1:-1], counts[-1]
    out = "E" + "t" * first + "|"
    i = 0
    while i < len(middle):
        j = i
        while j < len(middle) and middle[j] == middle[i]:
            j += 1
        run = j - i
        out += f"({'t' * middle[i]}|)*{run}" if run > 1 else "t" * middle[i] + "|"
        i = j
    return out + ("," if out[-1].isdigit() else "") + "t" * last + "L"
