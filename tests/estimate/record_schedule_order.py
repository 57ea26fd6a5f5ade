"""Run torch's pipeline schedules on real gloo ranks and record which chunk each rank computes, in order.

    torchrun --nproc-per-node P record_schedule_order.py MICROBATCHES VPP OUT.json

The reference for toolkit.estimate.pipeline.rank_orders: what torch executes, not its `pipeline_order`
table. Every rank writes OUT.json.rank{r}: {schedule: [[kind, micro, stage], ...]}.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)


def recorded_stage(index: int, stages: int, log: list) -> PipelineStage:
    stage = PipelineStage(torch.nn.Linear(4, 4), index, stages, torch.device("cpu"))
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def on_forward(chunk, *args, **kwargs):
        log.append(["F", chunk, index])
        return forward(chunk, *args, **kwargs)

    def on_backward(chunk, *args, **kwargs):
        log.append(["B", chunk, index])
        return backward(chunk, *args, **kwargs)

    def on_weight(chunk, *args, **kwargs):
        log.append(["W", chunk, index])
        return weight(chunk, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk = (
        on_forward,
        on_backward,
        on_weight,
    )
    return stage


def run(schedule_class, m: int, v: int, rank: int, p: int) -> list:
    log: list = []
    stages = [recorded_stage(c * p + rank, p * v, log) for c in range(v)]
    loss = lambda out, target: ((out - target) ** 2).mean()  # noqa: E731
    schedule = (
        schedule_class(stages[0], m, loss_fn=loss)
        if schedule_class in (ScheduleGPipe, Schedule1F1B)
        else schedule_class(stages, m, loss_fn=loss)
    )
    x, target = torch.randn(m, 4), torch.randn(m, 4)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    schedule.step(*((x,) if has_first else ()), **({"target": target} if has_last else {}))
    return log


def main() -> None:
    m, v, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    logs = {
        "gpipe": run(ScheduleGPipe, m, 1, rank, p),
        "1f1b": run(Schedule1F1B, m, 1, rank, p),
        "interleaved": run(ScheduleInterleaved1F1B, m, v, rank, p),
        "zb-h1": run(ScheduleInterleavedZeroBubble, m, 1, rank, p),
    }
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(logs, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
