"""The Job: one description of a training run, read by the CLI, widgets, planner and runner.

A Job as written (by a user, a YAML file or the CLI) may leave things out: the data-
parallel degree, the global batch, the token budget. `resolve()` fills them from the
cluster and the preset, checks every field against the others, and says what it chose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from .axes import model_parallel
from .backends import backend_masks, infer_backend
from .catalog import Catalog, load_catalog
from .errors import SpecError
from .fields import from_dict, to_dict
from .hf_config import model_from_hf_config
from .model import LORA_TARGETS, ModelSpec
from .precision import PRECISIONS, TORCH_SEMANTICS, PrecisionPlan, compute_dtype, precision_plan
from .resolve import resolve_job
from .serving import Serving
from .yamlio import read_yaml

__all__ = [
    "Batch",
    "Precision",
    "Optimizer",
    "Parallel",
    "MemoryOptions",
    "Overlap",
    "Cluster",
    "Cost",
    "Finetune",
    "Job",
    "Pruning",
    "Serving",
    "Training",
    "LORA_TARGETS",
    "PRECISIONS",
    "TORCH_SEMANTICS",
    "backend_masks",
    "compute_dtype",
    "infer_backend",
]


@dataclass(frozen=True, kw_only=True)
class Batch:
    micro_batch: int = 1
    """Sequences per device per forward/backward."""
    global_batch: int | None = None
    """Sequences per optimizer step over all data-parallel ranks; None = the preset's published batch."""


@dataclass(frozen=True, kw_only=True)
class Precision:
    mode: Literal["fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "mixed-fp16", "pure-bf16"] | None = None
    """fp32 | amp-*: torch autocast, fp32 weights, grads, optimizer states | mixed-*: 16-bit weights and
    grads with fp32 master weights in the optimizer (DeepSpeed/Megatron) | pure-bf16: everything bf16.
    None = amp-bf16 where the accelerator has bf16 units, else amp-fp16."""
    grad_dtype: Literal["param", "fp32"] = "param"
    """`fp32` keeps fp32 main gradients as Megatron does (mixed-* only)."""
    fp8: bool = False
    """Run the matmuls in FP8 (Transformer Engine style) on devices whose catalog row has an FP8 peak;
    weights, gradients and states keep the mode's dtypes. Modelled in step time; memory counts what the linears
    save for backward in the mode's dtype (torchao's float8 recipes differ there: not modelled)."""
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] = "delayed"
    """Transformer Engine's FP8 scaling (Megatron-Core's --fp8-recipe): per-tensor delayed or current (tensorwise),
    1×128/128×128 blocks (DeepSeek-V3's), or MXFP8's 32-element blocks, which need microscaling tensor cores
    (Blackwell). Priced at the part's FP8 rate; the recipes' extra weight copies are not modelled."""
    fp8_all_gather: bool = False
    """With fp8 under FSDP2 (ZeRO-2/3, torch semantics): gather the blocks' linear weights in float8, 1 byte each
    on the wire and in the gathered block, as torchao's `enable_fsdp_float8_all_gather` (torchtitan's 405B config)."""

    @property
    def plan(self) -> PrecisionPlan:
        """The mode decoded: dtypes of weights, gradients, optimizer states and matmuls (a resolved job's)."""
        return precision_plan(self.mode)


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    name: Literal["adamw", "adam", "sgd", "adamw-8bit"] = "adamw"
    """The optimizer: its states set the memory each parameter costs (AdamW's two moments; 8-bit blockwise ones)."""
    momentum: float = 0.9
    """SGD momentum; 0 means plain SGD with no optimizer state."""
    impl: Literal["for-loop", "foreach", "fused"] | None = None
    """torch's implementation; None = torch's default (foreach on CUDA, for-loop on CPU). Their temporaries differ."""
    moment_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    """Adam's two moments stored in this dtype (Megatron-Core's --use-precision-aware-optimizer with
    --exp-avg-dtype / --exp-avg-sq-dtype); None = the precision mode's state dtype. The fp32 master copy stays."""


