"""Pipeline schedules as timelines: which rank runs which micro-batch when, and how much of the step is idle.

    tl = simulate("1f1b", stages=4, microbatches=8, forward_s=1.0, backward_s=2.0)
    tl.step_s, tl.bubble_fraction, tl.peak_in_flight, tl.spans

Each rank runs its operations in the order torch's schedules run them (`rank_orders`: GPipe, 1F1B,
interleaved 1F1B as `ScheduleInterleaved1F1B`, ZB-H1 as `ScheduleInterleavedZeroBubble` with one stage per
rank; a test checks the orders against a real gloo run of torch's schedules). An operation starts when its
rank is free and its input is there: a forward needs the previous virtual stage's forward of the same
micro-batch, a backward the next stage's backward (the last stage: its own forward), a weight-gradient
step (ZB-H1's W) its own backward; crossing to another rank costs `p2p_s`.

For uniform stages and no latency the bubble fraction (idle time over stages × step time) is
(p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) for interleaved 1F1B, and for ZB-H1
(p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)) (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3);
the simulator reaches them by running the orders, not from the formulas, and also handles what the
formulas do not: uneven stages (`forward_s` per virtual stage) and point-to-point latency. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..specs.rules import interleaved_rounds_fit

__all__ = ["SCHEDULES", "Action", "Span", "Timeline", "rank_orders", "simulate", "replay", "peak_in_flight"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Action:
    kind: str
    """"F" forward, "B" backward (input gradients only under zb-h1, else the whole backward), "W" weight gradients."""
    micro: int
    stage: int
    """Virtual stage: chunk · stages + rank (a rank holds stages rank, rank + p, ... under interleaving)."""


@dataclass(frozen=True)
class Span:
    rank: int
    kind: str
    micro: int
    stage: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    schedule: str
    stages: int
    microbatches: int
    vpp: int
    spans: tuple[Span, ...]
    step_s: float
    busy_s: tuple[float, ...]
    """Per rank: seconds computing."""
    bubble_fraction: float
    """Idle time over stages × step time."""
    peak_in_flight: tuple[int, ...]
    """Per rank: most micro-batch chunks forwarded and not yet backwarded (a chunk holds 1/vpp of the stage's
    layers), i.e. how many micro-batches' activations the rank holds at once."""

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(self.step_s - busy for busy in self.busy_s)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["timeline"] = out.pop("spans")
        out["idle_s"] = list(self.idle_s)
        return out


def rank_orders(schedule: str, stages: int, microbatches: int, vpp: int = 1) -> list[list[Action]]:
    """Each rank's operations in the order torch's schedule runs them."""
    _check(schedule, stages, microbatches, vpp)
    p, m = stages, microbatches
    if schedule == "gpipe":
        return [[Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in range(m)] for r in range(p)]
    if schedule == "1f1b":
        return [_one_f_one_b(r, p, m) for r in range(p)]
    return [
        _looped(r, p, m, vpp if schedule == "interleaved" else 1, zero_bubble=schedule == "zb-h1") for r in range(p)
    ]


