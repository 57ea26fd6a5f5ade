"""int8 compression of saved activations: bytes saved against bf16, and what it costs the loss.

    .venv/bin/python benchmarks/int8_activations.py [--steps 200]

Bytes: one forward of the runner's GPT in pure-bf16 (every block activation is bf16), counting every
tensor the blocks save for backward, with and without compression (weights excluded: they are kept
anyway). Loss: two real runs of `steps` steps (amp-bf16, same seed and data), with and without int8;
the mean training loss of the last 10 steps of each, and their relative difference, printed last.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.program.model import GPT  # noqa: E402
from toolkit.program.techniques import Int8Activations  # noqa: E402
from toolkit.runs.folder import read_metrics  # noqa: E402
from toolkit.specs import Job, ModelSpec  # noqa: E402
from toolkit.train.data import ensure_demo_corpus  # noqa: E402
from toolkit.train.launch import prepare_run  # noqa: E402
from toolkit.train.loop import run_training  # noqa: E402

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 128}


def saved_bytes(compress: bool) -> int:
    """Bytes the blocks save for backward in one bf16 forward (weights excluded)."""
    torch.manual_seed(0)
    model = GPT(ModelSpec(**MODEL), dtype=torch.bfloat16)
    int8 = Int8Activations(model)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total, seen = {"bytes": 0}, set()

    def count(packed):  # each distinct tensor once, however many ops save it
        key = (
            id(packed)
            if not isinstance(packed, torch.Tensor)
            else (packed.untyped_storage().data_ptr(), packed.storage_offset(), tuple(packed.shape))
        )
        if key in seen:
            return packed
        seen.add(key)
        if isinstance(packed, torch.Tensor):
            if packed.untyped_storage().data_ptr() not in weights:
                total["bytes"] += packed.numel() * packed.element_size()
        else:
            total["bytes"] += packed[0].numel() + 4 * packed[1].numel()
        return packed

    pack = int8._pack if compress else (lambda t: t)
    int8._pack = lambda t: count(pack(t))
    int8.active = True
    tokens = torch.randint(0, 256, (8, MODEL["seq_len"] + 1), generator=torch.Generator().manual_seed(1))
    model(tokens[:, :-1], tokens[:, 1:])
    return total["bytes"]


def final_loss(act_compress: str, steps: int, folder: Path, data: Path) -> float:
    job = Job.from_dict(
        {
            "model": MODEL,
            "batch": {"micro_batch": 8, "global_batch": 16},
            "precision": {"mode": "amp-bf16"},
            "memory": {"act_compress": act_compress},
            "training": {"steps": steps, "warmup_steps": 10, "lr": 2e-3, "checkpoint_every": 0, "data": str(data)},
        }
    )
    prepare_run(job, folder, 1)
    run_training(job, folder, progress=False)
    losses = [r["loss"] for r in read_metrics(folder / "metrics.jsonl")][-10:]
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    plain, packed = saved_bytes(False), saved_bytes(True)
    with tempfile.TemporaryDirectory() as tmp:
        data = ensure_demo_corpus(tmp)
        base = final_loss("none", args.steps, Path(tmp) / "none", data)
        int8 = final_loss("int8", args.steps, Path(tmp) / "int8", data)
    print(f"saved by the blocks, bf16: {plain / 2**20:.2f} MiB; with int8: {packed / 2**20:.2f} MiB")
    print(f"loss after {args.steps} steps (mean of last 10): none {base:.4f}, int8 {int8:.4f}")
    print(f"bytes below bf16: {1 - packed / plain:.1%}")
    print(f"loss difference: {abs(int8 - base) / base:.2%}")


if __name__ == "__main__":
    main()