@dataclass(frozen=True, kw_only=True)
class Parallel:
    dp: int | None = None
    """Data-parallel degree; None = devices / (tp × pp)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-style slicing of every matmul)."""
    pp: int = 1
    """Pipeline stages."""
    vpp: int = 1
    """Virtual stages per pipeline rank (interleaved 1F1B)."""
    stage_layers: tuple[int, ...] | None = None
    """Layers of each of the pp × vpp pipeline chunks, in model order; None = equal chunks, or when they do not
    divide the layers the first and last chunk hold fewer (toolkit.specs.stages)."""
    pipeline_layout: str | None = None
    """Megatron-Core's --pipeline-model-parallel-layout string (e.g. "Et|(tt|)*30,L": chunks split by "|", E the
    embedding, t a layer, L the loss; toolkit.specs.pipeline_layout), written into stage_layers."""
    partition: str | None = None
    """DeepSpeed's pipeline `partition_method` (uniform | parameters | type:REGEX): the blocks of each stage as its
    PipelineModule splits Megatron-DeepSpeed's GPT (toolkit.specs.partition), written into stage_layers."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks, attention as a ring passing keys and values
    (estimated; torch runs it with CUDA attention kernels only, so the runner does not)."""
    sp: bool = False
    """Sequence parallelism over the tensor-parallel group."""
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    """Pipeline schedule; with vpp > 1, 1F1B is interleaved."""
    zero: Literal[0, 1, 2, 3] = 0
    """ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    ep: int = 1
    """Expert parallelism (Mixture of Experts): each MoE block's routed experts split over ep ranks of the
    data-parallel group, tokens sent to their experts' ranks by all-to-all (dispatch) and back (combine). The
    experts' weights are then replicated over dp / ep ranks (the experts' own data-parallel group, as
    Megatron-Core and torchtitan arrange it), over which their gradients are reduced and ZeRO shards their
    states; attention and the other weights stay replicated over all of dp. Experts are not split by tp.
    Megatron-Core's parallel folding is accepted too: ep may span tensor- and context-parallel ranks, the experts
    then laid out on their own grid etp × ep × edp over the tp × cp × dp ranks of a stage (see `etp`)."""
    etp: int = 1
    """Expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size): each routed expert's matrices
    split over etp ranks. With ep it forms the experts' grid etp × ep × edp = tp × cp × dp (MoE parallel
    folding): tokens leave a rank as its tensor-parallel share (sequence parallelism), ep ranks are etp apart,
    and edp = tp · cp · dp / (ep · etp) ranks hold the same experts. 1 with ep inside dp is the runner's plain
    program (experts whole on every tensor-parallel rank)."""
    dp_replicate: int = 1
    """HSDP (torchtitan's dp_replicate × dp_shard, FSDP2 on a 2-D mesh): ZeRO-2/3 shards over dp / dp_replicate
    ranks (a node, typically) and keeps dp_replicate copies of each shard, whose gradients are all-reduced across
    them; 1 = shard over all of dp."""
    offload: Literal["none", "optimizer", "params"] = "none"
    """CPU offload: optimizer states (DeepSpeed ZeRO-Offload) or params+grads+optimizer (FSDP2, ZeRO-3)."""
    backend: Literal["torch", "deepspeed", "megatron"] | None = None
    """The framework whose program runs the layout; None = inferred (`infer_backend`): mixed-* with tp or pp is
    Megatron's, mixed-* with ZeRO over dp DeepSpeed's, everything else torch's (DDP, FSDP2, DTensor, pipelining)."""


@dataclass(frozen=True, kw_only=True)
class Overlap:
    """Which communication hides behind compute: a setting of each framework, not of the layout. None = the backend's
    default (toolkit.estimate.steptime.overlap_settings), said in the estimate's notes."""

    grad_reduce: bool | None = None
    """Gradient all-reduce or reduce-scatter during backward, bucket by bucket. Defaults: torch yes (DDP's buckets,
    FSDP2's reduce-scatter stream); DeepSpeed no (the toolkit's config sets overlap_comm false; DeepSpeed's own
    default is true for ZeRO-3 only); Megatron no (--overlap-grad-reduce is off unless given), but ZeRO-3 beside
    its tensor parallelism is FSDP's (OPT's metaseq), which overlaps."""
    param_gather: bool | None = None
    """Parameter all-gathers prefetched behind compute: ZeRO-3's and FSDP2's per micro-batch, or the all-gather
    after the step of ZeRO-1/2 and Megatron's distributed optimizer (behind the next forward). Defaults: torch yes
    (FSDP2 prefetches); ZeRO-3 yes everywhere (DeepSpeed's prefetch bucket, FSDP's); DeepSpeed ZeRO-1/2 and
    Megatron no (--overlap-param-gather is off unless given)."""
    tp_comm: bool = False
    """Tensor-parallel collectives overlapped with the matmuls (Megatron's --tp-comm-overlap, Transformer Engine's
    userbuffers); off by default everywhere (torch's DTensor plan runs them in turn)."""
    ep_comm: bool = False
    """A Mixture of Experts' dispatch and combine overlapped with another micro-batch's compute (Megatron-Core's
    --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe); off by default (the runner's program, Megatron's)."""


@dataclass(frozen=True, kw_only=True)
class Moe:
    """How a Mixture of Experts' tokens travel to their experts: a setting of the framework, not of the model."""

    dispatcher: Literal["alltoall", "deepep", "flex", "allgather"] = "alltoall"
    """alltoall: NCCL's all-to-all, every (token, expert) copy sent on its own (Megatron's alltoall, the runner's);
    deepep: DeepEP's kernels (Megatron's flex dispatcher; "flex" says the same), a token sent once to each node
    holding its experts and forwarded there over NVLink; allgather: every rank gathers the group's tokens and keeps
    its experts' (Megatron's allgather dispatcher, its default)."""
    fp8_dispatch: bool | None = None
    """Dispatch in FP8 (1 byte and a scale per 128 values; the combines stay 16-bit, as DeepSeek-V3 §3.3 runs
    them); None = with DeepEP when the job trains in FP8."""


@dataclass(frozen=True, kw_only=True)
class MemoryOptions:
    recompute: Literal["none", "selective", "selective-op", "full"] = "none"
    """Activation checkpointing: selective recomputes the attention core; selective-op (torchtitan's per-op
    policy) keeps each block's input, every other matmul's output and the fused attention's output, and recomputes
    the rest; full keeps only layer inputs."""
    recompute_modules: tuple[str, ...] | None = None
    """Megatron-Core's --recompute-modules under selective recompute: which parts of a block save only their inputs
    and run again in backward: core_attn, layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts. None =
    core_attn (the selective default)."""
    attention: Literal["flash", "eager"] = "flash"
    """flash: fused attention (SDPA) that stores no score matrix; eager: explicit ops that store scores,
    softmax and its dropout mask (the Megatron-style block)."""
    attention_kernel: Literal["fa2", "fa3", "cudnn"] | None = None
    """The fused attention implementation (FlashAttention-2 or -3, cuDNN's) the step-time model prices; None = the
    backend's usual one on the device (toolkit/data/kernels.yaml: torch's SDPA runs FlashAttention-2, Megatron-Core
    on Hopper cuDNN's). Memory is the same for all three."""
    program: Literal["cuda", "cpu"] | None = None
    """Which kernels the activation model follows; None = cuda on an accelerator, cpu without one."""
    act_compress: Literal["none", "int8"] = "none"
    """Store saved activations in int8."""
    expandable_segments: bool = False
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: torch's allocator grows one mapped segment instead of
    caching many blocks, which leaves far less of its pool fragmented (toolkit.estimate.device)."""
    headroom_fraction: float = 0.02
    """Share of device memory kept free beyond the modelled device peak (tensors, allocator pool, CUDA context,
    NCCL buffers: toolkit.estimate.device): the part the driver keeps (an A100-80GB shows 79.3 of its 80 GiB
    to programs) and spikes the model misses."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    accelerator: str | None = None
    """Catalog name, e.g. A100-80GB (case-insensitive; aliases accepted)."""
    count: int | None = None
    """Number of accelerators."""
    gpus_per_node: int = 8
    """Accelerators a machine (node) holds: the NVLink or other fast-link domain collectives see."""
    intra_node_bw_bytes_per_s: float | None = None
    """Per-device intra-node bandwidth, one direction; None = half the catalog's bidirectional link figure."""
    inter_node_bw_bytes_per_s: float | None = None
    """Per-node network bandwidth; None = the offer's network figure."""
    host_memory_gib: float | None = None
    """Host RAM of one node (GiB), which offloaded states must fit in; None = the offer's, else the accelerator's
    reference system's, else an assumption (toolkit.estimate.host)."""


@dataclass(frozen=True, kw_only=True)
class Cost:
    offer: str | None = None
    """Cloud offer (instance type) from the catalog, e.g. p4de.24xlarge."""
    spot: bool = False
    """Price at spot rates instead of on-demand."""
    interruptions_per_month: float = 0.10
    """Share of spot instances reclaimed per month (AWS Spot Advisor bands: <5 %, 5–10 %, ... >20 %).
    10 % is an assumption, the top of the 5–10 % band: put your instance type's band."""
    checkpoint_write_bytes_per_s: float = 1e9
    """Per-device write speed to the checkpoint store (an assumption: 1 GB/s; measure yours)."""
    restart_s: float = 600.0
    """Time to get capacity back, launch and load after an interruption (an assumption)."""
    pue: float = 1.2
    """Power usage effectiveness of the data centre (facility power / IT power) for the energy line."""
    energy_price_per_kwh: float | None = None
    """Your electricity price (own hardware); None = no energy cost line (cloud prices include power)."""
    grid_kg_co2_per_kwh: float | None = None
    """Carbon intensity of your grid; None = no CO2 line."""


@dataclass(frozen=True, kw_only=True)
class Finetune:
    method: Literal["full", "lora", "qlora"] = "full"
    """full: every weight trains; lora: frozen weights plus low-rank adapters (Hu et al. 2021); qlora: the
    same with the blocks' frozen matrices stored in 4-bit NormalFloat (Dettmers et al. 2023)."""
    rank: int = 8
    """Adapter rank r."""
    base_weights: Literal["auto", "16-bit", "fp32"] = "auto"
    """LoRA's frozen base matrices: auto keeps them in the autocast dtype (bf16 under amp-bf16, as a LoRA fine-tune
    loads its base), fp32 keeps the master copy an amp mode otherwise holds; mixed and pure modes hold 16-bit
    weights already."""
    alpha: float = 16.0
    """Adapter scale numerator (the update is scaled by alpha / rank)."""
    targets: tuple[str, ...] = ("q", "k", "v", "o")
    """Projections that get adapters: q, k, v, o (attention), up, gate (SwiGLU only), down (MLP)."""
    dataset_tokens: float | None = None
    """Tokens in the fine-tuning data; with `epochs`, the fine-tune's token budget (never the pretraining one)."""
    epochs: float = 1.0
    """Passes over the fine-tuning data."""

    @property
    def adapters(self) -> bool:
        """LoRA or QLoRA: a frozen base and trainable adapters."""
        return self.method in ("lora", "qlora")

    def base_16bit(self, precision_mode: str | None) -> bool:
        """LoRA under autocast with its frozen block matrices in the autocast dtype (base_weights auto or 16-bit)."""
        return self.method == "lora" and precision_mode in ("amp-bf16", "amp-fp16") and self.base_weights != "fp32"


@dataclass(frozen=True, kw_only=True)
class Pruning:
    method: Literal["none", "magnitude", "2:4"] = "none"
    """magnitude: zero the smallest weights of all block matrices together (global, unstructured);
    2:4: in every group of 4 consecutive input weights keep the 2 largest (sparse tensor cores' pattern)."""
    sparsity: float = 0.5
    """Share of block-matrix weights set to zero (magnitude only; 2:4 is 0.5 by construction)."""
    at_step: int = 0
    """Optimizer step after which the masks are computed; 0 prunes before training. Masks hold afterwards."""


@dataclass(frozen=True, kw_only=True)
class Training:
    """What the runner needs beyond the layout: schedule, data, checkpoints, techniques."""

    steps: int = 100
    """Optimizer steps to train (a resumed run continues up to this step)."""
    lr: float = 3e-4
    """Peak learning rate, reached after the warm-up."""
    warmup_steps: int = 10
    """Linear warm-up from 0; then cosine decay to min_lr_fraction × lr at the last step."""
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping (the norm is still logged)."""
    seed: int = 1234
    """Seeds the weights' initialisation, the data order and dropout: the same seed reruns the same steps."""
    init_from: str | None = None
    """Start from these weights: a local Hugging Face folder (config.json + safetensors) or a toolkit run."""
    data: str | None = None
    """Folder of token shards made by `toolkit data prepare`; None = the demo corpus (built on first use)."""
    num_workers: int = 1
    """DataLoader worker processes; 0 loads in the training process."""
    prefetch: int = 2
    """Batches each worker prepares ahead."""
    eval_every: int = 0
    """Evaluate the held-out loss every K steps (and at the last step); 0 = never."""
    eval_batches: int = 4
    checkpoint_every: int = 50
    """Save a checkpoint every N steps (and on SIGTERM and at the end); 0 = only those two."""
    keep_checkpoints: int = 2
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size (torch's default 25 MB; the article advises 2–8 MB)."""
    fp32_norm: bool = False
    """Run LayerNorm/RMSNorm in fp32 with fp32 weights (the article's trick for 16-bit weights)."""
    loss_scale: float = 65536.0
    """Initial dynamic loss scale for fp16 modes (halved on overflow, doubled after 2000 clean steps)."""
    pruning: Pruning = field(default_factory=Pruning)
    gradient_checkpointing: bool | None = None
    """The article's spelling: true means memory.recompute = full."""
    compile: bool = False
    """Compile each block with torch.compile, as torchtitan does (one compiled region a block, the model eager around
    them); checkpoints keep the same keys. The step time prices its element-wise kernels fused; memory stays the
    eager program's."""
    trackers: tuple[str, ...] = ()
    """accelerate trackers to log to as well (tensorboard, wandb, trackio), when installed."""


@dataclass(frozen=True, kw_only=True)
class Job:
    model: ModelSpec = field(default_factory=ModelSpec)
    batch: Batch = field(default_factory=Batch)
    precision: Precision = field(default_factory=Precision)
    optimizer: Optimizer = field(default_factory=Optimizer)
    parallel: Parallel = field(default_factory=Parallel)
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    overlap: Overlap = field(default_factory=Overlap)
    moe: Moe = field(default_factory=Moe)
    cluster: Cluster = field(default_factory=Cluster)
    cost: Cost = field(default_factory=Cost)
    finetune: Finetune = field(default_factory=Finetune)
    training: Training = field(default_factory=Training)
    serving: Serving = field(default_factory=Serving)
    workload: Literal["train", "finetune", "inference"] | None = None
    """train: pretraining, budgeted by `tokens` or the preset's published budget; finetune: a fine-tune of existing
    weights, budgeted by `tokens`, finetune.dataset_tokens × epochs, or else priced per billion tokens; inference:
    serving the model, its requests in the `serving` section (toolkit.estimate.serving). None = finetune where
    finetune.method is lora or qlora, else train."""
    tokens: float | None = None
    """Token budget D; None = the preset's published budget (pretraining) or the fine-tuning data's."""
    mfu: float | None = None
    """Model FLOPs utilisation assumed for time-to-train (0 < mfu ≤ 1)."""

    # ---- derived ---------------------------------------------------------------------
    @property
    def devices(self) -> int:
        p = self.parallel
        return (p.dp or 1) * model_parallel(p)

    @property
    def backend(self) -> str:
        """The framework whose program runs this (resolved) job: parallel.backend, or as inferred from the mode and
        layout (`infer_backend`)."""
        p = self.parallel
        return p.backend or infer_backend(self.precision.mode, p.zero, p.tp, p.pp)

    @property
    def grad_accum(self) -> int | None:
        """Micro-batches per optimizer step on each data-parallel rank."""
        if self.batch.global_batch is None or self.parallel.dp is None:
            return None
        return self.batch.global_batch // (self.batch.micro_batch * self.parallel.dp)

    def replace(self, **changes) -> Job:
        """A copy with whole sections or top-level fields replaced."""
        return dataclasses.replace(self, **changes)

    # ---- (de)serialisation -------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict, catalog: Catalog | None = None) -> Job:
        """Build from plain data; `model` may be `{preset: NAME, ...overrides}` or `{hf_config: PATH}`."""
        if not isinstance(data, dict):
            raise SpecError("job", data, "expected a mapping with sections model, batch, precision, ...")
        data = dict(data)
        if isinstance(data.get("model"), dict):
            data["model"] = expand_model(data["model"], catalog or load_catalog())
        return from_dict(cls, data)

    @classmethod
    def from_yaml(cls, path: str | Path, catalog: Catalog | None = None) -> Job:
        data = read_yaml(path, what="job file")
        if data is None:
            raise SpecError("job file", str(path), "is empty; write at least a `model:` section")
        return cls.from_dict(data, catalog)

    def to_dict(self) -> dict:
        return to_dict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    # ---- checks and defaults --------------------------------------------------------------
    def resolve(self, catalog: Catalog | None = None) -> tuple[Job, list[str]]:
        """Check every field, fill the defaults, and return (resolved job, notes on what was chosen)."""
        return resolve_job(self, catalog or load_catalog())


def expand_model(data: dict, catalog: Catalog) -> ModelSpec:
    """`{preset: gpt3-175b, seq_len: 4096}` -> the preset's ModelSpec with the overrides applied."""
    data = dict(data)
    preset = data.pop("preset", None)
    hf_config = data.pop("hf_config", None)
    if preset is not None and hf_config is not None:
        raise SpecError("model.preset", preset, "give either model.preset or model.hf_config, not both")
    if preset is not None:
        base = catalog.preset(preset).model
        base_dict = {k: v for k, v in to_dict(base).items() if v is not None}
        merged = {**base_dict, "name": catalog.preset(preset).name, **data}
        return from_dict(ModelSpec, merged, "model")
    if hf_config is not None:
        seq = data.pop("seq_len", None)
        base = model_from_hf_config(str(hf_config), seq_len=int(seq) if seq is not None else None)
        return from_dict(ModelSpec, {**{k: v for k, v in to_dict(base).items() if v is not None}, **data}, "model")
    return from_dict(ModelSpec, data, "model")
