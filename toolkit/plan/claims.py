"""The seed article's numeric claims, each recomputed with the toolkit and given a verdict and a source.

    toolkit claims [--json]

Each check computes its figure from the catalog and the estimator (not from a stored answer), so a changed
catalog row or model changes the verdict's evidence; the verdict words are: true, partly true, misleading,
false, unverified. The article is shared/seed (in Chinese); `article` quotes the sentence checked.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ..estimate import estimate
from ..specs import Job, load_catalog

__all__ = ["Claim", "check_claims"]


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    article: str
    computed: str | None
    """What the toolkit computes, in words with its figures (None where it has no model for it)."""
    verdict: str
    source: str


def _gpt3_budget(cat) -> Claim:
    est = estimate(Job.from_dict({"model": {"preset": "gpt3-175b"}, "tokens": 300e9}), cat)["compute"]
    return Claim(
        "gpt3-pf-days",
        "training GPT-3 needs about 3,640 PF-days",
        "训练一个基础版GPT-3模型需要约3640 PF-days",
        f"{est['pf_days_6nd']:,.0f} PF-days by 6·N·D for 300 B tokens ({est['pf_days']:,.0f} counting attention)",
        "true" if abs(est["pf_days_6nd"] / 3640 - 1) < 0.01 else "false",
        "Brown et al. 2020 (arXiv 2005.14165), Table D.1: 3.14e23 FLOPs",
    )


def _gpt3_time(cat) -> Claim:
    a100 = cat.accelerator("A100-80GB")
    job = Job.from_dict(
        {
            "model": {"preset": "gpt3-175b"},
            "tokens": 300e9,
            "mfu": 1.0,
            "cluster": {"accelerator": "A100-80GB", "count": 1000},
        }
    )
    ideal_days = estimate(job, cat)["time"]["train_days"]
    return Claim(
        "gpt3-1000-a100-3-months",
        "that is 1,000 A100s running for three months",
        "相当于使用1000块NVIDIA A100显卡不间断运行3个月",
        f"{ideal_days:.1f} days at the A100's full {a100.peak_flops('bf16') / 1e12:.0f} TFLOP/s; three months "
        f"means {ideal_days / 91:.0%} MFU, and at the 45 % Megatron-LM reached it is "
        f"{ideal_days / 0.45:.0f} days",
        "misleading",
        "A100 datasheet (catalog); Narayanan et al. 2021 (arXiv 2104.04473) §5.1: ~34 days on 1,024 A100 "
        "at 140 TFLOP/s each",
    )


def _mlu370_memory(cat) -> Claim:
    mlu = cat.accelerator("MLU370-X8")
    return Claim(
        "mlu370-192gb",
        "the MLU370-X8 has 192 GB of HBM2e",
        "MLU370-X8单卡支持192GB HBM2e显存",
        f"{mlu.memory_bytes / 2**30:.0f} GB per card",
        "true" if mlu.memory_bytes >= 192 * 2**30 else "false",
        f"catalog: {mlu.source} ({mlu.as_of})",
    )


def _atlas_flops(cat) -> Claim:
    npu = cat.accelerator("Ascend-910B")
    total = 32 * npu.peak_flops("fp16")
    return Claim(
        "atlas-900-256-pflops",
        "32 Ascend 910B give 256 PFLOPS of FP16",
        "通过32张Ascend 910B加速卡构建的集群可提供256PFLOPS的FP16算力",
        f"32 × {npu.peak_flops('fp16') / 1e12:.0f} TFLOPS = {total / 1e15:.1f} PFLOPS; 256 PFLOPS is about "
        f"{256e15 / npu.peak_flops('fp16'):,.0f} of them",
        "false" if total < 128e15 else "true",
        f"catalog: {npu.source} ({npu.as_of}); the 2019 Atlas 900 had ~1,024 Ascend 910",
    )


def _zero_saving(cat) -> Claim:
    def states(zero):
        return estimate(
            Job.from_dict(
                {
                    "model": {"preset": "llama2-7b"},
                    "precision": {"mode": "mixed-bf16"},
                    "parallel": {"zero": zero},
                    "cluster": {"accelerator": "A100-80GB", "count": 8},
                }
            ),
            cat,
        )["memory"]["states_bytes"]

    base = states(0)
    saved = {z: 1 - states(z) / base for z in (1, 2, 3)}
    return Claim(
        "zero-saves-50",
        "the zero-redundancy optimizer saves up to 50 % of memory",
        "零冗余优化器：节省显存达50%",
        "model states of Llama-2-7B, mixed-bf16 on 8 GPUs: "
        + ", ".join(f"ZeRO-{z} {s:.0%} less" for z, s in saved.items()),
        "false" if saved[1] > 0.5 else "true",
        "Rajbhandari et al. 2019 (arXiv 1910.02054) Fig. 1: 16Ψ per device down to 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N "
        "and 16Ψ/N; understated",
    )


def _fp16_gradients(cat) -> Claim:
    def grad_bytes(mode):
        return estimate(Job.from_dict({"model": {"preset": "llama2-7b"}, "precision": {"mode": mode}}), cat)["memory"][
            "grads_bytes"
        ]

    saved = 1 - grad_bytes("mixed-fp16") / grad_bytes("amp-fp16")
    return Claim(
        "fp16-gradients-75",
        "communicating gradients in FP16 saves 75 % of the bandwidth",
        "通过FP16梯度通信节省75%带宽",
        f"16-bit gradients are {saved:.0%} fewer bytes than fp32 ones, so each all-reduce moves {saved:.0%} less",
        "false" if abs(saved - 0.75) > 0.05 else "true",
        "ZeRO (arXiv 1910.02054) §7; a 4x cut needs quantized communication: ZeRO++ (arXiv 2306.10209), "
        "INT8 weights and INT4 gradients",
    )


def _spot_saving(cat) -> Claim:
    savings = {
        o.name: (1 - o.spot_per_hour_high / o.on_demand_per_hour, 1 - o.spot_per_hour_low / o.on_demand_per_hour)
        for o in cat.offers.values()
        if o.on_demand_per_hour and o.spot_per_hour_low
    }
    lows, highs = [s[0] for s in savings.values()], [s[1] for s in savings.values()]
    overhead = estimate(
        Job.from_dict(
            {
                "model": {"preset": "llama2-70b"},
                "tokens": 2e12,
                "mfu": 0.4,
                "precision": {"mode": "mixed-bf16"},
                "parallel": {"tp": 8, "pp": 4, "zero": 1},
                "cluster": {"count": 512},
                "cost": {"offer": "p5.48xlarge", "spot": True},
            }
        ),
        cat,
    )["cost"]["spot_run"]["overhead_fraction"]
    return Claim(
        "spot-saves-70",
        "spot instances save 70 % of the cost",
        "使用Spot Instance节省70%费用",
        f"spot prices are {min(lows):.0%}-{max(highs):.0%} below on-demand over {len(savings)} catalog "
        f"offers (median {statistics.median(lows + highs):.0%}); interruptions add {overhead:.0%} of wall time "
        "for Llama-2-70B on 512 H100 at 5 % reclaimed a month",
        "partly true" if min(lows) < 0.7 <= max(highs) else ("true" if min(lows) >= 0.7 else "false"),
        "catalog offers (skypilot-catalog, Cyclenerd GCP pricing; dates per row); AWS Spot Advisor bands",
    )


def _int8_activations(cat) -> Claim:
    def memory(compress):
        return estimate(
            Job.from_dict(
                {
                    "model": {"preset": "gpt2-medium"},
                    "batch": {"micro_batch": 8},
                    "memory": {"act_compress": compress},
                    "cluster": {"accelerator": "A100-80GB", "count": 1},
                }
            ),
            cat,
        )["memory"]

    plain, packed = memory("none"), memory("int8")
    acts = 1 - packed["activations_bytes"] / plain["activations_bytes"]
    peak = 1 - packed["peak_bytes"] / plain["peak_bytes"]
    return Claim(
        "int8-activations-50",
        "8-bit quantization saves 50 % of memory with under 1 % accuracy loss",
        "8bit量化：节省50%显存，精度损失<1%",
        f"int8 saved activations (blocks only) of GPT-2 medium, micro-batch 8: activations {acts:.0%} "
        f"smaller, the step's peak {peak:.0%}",
        "true" if peak >= 0.45 else "partly true" if acts >= 0.4 else "false",
        "the runner's Int8Activations (1 + 4/128 bytes a value); accuracy: no primary source for BERT-large "
        "(nearest: ActNN, ICML 2021; GACT, ICML 2022)",
    )


def _checkpointing_scale(cat) -> Claim:
    def fits(layers, recompute):
        return estimate(
            Job.from_dict(
                {
                    "model": {"layers": layers, "hidden": 4096, "heads": 32, "seq_len": 4096, "vocab": 32000},
                    "batch": {"micro_batch": 4, "global_batch": 32},
                    "parallel": {"zero": 3},
                    "precision": {"mode": "mixed-bf16"},
                    "memory": {"recompute": recompute},
                    "cluster": {"accelerator": "A100-80GB", "count": 8},
                }
            ),
            cat,
        )["memory"]["fits"]

    def deepest(recompute):  # bisection over 1..1024 layers
        low, high = 0, 1024
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid, recompute) else (low, mid)
        return low

    plain, full = deepest("none"), deepest("full")
    ratio = full / max(plain, 1)
    return Claim(
        "checkpointing-3x",
        "gradient checkpointing lets the model grow threefold",
        "采用梯度检查点技术将模型规模扩大3倍",
        f"width 4096, 4 × 4,096 tokens per GPU, ZeRO-3 on 8 A100-80GB: the deepest model that fits grows from "
        f"{plain} to {full} layers ({ratio:.1f}x)",
        "true" if ratio >= 3 else "partly true" if ratio >= 1.5 else "false",
        "the toolkit's memory model (within 3 % of the traced program); Chen et al. 2016 (arXiv 1604.06174): "
        "O(sqrt n) memory; the gain depends on the activations' share of memory, so it holds for long "
        "sequences and large micro-batches, not in general",
    )


def _serving_cost(cat, sparsity: str) -> dict:
    job = {
        "model": {"preset": "llama2-7b"},
        "workload": "inference",
        "cluster": {"accelerator": "A100-80GB", "count": 1},
        "cost": {"offer": "p4de.24xlarge"},
        "serving": {"concurrency": "max", "input_tokens": 1024, "output_tokens": 256, "sparsity": sparsity},
    }
    return estimate(Job.from_dict(job, cat), cat)


def _pruning(cat) -> Claim:
    dense, sparse = _serving_cost(cat, "none"), _serving_cost(cat, "2:4")
    before, after = (r["cost"]["usd_per_million_output_tokens"] for r in (dense, sparse))
    cut = 1 - after / before
    return Claim(
        "pruning-60",
        "pruning cuts inference cost by 60 %",
        "通过模型剪枝将推理成本降低60%",
        f"Llama-2-7B served on an A100-80GB (1,024 prompt + 256 new tokens, as many requests as fit): "
        f"${before:.3f} per million output tokens dense, ${after:.3f} with 2:4 sparsity, a {cut:.0%} cut, and that "
        "an upper bound (the sparse tensor cores' doubled peak and half the weight bytes, every block matrix "
        f"pruned; {sparse['serving']['max_concurrency']} requests fit instead of {dense['serving']['max_concurrency']}"
        "): the KV cache, the attention and the unpruned tables keep their cost",
        "false" if cut < 0.5 else "partly true" if cut < 0.6 else "unverified",
        "the toolkit's serving estimate (toolkit.estimate.serving); NVIDIA A100 whitepaper: 2:4 sparsity doubles the "
        "tensor cores' peak; Mishra et al. 2021 (arXiv 2104.08378) measured about 1.5x end-to-end on A100 for BERT, "
        "an encoder whose batched matmuls are all its time: a decoder's KV-cache reads do not shrink",
    )


def _colossal_13b(cat) -> Claim:
    result = estimate(
        Job.from_dict(
            {
                "model": {"preset": "llama2-13b", "seq_len": 1024},
                "precision": {"mode": "amp-bf16"},
                "parallel": {"zero": 3, "offload": "params"},
                "memory": {"recompute": "full"},
                "cluster": {"accelerator": "A100-80GB", "count": 1},
            }
        ),
        cat,
    )["memory"]
    return Claim(
        "colossal-13b-one-gpu",
        "Colossal-AI trains a 13 B model on one GPU",
        "可在单卡上运行130亿参数模型",
        f"Llama-2-13B, ZeRO-3 with CPU offload and full recompute on one A100-80GB: "
        f"{result['device_peak_bytes'] / 2**30:.0f} GiB on the device, {result['host_bytes'] / 2**30:.0f} GiB "
        f"of host memory",
        "true" if result["fits"] else "false",
        "HPC-AI Tech blog (hpc-ai.com): up to 18 B on one consumer GPU with Gemini CPU offload; needs that host "
        "memory, and runs slowly",
    )


def _rtx4090_finetune(cat) -> Claim:
    job = Job.from_dict(
        {
            "model": {"preset": "llama2-7b", "seq_len": 512},
            "precision": {"mode": "pure-bf16"},
            "finetune": {"method": "lora", "rank": 16, "targets": ["q", "v"]},
            "cluster": {"accelerator": "RTX-4090", "count": 1},
        }
    )
    lora = estimate(job, cat)["memory"]
    full = estimate(job.replace(finetune=Job().finetune), cat)["memory"]
    return Claim(
        "rtx4090-finetune",
        "2-4 RTX 4090 (24 GB) suffice to fine-tune",
        "配置2-4张RTX 4090（24GB显存）用于模型微调",
        f"Llama-2-7B with LoRA (q, v; rank 16), bf16, 512 tokens: {lora['device_peak_bytes'] / 2**30:.1f} GiB "
        f"on one card ({'fits' if lora['fits'] else 'does not fit'}); full fine-tuning "
        f"{full['device_peak_bytes'] / 2**30:.0f} GiB",
        "true" if lora["fits"] else "false",
        "RTX 4090: NVIDIA Ada whitepaper (catalog); LoRA: Hu et al. 2021 (arXiv 2106.09685)",
    )


def _oneflow_utilisation(cat) -> Claim:
    return Claim(
        "oneflow-95",
        "OneFlow reaches 95 % hardware utilisation on ResNet-50",
        "在ResNet50训练中可实现95%的硬件利用率",
        None,
        "misleading",
        "OneFlow DLPerf report (2020-10): 97.5 % scaling efficiency over 32 V100 in fp32 (70 % with AMP), "
        "which is not FLOP utilisation; the toolkit models transformers, not ResNet",
    )


CHECKS = (
    _gpt3_budget,
    _gpt3_time,
    _mlu370_memory,
    _atlas_flops,
    _zero_saving,
    _fp16_gradients,
    _spot_saving,
    _int8_activations,
    _checkpointing_scale,
    _pruning,
    _colossal_13b,
    _rtx4090_finetune,
    _oneflow_utilisation,
)


def check_claims(catalog=None) -> list[Claim]:
    """Every claim, recomputed."""
    catalog = catalog or load_catalog()
    return [check(catalog) for check in CHECKS]


def claims_json(catalog=None) -> dict:
    """The JSON contract: {"claims": [{"claim", "computed", "verdict", "source", ...}]}."""
    return {"claims": [asdict(c) for c in check_claims(catalog)]}
