"""A measured step read from another framework's training log, so `toolkit calibrate --measured LOG` scales the
model to a user's Megatron, torchtitan or llm-foundry run as it does to a toolkit run folder.

    step_s_of_log(text, tokens_per_step=4096 * 1024, devices=64)   # (seconds a step, "megatron", lines read)

What each framework prints (read from their source):
- Megatron-LM (megatron/training/training.py, training_log): "elapsed time per iteration (ms): 1234.5 |" (newer
  versions "1234.5/1230.1": this interval's, then the recent mean).
- torchtitan (torchtitan/components/metrics.py): "step: 10  loss: ...  tps: 6,542  ..." where tps is tokens a
  second per device (the rank's tokens over the non-data-parallel degree), or "step_time: 1.2345s" where logged.
- Composer / llm-foundry (composer/callbacks/speed_monitor.py): "throughput/batches_per_sec: 0.45".
"""

from __future__ import annotations

import re
import statistics

from ..specs import SpecError

__all__ = ["step_s_of_log", "LOG_WARMUP_LINES"]

LOG_WARMUP_LINES = 2
"""The first timed lines of a log (compilation, allocator growth, the first interval's data wait) left out."""

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUMBER = r"([0-9][0-9,]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?)"
PATTERNS = (
    ("megatron", re.compile(r"elapsed time per iteration \(ms\):\s*" + NUMBER), 1e-3),
    ("torchtitan", re.compile(r"step_time:\s*" + NUMBER + r"\s*s?"), 1.0),
    ("torchtitan", re.compile(r"\btps:\s*" + NUMBER), None),
    ("composer", re.compile(r"throughput/batches_per_sec:\s*" + NUMBER), None),
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def step_s_of_log(text: str, tokens_per_step: float, devices: int) -> tuple[float, str, int]:
    """The median step (seconds) the log's timed lines give after LOG_WARMUP_LINES, which framework wrote them,
    and how many lines were read; torchtitan's tps needs the job's tokens a step and devices to become a step."""
    text = ANSI.sub("", text)
    for name, pattern, scale in PATTERNS:
        values = [_number(m.group(1)) for m in pattern.finditer(text)]
        if not values:
            continue
        kept = values[LOG_WARMUP_LINES:] or values[-1:]
        if scale is not None:
            steps = [v * scale for v in kept]
        elif name == "composer":
            steps = [1.0 / v for v in kept if v > 0]
        else:  # torchtitan's tokens a second per device
            steps = [tokens_per_step / (v * devices) for v in kept if v > 0]
        if steps:
            return statistics.median(steps), name, len(kept)
    raise SpecError(
        "--measured",
        "log",
        "no timed step found: expected Megatron's 'elapsed time per iteration (ms)', torchtitan's 'tps:' or "
        "'step_time:', or Composer's 'throughput/batches_per_sec'; or give --step-s",
    )
