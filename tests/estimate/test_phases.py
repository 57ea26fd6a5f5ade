"""Each moment of the step, as its own function, against the traced program on a job whose traced peak it holds.

The moments of DeepSpeed's buckets (`head gradient`, `gradient reduce`) and of pipeline schedules (`step end`,
`next micro-batch`) need gloo ranks to trace; their peaks are checked in tests/trace/test_zero.py and
tests/trace/test_pipeline.py and by benchmarks/memory_accuracy.py.
"""

import pytest

from toolkit.estimate import phases as ph
from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory

SMALL_GPT = {"preset": "gpt2", "layers": 4, "hidden": 192, "heads": 3, "seq_len": 128, "max_positions": 128}
SMALL_VOCAB = dict(SMALL_GPT, vocab=500)


TP_GPT = {
    "preset": "gpt2",
    "layers": 2,
    "hidden": 256,
    "heads": 4,
    "seq_len": 32,
    "max_positions": 32,
    "tie_embeddings": False,
    "vocab": 8000,
}
QLORA_LLAMA = {
    "preset": "llama2-7b",
    "layers": 2,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 8,
    "ffn": 1536,
    "seq_len": 64,
    "vocab": 512,
}


def job(model, b=1, accum=1, rec="none", dp=1, zero=0, tp=1, mode="amp-bf16", finetune=None) -> Job:
    return Job.from_dict(
        {
            "model": model,
            "batch": {"micro_batch": b, "global_batch": b * accum * dp},
            "precision": {"mode": mode},
            "parallel": {"zero": zero, "tp": tp},
            "finetune": finetune or {},
            "cluster": {"count": dp * tp},
            "memory": {"recompute": rec, "program": "cpu"},
        }
    ).resolve()[0]


def _layer(done):
    return lambda t: ph.backward_layer(t, done(t.acts.stage_layers), bottom=False)


CASES = {  # moment: (its function, a job whose trace peaks there)
    "forward end": (ph.forward_end, job(SMALL_VOCAB, b=2, dp=8, zero=2)),
    "loss": (ph.loss, job(SMALL_GPT, b=2)),
    "top layer": (_layer(lambda n: 0), job(SMALL_VOCAB, accum=2)),
    "top layer reduce-scatter": (ph.top_layer_reduce_scatter, job(SMALL_VOCAB, dp=8, zero=3)),
    "layer below the top": (_layer(lambda n: 1), job(SMALL_VOCAB, b=2, rec="full", dp=8, zero=2)),
    "layer above the bottom": (_layer(lambda n: n - 2), job(SMALL_VOCAB, rec="full", dp=8, zero=3)),
    "bottom layer": (
        lambda t: ph.backward_layer(t, t.acts.stage_layers - 1, bottom=True),
        job(SMALL_VOCAB, b=4, rec="full"),
    ),
    "optimizer step": (ph.optimizer_step, job(SMALL_GPT)),
    # tensor parallelism: torch's backward of the row-sharded table makes the whole vocabulary's gradient first
    "embedding backward": (ph.embedding_backward, job(TP_GPT, b=2, tp=2)),
    # QLoRA: the top block's down projection being dequantized
    "top layer forward": (
        ph.top_layer_forward,
        job(QLORA_LLAMA, mode="pure-bf16", finetune={"method": "qlora", "rank": 8, "targets": ["q", "v"]}),
    ),
}


@pytest.mark.parametrize("moment", CASES)
def test_each_moment_meets_the_trace_where_it_holds_the_peak(moment):
    function, j = CASES[moment]
    terms = ph.stage_terms(j, "first")
    traced = trace_memory(j).peak_bytes
    assert float(function(terms)) == pytest.approx(traced, rel=0.03)
    assert memory_estimate(j).peak_phase == moment  # and the model puts the peak there too


def test_the_moments_are_the_estimates_phases():
    """stage_phases assembles exactly the functions above (the estimate's phases, in the order the step runs)."""
    j = job(SMALL_VOCAB, dp=8, zero=3, rec="full")
    terms = ph.stage_terms(j, "first")
    phases = memory_estimate(j).phases
    assert list(phases)[:6] == [
        "forward end",
        "loss",
        "top layer",
        "top layer reduce-scatter",
        "layer below the top",
        "layer above the bottom",
    ]
    for moment, (function, _) in CASES.items():
        if moment != "top layer forward":  # (QLoRA's and int8's only)
            assert float(function(terms)) == float(phases[moment]), moment
