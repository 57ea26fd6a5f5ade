"""DeepSpeed's pipeline partition methods, as blocks per stage: `parallel.partition` gives a pipeline's split the way
a Megatron-DeepSpeed run configured it, instead of listing `parallel.stage_layers` by hand.

    partition_blocks(model, pp=12, method="type:transformer|embedding", tp=4)   # [5, 6, ..., 6, 5] for BLOOM's 70

DeepSpeed's PipelineModule splits a flat list of layers (deepspeed/runtime/pipe/module.py, `_partition_layers`):

- `uniform`: the same number of list entries on each stage, casts and transposes counted too;
- `parameters`: balance each entry's trainable parameters on this tensor-parallel rank;
- `type:REGEX`: balance the entries whose class name matches REGEX (case-insensitive), one each.

Balancing is DeepSpeed's `partition_balanced` (0.19): contiguous non-empty parts chosen to make the heaviest and the
lightest part's weights as close as possible, the latest cut winning a tie. The list is Megatron-DeepSpeed's GPT
(bigscience-workshop/Megatron-DeepSpeed, megatron/model/gpt_model.py, `GPTModelPipe`): a cast to 16 bits, the
embedding, a transpose, the blocks, a transpose, the final norm, the output projection (the embedding again when
tied), and a cast back to fp32 in 16-bit modes. The blocks each part gets become `parallel.stage_layers`.
"""

from __future__ import annotations

import functools
import re

from .errors import SpecError
from .model import ModelSpec
from .params import count_params, replicated_per_layer, vocab_per_rank

__all__ = ["PARTITION_METHODS", "layer_list", "balanced_parts", "uniform_parts", "partition_blocks"]

PARTITION_METHODS = ("uniform", "parameters", "type:REGEX")
BLOCK, EMBEDDING, HEAD = "ParallelTransformerLayerPipe", "EmbeddingPipe", "LMHeadPipe"


def layer_list(model: ModelSpec, tp: int = 1, half: bool = True) -> list[tuple[str, int]]:
    """(class name, trainable parameters on one tensor-parallel rank) of each entry of GPTModelPipe's list."""
    c = count_params(model)
    rows = int(vocab_per_rank(model, tp)) * model.hidden
    replicated = replicated_per_layer(model)
    block = (c.per_layer - replicated) // tp + replicated
    embedding = rows + c.positions
    norm = "LayerNorm" if model.norm == "layernorm" else "RMSNorm"
    head = (EMBEDDING, embedding) if model.tie_embeddings else (HEAD, rows)
    entries = [("_to_float16", 0), (EMBEDDING, embedding), ("<lambda>", 0)]
    entries += [(BLOCK, block)] * model.layers
    entries += [("<lambda>", 0), (norm, c.final), head]
    return entries + ([("float16_to_fp32", 0)] if half else [])


def uniform_parts(items: int, parts: int) -> list[int]:
    """Boundaries of `parts` runs of `items` entries, the first ones one longer when they do not divide."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


@functools.lru_cache(maxsize=256)
def balanced_parts(weights: tuple[float, ...], parts: int) -> list[int]:
    """Boundaries of `parts` contiguous non-empty runs whose heaviest and lightest sums are closest (ties: the
    latest cut), found by dynamic programming over (entries so far, runs so far)."""
    n = len(weights)
    if n <= parts:
        return uniform_parts(n, parts)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[j][i]: (spread, heaviest, lightest, cut) of the first i entries in j runs
    best = [[(inf, inf, inf, 0)] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0, inf, 0)
    for j in range(1, parts + 1):
        for i in range(j, n + 1):
            chosen = (inf, inf, inf, 0)
            for k in range(i):
                _spread, heaviest, lightest, _cut = best[j - 1][k]
                run = prefix[i] - prefix[k]
                high, low = max(heaviest, run), min(lightest, run)
                if high - low <= chosen[0]:
                    chosen = (high - low, high, low, k)
            best[j][i] = chosen
    cuts = [n]
    for j in range(parts, 0, -1):
        cuts.append(best[j][cuts[-1]][3])
    return cuts[::-1]


def partition_blocks(model: ModelSpec, pp: int, method: str, tp: int = 1, half: bool = True) -> list[int]:
    """Blocks on each of the pp stages when DeepSpeed partitions GPTModelPipe by `method`; refuses a split that
    leaves a stage without a block or moves the embedding or the output projection off its end stage."""
    entries = layer_list(model, tp, half)
    if method == "uniform":
        cuts = uniform_parts(len(entries), pp)
    elif method == "parameters":
        cuts = balanced_parts(tuple(float(n) for n in (w for _name, w in entries)), pp)
    elif method.startswith("type:"):
        try:
            pattern = re.compile(method[len("type:") :], re.IGNORECASE)
        except re.error as err:
            raise SpecError("parallel.partition", method, f"its regular expression does not compile ({err})") from None
        weights = tuple(1.0 if pattern.search(name) else 0.0 for name, _n in entries)
        if not any(weights):
            raise SpecError(
                "parallel.partition",
                method,
                f"matches none of the layers ({BLOCK}, {EMBEDDING}, ...); "
                "try type:transformer or type:transformer|embedding",
            )
        cuts = balanced_parts(weights, pp)
    else:
        raise SpecError(
            "parallel.partition", method, f"use one of {', '.join(PARTITION_METHODS)} (DeepSpeed's partition_method)"
        )
    names = [name for name, _n in entries]
    blocks = [names[a:b].count(BLOCK) for a, b in zip(cuts, cuts[1:])]
    head = len(names) - 1 - names[::-1].index(HEAD if not model.tie_embeddings else EMBEDDING)
    if min(blocks) < 1 or names.index(EMBEDDING) >= cuts[1] or head < cuts[-2]:
        raise SpecError(
            "parallel.partition",
            method,
            f"splits the {model.layers} blocks on {pp} stages as {blocks}, leaving a stage without a "
            "block (or the embedding or output projection off its end stage), which the toolkit does "
            "not model; use fewer stages or type:transformer|embedding",
        )
    return blocks
