"""Model and optimizer state in one layout-free form, so a checkpoint resumes on any number of ranks.

    model_sd, optim_sd = gather_state(model, optimizer, layout)      # every rank calls it (collectives)
    restore_state(model, optimizer, model_sd, optim_sd, layout)     # every rank, from the loaded file

Both are keyed by the names of the whole model's parameters, the form of torch.distributed.checkpoint's
state-dict API: `{"state": {name: {...}}, "param_groups": [{..., "params": [names]}]}` for the optimizer.
Sharded layouts (FSDP2, tensor parallelism) go through that API (`get_state_dict` / `set_state_dict` with
full state dicts: rank 0 gathers, every rank takes its shard back); torch's ZeRO-1 consolidates its
partitions on rank 0 first; replicas rename their optimizer's indices; pipeline stages rename their
renumbered blocks back (tensor-parallel stages gather their shards) and rank 0 collects every stage's part. A dp-4 checkpoint therefore loads on 2 ranks,
or on one process, a ZeRO-3 one into a replica, and a pipeline's into one process.
"""

from __future__ import annotations

import torch
from torch import nn

from ..program.layout import Layout

__all__ = ["gather_state", "restore_state"]


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer, layout: Layout) -> tuple[dict, dict]:
    """(model state, optimizer state) by parameter name; complete on rank 0 (other ranks may get empty dicts)."""
    if layout.stage_keys is not None:
        return _gather_stages(model, optimizer, layout)
    if layout.sharded:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(model, optimizer, options=_options())
    if layout.zero1:
        optimizer.consolidate_state_dict(to=0)
        if torch.distributed.get_rank() != 0:
            return {}, {}
    return model.state_dict(), _by_name(optimizer.state_dict(), _names_in_order(model, optimizer))


def restore_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict, layout: Layout
) -> None:
    """Load a gathered state into this rank's model and optimizer (each keeps its own shard)."""
    if layout.stage_keys is not None:
        current = model.state_dict()
        model.load_state_dict(
            {local: _placed_like(model_sd[whole], current[local]) for local, whole in layout.stage_keys.items()}
        )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = [layout.stage_params[id(p)] for p in params]
        mine = _only(optim_sd, set(names))
        for name, param in zip(names, params):  # tensor-parallel stages: each rank keeps its shard of the states
            values = mine["state"].get(name, {})
            mine["state"][name] = {
                k: _placed_like(v, param) if torch.is_tensor(v) and v.dim() else v for k, v in values.items()
            }
        optimizer.load_state_dict(_by_index(mine, names))
        return
    if layout.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_sd,
            optim_state_dict=optim_sd,
            options=StateDictOptions(full_state_dict=True),
        )
        return
    model.load_state_dict(model_sd)
    optimizer.load_state_dict(_by_index(optim_sd, _names_in_order(model, optimizer)))
    for param in [p for p, value in optimizer.state.items() if value is None]:
        # torch's ZeroRedundancyOptimizer leaves None for each parameter another rank owns (its own states live in
        # its local optimizer); code that walks optimizer.state (MemTracker, when the resumed run records its memory)
        # expects a dict per entry, and a fresh run has no entry at all
        del optimizer.state[param]


def _names_in_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in its own (index) order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _by_name(osd: dict, names: list[str]) -> dict:
    groups, start = [], 0
    for group in osd["param_groups"]:
        count = len(group["params"])
        groups.append(dict(group, params=names[start : start + count]))
        start += count
    return {"state": {names[i]: value for i, value in osd["state"].items()}, "param_groups": groups}


def _by_index(osd: dict, names: list[str]) -> dict:
    """The optimizer's own form. torch pairs saved and current parameters by position, so each group lists its
    indices in the current order (a checkpoint from an older runner, already by index, passes through)."""
    if all(isinstance(n, int) for g in osd["param_groups"] for n in g["params"]):
        return osd
    index = {name: i for i, name in enumerate(names)}
    missing = [n for g in osd["param_groups"] for n in g["params"] if n not in index]
    if missing:
        raise ValueError(f"the checkpoint's optimizer holds parameters this model lacks: {missing[:3]}")
    groups = [dict(g, params=sorted(index[n] for n in g["params"])) for g in osd["param_groups"]]
    return {"state": {index[n]: value for n, value in osd["state"].items()}, "param_groups": groups}


def _gather_stages(model: nn.Module, optimizer: torch.optim.Optimizer, layout: Layout) -> tuple[dict, dict]:
    """Every pipeline rank's states under the whole model's names, merged on rank 0 (replicas over dp send the
    same entries; a tied embedding comes from both ends, equal)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    names = [layout.stage_params[id(p)] for group in optimizer.param_groups for p in group["params"]]
    mine = ({layout.stage_keys[k]: v for k, v in model.state_dict().items()}, _by_name(optimizer.state_dict(), names))
    # tensor-parallel stages: whole tensors (the ranks of one tp group gather them in the same order)
    mine = tree_map_only(DTensor, lambda t: t.full_tensor(), mine)
    mine = tree_map_only(torch.Tensor, lambda t: t.detach().cpu(), mine)
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, parts, dst=0)
    if parts is None:
        return {}, {}
    model_sd, state = {}, {}
    groups = [dict(g, params=[]) for g in parts[0][1]["param_groups"]]
    for part_model, part_optim in parts:
        model_sd.update(part_model)
        state.update(part_optim["state"])
        for group, part in zip(groups, part_optim["param_groups"]):
            group["params"] += [n for n in part["params"] if n not in group["params"]]
    return model_sd, {"state": state, "param_groups": groups}


def _placed_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` laid out as `like` is: this rank's shard where `like` is a DTensor (tensor-parallel stages)."""
    if not hasattr(like, "device_mesh"):
        return whole
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements)


def _only(osd: dict, names: set[str]) -> dict:
    """The entries of a by-name optimizer state that belong to `names` (one pipeline stage's share)."""
    if all(isinstance(n, int) for g in osd["param_groups"] for n in g["params"]):
        raise ValueError(
            "the checkpoint's optimizer state is keyed by index (an older runner): resume it without "
            "pipeline parallelism, or start a new run"
        )
    return {
        "state": {n: v for n, v in osd["state"].items() if n in names},
        "param_groups": [dict(g, params=[n for n in g["params"] if n in names]) for g in osd["param_groups"]],
    }
