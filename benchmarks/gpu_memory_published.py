"""The estimate against GPU memory that others measured and published with their layouts.

    .venv/bin/python benchmarks/gpu_memory_published.py           # every row, then the headline
    .venv/bin/python benchmarks/gpu_memory_published.py --json    # the rows as JSON

Each published figure is compared with the estimate's figure of the same definition:

- BigScience's BLOOM-176B layout search (A100-80GB, Megatron-DeepSpeed, bf16 (fp16 in three rows of 02-17),
  ZeRO-1, full activation checkpointing, sequence 2048, vocabulary 250k; `nvidia-smi` of the busiest node, the
  first or last stage with the word embeddings): bigscience-workshop/bigscience,
  train/tr11-176B-ml/chronicles-prequel.md, from "Best TFLOPs" (2022-02-17) and "tile and wave quantization"
  (02-20) to "48 node contenders" (02-21), "GBS Variations" (02-25), "Another round of NHEADS" and "Re-do"
  (02-26/27) and "Rebalancing layers" (02-28); every row whose layer count the document fixes. Left out: the
  02-20 topology table (its layer counts were "tweaked to fit PP" and not given) and 13824 x 84's dp 8 pp 6
  micro-batch 2 reading of 02-21 (65 GB, 9 GB above the same layout at micro-batch 4, which no program that
  holds more per micro-batch can give). "GB" there is
  nvidia-smi's MiB / 1024, read as GiB. From 02-28 on they ran DeepSpeed's new BF16 optimizer (an fp32 gradient
  buffer of 4 bytes per parameter, not sharded, beside the bf16 gradients) and gave each embedding its own
  pipeline slot (`type:transformer|embedding`), which the rows give as DeepSpeed's partition method
  (`parallel.partition`, toolkit.specs.partition). Their DeepSpeed configuration sets only the ZeRO stage
  (train/tr11-176B-ml/tr11-176B-ml.slurm), so the rows keep DeepSpeed's default reduce bucket of 5e8 elements, and
  they kept Megatron's default dropout, 0.1 on attention and hidden states (train/tr11-176B-ml/README.md, "The
  default Megatron-LM dropout settings are inherited"): the embedding's mask is held for every micro-batch in
  flight, a block's while that block recomputes.
  The 14336 x 82 layout that ran out of memory (02-28) stays missed: its neighbours measured 59-63 GB (13312 x 82
  and 14336 x 70, at 64 to 128 heads: heads barely change the reading), which with one more block a stage puts its
  steady state near 66 GiB; the document gives no cause, and no term of the step's memory reaches 80. The same
  day's 13312 x 94 (128 heads, the same dp 8 tp 4 pp 12 mb 2) ran at 67 GB with 0.9 % fewer parameters on its
  embedding stage (4.557 B against 4.599 B) and a 7 % narrower block: a model that called 14336 x 82 out of
  memory would call that one out of memory too.
  The same document measured the CUDA context of that software (every kernel loaded at start): 1,573 MiB on an
  A100-40GB; the rows use it instead of the default assumption.
- torchtitan's Llama 3.1 benchmark (H100 96 GB HBM2e, FSDP2 / TP / PP / CP, bf16 parameters with fp32
  reduction, AdamW, sequence 8192 as in its llama3 train configs): pytorch/torchtitan
  benchmarks/llama3_h100_202412_torchtitan.md (2024-12); its "Memory" is torch.cuda.max_memory_reserved (the
  trainer logs `max_reserved_gib`). And Trainy's Llama 3.1 8B on 4 and 8 nodes of 8 H200 (FSDP2 over all of them,
  local batch 2, torch.compile, Float8 with FSDP's float8 all-gather, the 8B config's per-op selective
  checkpointing, sequence 8192; "Memory(GiB)" at the 100th step): benchmarks/llama3_8b_h200_2025-06_torchtitan.md
  (2025-06). Its two rows read about 22 GiB under the estimate, though the same policy without torch.compile and
  Float8 is matched on H100 (the fsdp8 sac row). A block compiled under that policy keeps what the eager one does
  but its last matmul's output, which its backward never reads (checked on CPU, torch 2.13): about 4 GiB of it.
  The rest is not explained.

torchtitan's "selective" rows use its per-op policy (train_configs/llama3_8b.toml: `mode = 'selective'`,
`selective_ac_option = 'op'`), which the estimate models as `recompute: selective-op` (the runner's program keeps the same tensors).
FSDP under torchtitan's pipelines (blocks gathered and gradients whole through the step) is the runner's program
for pp with ZeRO-2/3 and is modelled. Rows marked with a technique the estimate does not model (torch.compile,
what Float8 linears save for backward) are reported and counted apart. FSDP2's Float8 all-gather (torchtitan's
405B config: `enable_fsdp_float8_all_gather`) is modelled (`precision.fp8_all_gather`: the blocks' linear weights
gathered in 1 byte).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

from toolkit.estimate.report import estimate
from toolkit.specs import Job
from toolkit.specs.catalog import load_catalog

GIB, MIB = 2**30, 2**20
BLOOM = "bigscience train/tr11-176B-ml/chronicles-prequel.md"
TITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TITAN_H200 = "torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md"
BLOOM_CONTEXT_BYTES = 1573 * MIB
"""CUDA context with eager kernel loading, measured in the BLOOM document (A100-40GB, 2022)."""


def bloom(
    h, layers, heads, dp, tp, pp, mb, gbs=2048, partition="type:transformer", zero=1, grads="param", mode="mixed-bf16"
):
    """A BLOOM-search job: Megatron-DeepSpeed GPT (ALiBi: no position table), tied 250k embeddings, Megatron's
    default dropout of 0.1, DeepSpeed's engine (grads fp32: its BF16 optimizer), stages split by DeepSpeed's
    `partition` method (GPTModelPipe's `type:transformer` until 02-28), apex's FusedAdam (Megatron's Adam; the
    document opens by measuring it against torch.optim.Adam, 51 GB against 61 GB on the first node) with no
    temporaries."""
    model = {
        "layers": layers,
        "hidden": h,
        "heads": heads,
        "vocab": 250880,
        "seq_len": 2048,
        "mlp": "gelu",
        "norm": "layernorm",
        "position": "rope",
        "tie_embeddings": True,
        "dropout": 0.1,
    }
    return {
        "model": model,
        "batch": {"micro_batch": mb, "global_batch": gbs},
        "precision": {"mode": mode, "grad_dtype": grads},
        "optimizer": {"impl": "fused"},
        "parallel": {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "zero": zero,
            "partition": partition if pp > 1 else None,
            "backend": "deepspeed",
        },
        "memory": {"recompute": "full", "attention": "eager"},
        "cluster": {"accelerator": "A100-80GB", "count": dp * tp * pp, "gpus_per_node": 8},
        "training": {"bucket_cap_mb": DEEPSPEED_BUCKET_ELEMENTS * 2 / MIB},
    }


DEEPSPEED_BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default reduce bucket (deepspeed/runtime/zero/config.py: reduce_bucket_size 5e8 elements): BLOOM's
DeepSpeed configuration (train/tr11-176B-ml/tr11-176B-ml.slurm) sets only the ZeRO stage, so its ZeRO-1 keeps a
1 GB bucket in bf16, not the toolkit's 25 MB default."""


EMBEDDING_SLOTS = "type:transformer|embedding"
"""From 02-28: both embeddings take a layer's slot in DeepSpeed's balance, so the end stages hold fewer blocks."""


def titan(
    preset,
    seq,
    mb,
    gbs,
    dp,
    tp=1,
    pp=1,
    vpp=1,
    cp=1,
    recompute="full",
    fp8=False,
    fp8_all_gather=False,
    accelerator="H100-SXM",
):
    """A torchtitan Llama 3.1 job: FSDP2 (ZeRO-3) over dp, DTensor tp with sequence parallelism; Float8 linears
    (`fp8`), gathered by FSDP2 in float8 (`fp8_all_gather`: its 405B config's enable_fsdp_float8_all_gather)."""
    return {
        "model": {"preset": preset, "seq_len": seq},
        "batch": {"micro_batch": mb, "global_batch": gbs},
        "precision": {"mode": "amp-bf16", "fp8": fp8, "fp8_all_gather": fp8_all_gather},
        "parallel": {"dp": dp, "tp": tp, "sp": tp > 1, "pp": pp, "vpp": vpp, "cp": cp, "zero": 3},
        "memory": {"recompute": recompute, "attention": "flash"},
        "cluster": {"accelerator": accelerator, "count": dp * tp * pp * cp, "gpus_per_node": 8},
    }


COMPILE = "torch.compile"
FP8 = "Float8 linears (what they save for backward)"
BRANCH = "ran on another DeepSpeed branch than its ZeRO-1 neighbours (the document says so), optimizer not stated"

# (name, source, definition, measured GiB or "OOM", job, unmodelled techniques)
ROWS = [
    ("bloom 14336x72 dp4 tp8 pp12 mb1", BLOOM, "device", 29, bloom(14336, 72, 64, 4, 8, 12, 1), ()),
    ("bloom 14336x72 dp4 tp8 pp12 mb2", BLOOM, "device", 37, bloom(14336, 72, 64, 4, 8, 12, 2), ()),
    ("bloom 14336x72 dp4 tp8 pp12 mb4", BLOOM, "device", 49, bloom(14336, 72, 64, 4, 8, 12, 4), ()),
    ("bloom 14336x72 dp4 tp8 pp12 mb8", BLOOM, "device", 69, bloom(14336, 72, 64, 4, 8, 12, 8), ()),
    ("bloom 14336x72 dp8 tp8 pp6 mb1", BLOOM, "device", 38, bloom(14336, 72, 64, 8, 8, 6, 1), ()),
    ("bloom 14336x72 dp8 tp8 pp6 mb2", BLOOM, "device", 44, bloom(14336, 72, 64, 8, 8, 6, 2), ()),
    ("bloom 14336x72 dp8 tp8 pp6 mb4", BLOOM, "device", 56, bloom(14336, 72, 64, 8, 8, 6, 4), ()),
    (
        "bloom 14336x72 dp4 tp8 pp12 mb2 zero0",
        BLOOM,
        "device",
        72,
        bloom(14336, 72, 64, 4, 8, 12, 2, zero=0),
        (BRANCH,),
    ),
    ("bloom 13824x84 dp4 tp8 pp12 mb2", BLOOM, "device", 39, bloom(13824, 84, 64, 4, 8, 12, 2), ()),
    ("bloom 13824x84 dp4 tp8 pp12 mb4", BLOOM, "device", 52, bloom(13824, 84, 64, 4, 8, 12, 4), ()),
    ("bloom 13824x84 dp8 tp8 pp6 mb4", BLOOM, "device", 56, bloom(13824, 84, 64, 8, 8, 6, 4), ()),
    # 02-26 and 02-27: 13824 x 78 (78 blocks on 12 stages: DeepSpeed gives the last stage one), and the embedding
    # slots before the BF16 optimizer
    ("bloom 13824x78 dp8 tp4 pp12 mb2", BLOOM, "device", 48, bloom(13824, 78, 64, 8, 4, 12, 2), ()),
    ("bloom 13824x78 dp8 tp4 pp12 mb2 h96", BLOOM, "device", 48, bloom(13824, 78, 96, 8, 4, 12, 2), ()),
    ("bloom 13824x78 dp8 tp8 pp6 mb4 h96", BLOOM, "device", 59, bloom(13824, 78, 96, 8, 8, 6, 4), ()),
    ("bloom 13824x78 dp16 tp4 pp6 mb4 h96", BLOOM, "device", 75, bloom(13824, 78, 96, 16, 4, 6, 4), ()),
    (
        "bloom 12288x106 dp8 tp4 pp12 mb2 h96 slots",
        BLOOM,
        "device",
        44,
        bloom(12288, 106, 96, 8, 4, 12, 2, partition=EMBEDDING_SLOTS),
        (),
    ),
    # 02-17: the first single-node and 10-node runs, 14400 wide (TP 8, micro-batch 1), in fp16 and in bf16
    (
        "bloom 14400x8 h32 dp1 tp8 pp1 mb1 fp16",
        BLOOM,
        "device",
        67,
        bloom(14400, 8, 32, 1, 8, 1, 1, mode="mixed-fp16"),
        (),
    ),
    (
        "bloom 14400x80 h96 dp1 tp8 pp10 mb1 fp16",
        BLOOM,
        "device",
        73,
        bloom(14400, 80, 96, 1, 8, 10, 1, mode="mixed-fp16"),
        (),
    ),
    (
        "bloom 14400x80 h96 dp2 tp8 pp10 mb1 fp16",
        BLOOM,
        "device",
        51,
        bloom(14400, 80, 96, 2, 8, 10, 1, mode="mixed-fp16"),
        (),
    ),
    ("bloom 14400x8 h32 dp1 tp8 pp1 mb1", BLOOM, "device", 68, bloom(14400, 8, 32, 1, 8, 1, 1), ()),
    ("bloom 14400x80 h96 dp1 tp8 pp10 mb1", BLOOM, "device", 75, bloom(14400, 80, 96, 1, 8, 10, 1), ()),
    ("bloom 14400x80 h96 dp2 tp8 pp10 mb1", BLOOM, "device", 53, bloom(14400, 80, 96, 2, 8, 10, 1), ()),
    # 02-20: 13824 x 80 on 40 nodes (187B)
    ("bloom 13824x80 dp4 tp8 pp10 mb1", BLOOM, "device", 33, bloom(13824, 80, 64, 4, 8, 10, 1), ()),
    ("bloom 13824x80 dp4 tp8 pp10 mb2", BLOOM, "device", 39, bloom(13824, 80, 64, 4, 8, 10, 2), ()),
    ("bloom 13824x80 dp4 tp8 pp10 mb4", BLOOM, "device", 53, bloom(13824, 80, 64, 4, 8, 10, 4), ()),
    ("bloom 13824x80 dp4 tp8 pp10 mb8", BLOOM, "device", 73, bloom(13824, 80, 64, 4, 8, 10, 8), ()),
    # 02-25: GBS and TP variations, 14336 x 72, 64 heads
    ("bloom 14336x72 dp8 tp8 pp6 mb6 gbs2016", BLOOM, "device", 66, bloom(14336, 72, 64, 8, 8, 6, 6, 2016), ()),
    ("bloom 14336x72 dp6 tp8 pp8 mb4 gbs2016", BLOOM, "device", 52, bloom(14336, 72, 64, 6, 8, 8, 4, 2016), ()),
    ("bloom 14336x72 dp12 tp8 pp4 mb2 gbs2016", BLOOM, "device", 53, bloom(14336, 72, 64, 12, 8, 4, 2, 2016), ()),
    ("bloom 14336x72 dp12 tp8 pp4 mb4 gbs2016", BLOOM, "device", 59, bloom(14336, 72, 64, 12, 8, 4, 4, 2016), ()),
    ("bloom 14336x72 dp24 tp8 pp2 mb1 gbs2016", BLOOM, "device", 65, bloom(14336, 72, 64, 24, 8, 2, 1, 2016), ()),
    ("bloom 14336x72 dp24 tp8 pp2 mb2 gbs2016", BLOOM, "device", 76, bloom(14336, 72, 64, 24, 8, 2, 2, 2016), ()),
    ("bloom 14336x72 dp48 tp8 pp1 mb1 gbs2016", BLOOM, "device", "OOM", bloom(14336, 72, 64, 48, 8, 1, 1, 2016), ()),
    ("bloom 14336x72 dp8 tp4 pp12 mb4", BLOOM, "device", 60, bloom(14336, 72, 64, 8, 4, 12, 4), ()),
    ("bloom 14336x72 dp16 tp4 pp6 mb4", BLOOM, "device", 75, bloom(14336, 72, 64, 16, 4, 6, 4), ()),
    ("bloom 14336x72 dp16 tp4 pp6 mb2", BLOOM, "device", 57, bloom(14336, 72, 64, 16, 4, 6, 2), ()),
    ("bloom 14336x72 dp16 tp2 pp12 mb2", BLOOM, "device", 63, bloom(14336, 72, 64, 16, 2, 12, 2), ()),
    ("bloom 14336x72 dp32 tp2 pp6 mb2", BLOOM, "device", "OOM", bloom(14336, 72, 64, 32, 2, 6, 2), ()),
    ("bloom 14336x72 dp32 tp2 pp6 mb1", BLOOM, "device", "OOM", bloom(14336, 72, 64, 32, 2, 6, 1), ()),
    ("bloom 14336x72 dp8 tp2 pp24 mb1", BLOOM, "device", 44, bloom(14336, 72, 64, 8, 2, 24, 1), ()),
    ("bloom 14336x72 dp8 tp2 pp24 mb2", BLOOM, "device", 53, bloom(14336, 72, 64, 8, 2, 24, 2), ()),
    ("bloom 12288x96 dp8 tp1 pp48 mb1", BLOOM, "device", 58, bloom(12288, 96, 64, 8, 1, 48, 1), ()),
    # 02-28: DeepSpeed's BF16 optimizer and embeddings in their own pipeline slots
    (
        "bloom 12288x100 dp16 tp4 pp6 mb1 bf16opt",
        BLOOM,
        "device",
        "OOM",
        bloom(12288, 100, 64, 16, 4, 6, 1, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x100 dp8 tp8 pp6 mb2 bf16opt",
        BLOOM,
        "device",
        61,
        bloom(12288, 100, 64, 8, 8, 6, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x100 dp8 tp8 pp6 mb4 bf16opt",
        BLOOM,
        "device",
        72,
        bloom(12288, 100, 64, 8, 8, 6, 4, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x106 dp8 tp4 pp12 mb2 bf16opt",
        BLOOM,
        "device",
        67,
        bloom(12288, 106, 64, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x82 dp4 tp8 pp12 mb4 bf16opt",
        BLOOM,
        "device",
        52,
        bloom(13312, 82, 64, 4, 8, 12, 4, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x82 dp8 tp4 pp12 mb2 bf16opt",
        BLOOM,
        "device",
        63,
        bloom(13312, 82, 64, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x82 dp8 tp4 pp12 mb4 bf16opt",
        BLOOM,
        "device",
        74,
        bloom(13312, 82, 64, 8, 4, 12, 4, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x70 dp4 tp8 pp12 mb2 bf16opt",
        BLOOM,
        "device",
        40,
        bloom(14336, 70, 64, 4, 8, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x70 dp8 tp4 pp12 mb2 bf16opt",
        BLOOM,
        "device",
        59,
        bloom(14336, 70, 64, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x70 dp8 tp4 pp12 mb4 bf16opt",
        BLOOM,
        "device",
        73,
        bloom(14336, 70, 64, 8, 4, 12, 4, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x106 dp8 tp4 pp12 mb2 h96 bf16opt",
        BLOOM,
        "device",
        65,
        bloom(12288, 106, 96, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x106 dp8 tp4 pp12 mb2 h128 bf16opt",
        BLOOM,
        "device",
        67,
        bloom(12288, 106, 128, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 12288x106 dp8 tp4 pp12 mb4 h96 bf16opt",
        BLOOM,
        "device",
        79,
        bloom(12288, 106, 96, 8, 4, 12, 4, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x82 dp8 tp4 pp12 mb2 h104 bf16opt",
        BLOOM,
        "device",
        62,
        bloom(13312, 82, 104, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x82 dp8 tp4 pp12 mb2 h128 bf16opt",
        BLOOM,
        "device",
        60,
        bloom(13312, 82, 128, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 13312x94 dp8 tp4 pp12 mb2 h128 bf16opt",
        BLOOM,
        "device",
        67,
        bloom(13312, 94, 128, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x70 dp8 tp4 pp12 mb2 h112 bf16opt",
        BLOOM,
        "device",
        59,
        bloom(14336, 70, 112, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x70 dp8 tp4 pp12 mb2 h128 bf16opt",
        BLOOM,
        "device",
        60,
        bloom(14336, 70, 128, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    (
        "bloom 14336x82 dp8 tp4 pp12 mb2 bf16opt",
        BLOOM,
        "device",
        "OOM",
        bloom(14336, 82, 128, 8, 4, 12, 2, partition=EMBEDDING_SLOTS, grads="fp32"),
        (),
    ),
    # torchtitan, Llama 3.1 on H100 96 GB (reserved)
    (
        "titan 8B fsdp8 lb2 sac",
        TITAN,
        "reserved",
        82.4,
        titan("llama3-8b", 8192, 2, 16, 8, recompute="selective-op"),
        (),
    ),
    (
        "titan 8B fsdp128 lb2 sac",
        TITAN,
        "reserved",
        67.0,
        titan("llama3-8b", 8192, 2, 256, 128, recompute="selective-op"),
        (),
    ),
    (
        "titan 8B fsdp8 seq32k full",
        TITAN,
        "reserved",
        83.9,
        titan("llama3-8b", 32768, 1, 8, 8, fp8=True),
        (COMPILE, FP8),
    ),
    (
        "titan 8B fsdp4 cp2 seq64k full",
        TITAN,
        "reserved",
        84.2,
        titan("llama3-8b", 65536, 1, 4, 4, cp=2, fp8=True),
        (COMPILE, FP8),
    ),
    (
        "titan 8B fsdp2 cp4 seq128k full",
        TITAN,
        "reserved",
        84.0,
        titan("llama3-8b", 131072, 1, 2, 2, cp=4, fp8=True),
        (COMPILE, FP8),
    ),
    (
        "titan 8B cp8 seq256k full",
        TITAN,
        "reserved",
        84.5,
        titan("llama3-8b", 262144, 1, 1, 1, cp=8, fp8=True),
        (COMPILE, FP8),
    ),
    (
        "titan 70B fsdp32 tp8 lb16 full",
        TITAN,
        "reserved",
        71.9,
        titan("llama3-70b", 8192, 16, 512, 32, tp=8, fp8=True),
        (COMPILE, FP8),
    ),
    (
        "titan 405B fsdp8 tp8 pp8 1f1b",
        TITAN,
        "reserved",
        82.5,
        titan("llama3-405b", 8192, 4, 256, 8, tp=8, pp=8, fp8=True, fp8_all_gather=True),
        (COMPILE, FP8),
    ),
    (
        "titan 405B fsdp8 tp8 pp8 interleaved",
        TITAN,
        "reserved",
        72.7,
        titan("llama3-405b", 8192, 2, 256, 8, tp=8, pp=8, vpp=2, fp8=True, fp8_all_gather=True),
        (COMPILE, FP8),
    ),
    # torchtitan, Llama 3.1 8B on 4 and 8 nodes of 8 H200 (reserved at the 100th step), per-op SAC as in its 8B config
    (
        "titan 8B fsdp32 lb2 sac h200",
        TITAN_H200,
        "reserved",
        47.96,
        titan(
            "llama3-8b", 8192, 2, 64, 32, recompute="selective-op", fp8=True, fp8_all_gather=True, accelerator="H200"
        ),
        (COMPILE, FP8),
    ),
    (
        "titan 8B fsdp64 lb2 sac h200",
        TITAN_H200,
        "reserved",
        46.97,
        titan(
            "llama3-8b", 8192, 2, 128, 64, recompute="selective-op", fp8=True, fp8_all_gather=True, accelerator="H200"
        ),
        (COMPILE, FP8),
    ),
]


def _catalog():
    """The built-in catalog with the rows' hardware as published: the BLOOM software's measured CUDA context,
    and torchtitan's H100 with 96 GB of HBM2e (the Grand Teton SKU, not the catalog's 80 GB SXM5)."""
    cat = load_catalog()
    accs = dict(cat.accelerators)
    for key, acc in accs.items():
        if acc.name == "A100-80GB":
            accs[key] = dataclasses.replace(acc, device_memory={"context_bytes": BLOOM_CONTEXT_BYTES})
        if acc.name == "H100-SXM":
            accs[key] = dataclasses.replace(acc, memory_bytes=96 * GIB)
    return dataclasses.replace(cat, accelerators=accs)


def evaluate() -> list[dict]:
    cat, out = _catalog(), []
    for name, source, definition, measured, job, unmodelled in ROWS:
        est = estimate(Job.from_dict(job), cat)
        mem = est["memory"]
        figure = mem["device_peak_bytes"] if definition == "device" else mem["reserved_peak_bytes"]
        row = {
            "name": name,
            "source": source,
            "definition": definition,
            "measured_gib": measured,
            "estimate_gib": figure / GIB,
            "tensors_gib": mem["peak_bytes"] / GIB,
            "fits": mem["fits"],
            "unmodelled": list(unmodelled),
        }
        if measured != "OOM":
            row["error"] = figure / GIB / measured - 1
        out.append(row)
    return out


def main(argv: list[str]) -> int:
    rows = evaluate()
    if "--json" in argv:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'row':44} {'def':8} {'published':>9} {'estimate':>9} {'tensors':>8} {'error':>7}  unmodelled")
    for r in rows:
        pub = r["measured_gib"] if r["measured_gib"] == "OOM" else f"{r['measured_gib']:.1f}"
        est = f"{r['estimate_gib']:.1f}" + ("" if r["fits"] else "*")
        err = f"{r['error']:+.1%}" if "error" in r else ("OOM ok" if not r["fits"] else "MISSED")
        print(
            f"{r['name']:44} {r['definition']:8} {pub:>9} {est:>9} {r['tensors_gib']:8.1f} {err:>7}  "
            + "; ".join(r["unmodelled"])
        )
    print("(* = the estimate calls it out of memory)")
    measured = [r for r in rows if "error" in r]
    modelled = [r for r in measured if not r["unmodelled"]]
    ooms = [r for r in rows if r["measured_gib"] == "OOM"]
    false_oom = [r for r in measured if not r["fits"]]
    print()
    for label, subset in (("modelled", modelled), ("all", measured)):
        errors = [abs(r["error"]) for r in subset]
        print(f"{label} rows mean |error|: {statistics.mean(errors):.1%}")
        print(f"{label} rows max |error|: {max(errors):.1%}")
        print(f"{label} rows: {len(subset)}")
    print(f"signed mean error (all): {statistics.mean(r['error'] for r in measured):+.1%}")
    print(f"published OOM layouts called OOM: {sum(not r['fits'] for r in ooms)}/{len(ooms)}")
    print(f"published fitting layouts called OOM: {len(false_oom)}/{len(measured)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