def _check(schedule: str, stages: int, microbatches: int, vpp: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    if stages < 1 or microbatches < 1 or vpp < 1:
        raise ValueError("stages, micro-batches and vpp must be at least 1")
    if vpp > 1 and schedule != "interleaved":
        raise ValueError(f"vpp {vpp} needs the interleaved schedule; {schedule} holds one stage per rank")
    if schedule in ("interleaved", "zb-h1") and not interleaved_rounds_fit(microbatches, stages):
        rounds = max(1, microbatches // stages)
        raise ValueError(
            f"{schedule} needs micro-batches ({microbatches}) to be a multiple of "
            f"max(1, micro-batches // stages) = {rounds}, as torch's schedule does"
        )


def _one_f_one_b(rank: int, p: int, m: int) -> list[Action]:
    """torch's Schedule1F1B: min(m, p − rank) forwards, then backward-forward pairs, then the backwards."""
    warmup = min(m, p - rank)
    order = [Action("F", i, rank) for i in range(warmup)]
    for b in range(m):
        order.append(Action("B", b, rank))
        if warmup + b < m:
            order.append(Action("F", warmup + b, rank))
    return order


def _looped(rank: int, p: int, m: int, v: int, zero_bubble: bool) -> list[Action]:
    """torch's looped schedules (ScheduleInterleaved1F1B; ScheduleInterleavedZeroBubble, whose weight
    gradients start after `rank` steady steps): warm-up forwards, forward-backward pairs, cool-down."""
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - rank), m * v)
    total = m * v
    seen = {"F": [0] * (p * v), "B": [0] * (p * v), "W": [0] * (p * v)}
    backwards: list[int] = []
    order: list[Action] = []

    def emit(kind: str, stage: int) -> None:
        order.append(Action(kind, seen[kind][stage], stage))
        seen[kind][stage] += 1

    def forward_stage(op: int) -> int:
        return (op // per_round) % v * p + rank

    def backward_stage(op: int) -> int:
        return (v - 1 - ((op - warmup) // per_round) % v) * p + rank

    for op in range(total + warmup):
        if op < total:
            emit("F", forward_stage(op))
        if op >= warmup:
            emit("B", backward_stage(op))
            backwards.append(backward_stage(op))
            if zero_bubble and op - warmup >= rank:
                emit("W", backwards[sum(seen["W"])])  # weight gradients in the backwards' order
    while zero_bubble and sum(seen["W"]) < len(backwards):
        emit("W", backwards[sum(seen["W"])])
    return order


def simulate(
    schedule: str,
    stages: int,
    microbatches: int,
    vpp: int = 1,
    *,
    forward_s: float | Sequence[float] = 1.0,
    backward_s: float | Sequence[float] = 2.0,
    weight_s: float | Sequence[float] | None = None,
    p2p_s: float = 0.0,
) -> Timeline:
    """Run the schedule's orders against each other. Times are per micro-batch for a whole stage (a scalar),
    or one per virtual stage (stages · vpp values, for uneven stages); a chunk of an interleaved stage takes
    1/vpp of a scalar. `backward_s` is the whole backward; `weight_s` its weight-gradient part, which only
    zb-h1 runs apart (default: half the backward, the paper's F = B = W when a backward is two forwards)."""
    orders = rank_orders(schedule, stages, microbatches, vpp)
    v = vpp if schedule == "interleaved" else 1
    n = stages * v
    f, b = _per_stage(forward_s, n, v, "forward_s"), _per_stage(backward_s, n, v, "backward_s")
    w = [x / 2 for x in b] if weight_s is None else _per_stage(weight_s, n, v, "weight_s")
    if any(y > x for x, y in zip(b, w)):
        raise ValueError("weight_s is a part of backward_s and cannot exceed it")
    if not p2p_s >= 0:
        raise ValueError("p2p_s must not be negative")
    if schedule == "zb-h1":
        duration = {"F": f, "B": [x - y for x, y in zip(b, w)], "W": w}
    else:
        duration = {"F": f, "B": b}
    done: dict[tuple[str, int, int], float] = {}
    free_s = [0.0] * stages
    position = [0] * stages
    spans: list[Span] = []
    while any(position[r] < len(orders[r]) for r in range(stages)):
        progressed = False
        for rank in range(stages):
            while position[rank] < len(orders[rank]):
                act = orders[rank][position[rank]]
                ready = _ready_s(act, done, n, stages, p2p_s)
                if ready is None:
                    break
                start = max(free_s[rank], ready)
                end = start + duration[act.kind][act.stage]
                spans.append(Span(rank, act.kind, act.micro, act.stage, start, end))
                done[(act.kind, act.micro, act.stage)] = free_s[rank] = end
                position[rank] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule}: the ranks' orders wait on each other (deadlock)")
    return _timeline(schedule, stages, microbatches, v, spans)


def _per_stage(t: float | Sequence[float], n: int, v: int, name: str) -> list[float]:
    values = [float(t) / v] * n if isinstance(t, (int, float)) else [float(x) for x in t]
    if len(values) != n:
        raise ValueError(f"{name} needs one value per virtual stage ({n}), got {len(values)}")
    if any(x < 0 or x != x for x in values):
        raise ValueError(f"{name} must be non-negative numbers")
    return values


def _input_of(kind: str, micro: int, stage: int, n: int) -> tuple[str, int, int] | None:
    """The action whose output this one needs: a forward the previous stage's forward, a backward the next
    stage's backward (the last stage: its own forward), a weight-gradient step its own backward."""
    if kind == "F":
        return ("F", micro, stage - 1) if stage > 0 else None
    if kind == "B":
        return ("B", micro, stage + 1) if stage < n - 1 else ("F", micro, stage)
    return ("B", micro, stage)


def _ready_s(act: Action, done: dict, n: int, p: int, p2p_s: float) -> float | None:
    """When the action's input is there, or None if its producer has not run yet."""
    source = _input_of(act.kind, act.micro, act.stage, n)
    if source is None:
        return 0.0
    if source not in done:
        return None
    crosses = source[2] % p != act.stage % p
    return done[source] + (p2p_s if crosses else 0.0)


def _timeline(schedule: str, p: int, m: int, v: int, spans: list[Span]) -> Timeline:
    step_s = max((s.end_s for s in spans), default=0.0)
    busy = [0.0] * p
    for s in spans:
        busy[s.rank] += s.end_s - s.start_s
    bubble = (p * step_s - sum(busy)) / (p * step_s) if step_s > 0 else 0.0
    peaks = peak_in_flight([(s.rank, s.kind, s.start_s) for s in spans], p)
    return Timeline(schedule, p, m, v, tuple(spans), step_s, tuple(busy), bubble, peaks)


def peak_in_flight(events: list[tuple[int, str, float]], p: int) -> tuple[int, ...]:
    """Per rank, the most chunks forwarded and not yet backwarded, from (rank, kind, start) of each chunk."""
    in_flight, peak = [0] * p, [0] * p
    for rank, kind, _ in sorted(events, key=lambda e: (e[2], e[1] != "B")):  # at a tie, free before holding
        in_flight[rank] += {"F": 1, "B": -1, "W": 0}[kind]
        peak[rank] = max(peak[rank], in_flight[rank])
    return tuple(peak)


def replay(measured: dict) -> Timeline:
    """The measured step of a real pipelined run (toolkit.runs.folder.read_pipeline_timeline), simulated from its own
    times: each chunk's mean duration per virtual stage and kind, plus the rank's median gap between chunks
    when nothing held it up (sends posted, the loss, the schedule's own work), and the median delay of a send
    its receiver sat waiting for. If the simulated step matches the measured one, the schedule model explains
    the run, and what remains to predict is in those durations."""
    spans = measured["timeline"]
    p, n = measured["stages"], measured["stages"] * measured["vpp"]
    local_gap_s, p2p_s = _gaps_s(spans, n)

    def mean_s(kind: str) -> list[float]:
        out = []
        for stage in range(n):
            times = [s["end_s"] - s["start_s"] for s in spans if s["kind"] == kind and s["stage"] == stage]
            out.append(sum(times) / len(times) + local_gap_s.get(stage % p, 0.0) if times else 0.0)
        return out

    forward, backward, weight = mean_s("F"), mean_s("B"), mean_s("W")
    split = measured["schedule"] == "zb-h1"
    return simulate(
        measured["schedule"],
        p,
        measured["microbatches"],
        measured["vpp"],
        forward_s=forward,
        backward_s=[b + w for b, w in zip(backward, weight)] if split else backward,
        weight_s=weight if split else None,
        p2p_s=p2p_s,
    )


def _gaps_s(spans: list[dict], n: int) -> tuple[dict[int, float], float]:
    """({rank: median gap before a chunk whose input was already there}, median wait for a send)."""
    by_key = {(s["kind"], s["micro"], s["stage"]): s for s in spans}
    local: dict[int, list[float]] = {}
    waits = []
    ranks = sorted({s["rank"] for s in spans})
    for rank in ranks:
        mine = sorted((s for s in spans if s["rank"] == rank), key=lambda s: s["start_s"])
        for before, span in zip(mine, mine[1:]):
            key = _input_of(span["kind"], span["micro"], span["stage"], n)
            source = by_key.get(key) if key else None
            if source is not None and source["rank"] != rank and source["end_s"] > before["end_s"]:
                waits.append(max(span["start_s"] - source["end_s"], 0.0))  # it waited for the send
            else:
                local.setdefault(rank, []).append(max(span["start_s"] - before["end_s"], 0.0))
    return {rank: _median(gaps) for rank, gaps in local.items()}, _median(waits)


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0
