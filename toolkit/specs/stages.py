"""How a model's blocks are split over pipeline stages: one rule for the estimator, the runner and the tracer.

    chunk_layers(126, pp=16, vpp=2)        # [3, 4, 4, ..., 4, 3]: 32 chunks, the first and last one block short
    rank_layers(126, pp=16, vpp=2)         # [7, 8, ..., 8, 7]: what each pipeline rank holds
    stage_layer_counts(126, 16, 2)         # (7, 8, 7): first, middle, last rank (numpy arrays welcome)

When pp·vpp chunks divide the layers, every chunk holds layers / (pp·vpp). When they do not, every chunk holds
c = ceil(layers / (pp·vpp)) except the model's first and last, which give up the difference between them (the
last one the larger half): the first chunk also runs the embedding, the last one the output projection and the
loss, so they have time to spare. This is how Llama 3 405B ran 126 layers on 16 stages (Dubey et al. 2024, §3.3.2:
"one Transformer layer fewer on the first and the last stage") and BLOOM-176B 70 blocks on 12 (its embedding
counted as a layer at either end). Where that rule would leave the first or last chunk empty (DeepSeek-V3's 61
layers on pp 8 × vpp 4 = 32 chunks), the embedding and the loss each count as a layer, as Megatron-Core's
account_for_embedding/loss_in_pipeline_split do, and a chunk may hold them alone: 61 layers on 32 chunks become
Megatron's layout "Et|(tt|)*30,L" (its last chunk the loss only). `parallel.stage_layers` or Megatron's
`parallel.pipeline_layout` string give the chunks' sizes outright instead.
"""

from __future__ import annotations

import numpy as np

from .errors import SpecError

__all__ = [
    "chunk_layers",
    "rank_layers",
    "stage_layer_counts",
    "uneven_fits",
    "check_stage_layers",
    "accounted_split",
    "empty_chunk",
]


def _even_split(layers, chunks):
    layers, chunks = np.asarray(layers), np.asarray(chunks)
    c = -(-layers // chunks)
    short = chunks * c - layers
    return c, c - short // 2, c - (short - short // 2)


def _split(layers, chunks):
    """(c, the first chunk's, the last chunk's) layers under the rule; arrays in, arrays out. Where the first or
    last chunk would be empty, the embedding and the loss count as a layer each (Megatron's accounting)."""
    c, first, last = _even_split(layers, chunks)
    c2, first2, last2 = _even_split(np.asarray(layers) + 2, chunks)
    accounted = np.minimum(first, last) < 1
    return np.where(accounted, c2, c), np.where(accounted, first2 - 1, first), np.where(accounted, last2 - 1, last)


def accounted_split(layers: int, pp: int, vpp: int = 1) -> bool:
    """Whether the chunks follow Megatron's accounting (the embedding and the loss as a layer each)."""
    _c, first, last = _even_split(layers, pp * vpp)
    return pp * vpp > 1 and min(int(first), int(last)) < 1


def empty_chunk(layers, pp, vpp=1):
    """Whether the rule leaves the first or last chunk its embedding or loss alone (arrays welcome)."""
    chunks = np.asarray(pp) * np.asarray(vpp)
    _c, first, last = _split(layers, chunks)
    return (np.minimum(first, last) < 1) & (chunks > 1)


def uneven_fits(layers, pp, vpp=1):
    """Whether the rule gives every chunk a layer, the first and last at least their embedding or loss (arrays
    welcome)."""
    chunks = np.asarray(pp) * np.asarray(vpp)
    c, first, last = _split(layers, chunks)
    return ((np.minimum(first, last) >= 0) & (c >= 1) & (c <= layers)) | (chunks == 1)


def chunk_layers(layers: int, pp: int, vpp: int = 1, stage_layers: tuple[int, ...] | None = None) -> list[int]:
    """Layers of each of the pp·vpp chunks, in model order (chunk k runs on pipeline rank k mod pp)."""
    if stage_layers:
        return list(stage_layers)
    chunks = pp * vpp
    if chunks == 1:
        return [layers]
    c, first, last = (int(x) for x in _split(layers, chunks))
    return [first] + [c] * (chunks - 2) + [last]


def rank_layers(layers: int, pp: int, vpp: int = 1, stage_layers: tuple[int, ...] | None = None) -> list[int]:
    """Layers each pipeline rank holds (its vpp chunks together)."""
    sizes = chunk_layers(layers, pp, vpp, stage_layers)
    return [sum(sizes[r::pp]) for r in range(pp)]


def stage_layer_counts(layers, pp, vpp=1, stage_layers: tuple[int, ...] | None = None):
    """(first, middle, last) pipeline rank's layers; middle is the most any rank between them holds (= first
    without pipelining). pp and vpp may be numpy arrays (the planner's grid), not with `stage_layers`."""
    if stage_layers:
        per_rank = rank_layers(layers, int(pp), int(vpp), stage_layers)
        middle = max(per_rank[1:-1]) if len(per_rank) > 2 else per_rank[0]
        return per_rank[0], middle, per_rank[-1]
    if isinstance(pp, int) and isinstance(vpp, int) and layers % (pp * vpp) == 0:  # one equal layout: fast path
        return (layers // pp,) * 3
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    c, first, last = _split(layers, pp * vpp)
    single = pp * vpp == 1
    whole = np.asarray(layers)
    return (
        np.where(single, whole, (vpp - 1) * c + first),
        np.where(single, whole, vpp * c),
        np.where(single, whole, (vpp - 1) * c + last),
    )


def check_stage_layers(layers: int, pp: int, vpp: int, stage_layers: tuple[int, ...] | None) -> None:
    """Refuse a split that leaves a chunk empty or does not add up, naming the fix."""
    chunks = pp * vpp
    if stage_layers:
        inner = stage_layers[1:-1]
        if (
            len(stage_layers) != chunks
            or min(stage_layers) < 0
            or any(n < 1 for n in inner)
            or sum(stage_layers) != layers
        ):
            raise SpecError(
                "parallel.stage_layers",
                list(stage_layers),
                f"needs pp × vpp = {chunks} entries of at least 1 layer summing to model.layers = {layers}; for "
                f"example {chunk_layers(layers, pp, vpp) if uneven_fits(layers, pp, vpp) else '(none: lower pp)'} "
                "(the first and last may hold none: the embedding or the loss alone, as Megatron's layouts do)",
            )
        return
    if not uneven_fits(layers, pp, vpp):
        below = [p for p in range(1, pp) if uneven_fits(layers, p, vpp)]
        above = [p for p in range(pp + 1, layers + 1) if uneven_fits(layers, p, vpp)]
        nearest = " or ".join(str(p) for p in (below[-1:] + above[:1]))
        raise SpecError(
            "parallel.pp",
            pp,
            f"{layers} layers on pp × vpp = {chunks} chunks leave a chunk without a layer, even with the embedding and "
            "the loss counted as one each; "
            f"use pp {nearest} or list the chunks in parallel.stage_layers",
        )
