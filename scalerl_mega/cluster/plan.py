"""Per-GPU memory planner for the trainer (Megatron-Core) and the generators (SGLang).

Byte counts (all per GPU, per parameter held by that GPU):

* Trainer, Megatron mixed precision with bf16 params and fp32 main grads
  (Megatron-Core "Distributed Optimizer" guide, table "bf16 parameters, fp32 gradients":
  18 bytes/param without, ``6 + 12/d`` with the distributed optimizer):
  bf16 weights 2 B + fp32 grad buffer (``main_grad``) 4 B, always replicated over data parallel;
  fp32 main params 4 B + Adam m 4 B + Adam v 4 B = 12 B, divided by the data-parallel size ``d``
  when the distributed optimizer is on. Expert parameters are sharded over the *expert*
  data-parallel group ``edp = world / (etp * ep * pp)``; expert weights are split over ``etp``.
  FP32 LM head (paper Sec. 3.2, ``precision=fp32_head``; the trainer keeps the output layer FP32
  after the bf16 wrap): its weights are 4 B, grads 4 B, and the optimizer holds only Adam m and v
  (8 B, sharded); the FP32 parameter is its own main copy. Tied embeddings have no head parameter: the
  embedding (and its last-stage copy under pipeline parallelism) is a bf16 body parameter the head reads.
  These counts are reconciled with the trainer's real Megatron buffers by the meta-device dry run
  (`scalerl_mega/dry_run.py`, tests/integration/test_dry_run.py: within 5%).
* Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (arXiv:2205.05198), Sec. 4.1 / Table 2, re-derived term by term for a Llama block
  (RMSNorm, GQA, SwiGLU, no dropout, so the dropout masks of their ``34sbh + 5as^2b`` vanish).
  With ``N = s*b`` tokens of the micro-batch, 2-byte activations, TP size ``t``:

  - sequence-parallel region (divided by ``t`` only with SP): two norm inputs ``4Nh``,
    QKV input ``2Nh``, MLP input ``2Nh``  ->  ``8Nh``;
  - tensor-parallel region (divided by ``t``): Q ``2Nh``, K and V ``4N h_kv``, attention output
    (= output-projection input) ``2Nh``; core attention: ``2 a s^2 b`` (softmax output, no dropout)
    without recompute, or the fp32 log-sum-exp ``4aN`` with selective recompute / flash attention
    (Korthikanti's selective recompute drops exactly the ``a s^2 b`` terms);
    dense SwiGLU MLP ``6NF`` (gate out, up out, product); MoE: fp32 router logits ``4NE``,
    routed copies ``N k (4h + 6F_e)`` (dispatched input, expert SwiGLU, expert output), shared
    expert ``6NF_s + 2Nh``;
  - full recompute: only the layer input ``2Nh/t`` (SP) per layer, plus one layer's activations as
    the recompute working set.

  Pipeline parallelism with 1F1B: the first stage holds ``min(pp, n_microbatches)`` micro-batches
  of ``L/pp`` layers (Korthikanti Sec. 4.2.3); the last stage holds one micro-batch plus the fp32
  logits ``4 N V_pad / t`` of the FP32 LM head (paper Sec. 3.2), or ``logits_chunk_tokens`` rows of
  them when the fused chunked log-prob is used.
* Generators (SGLang, TP ``g``): bf16 weights ``2 P / g`` (+ replicated norms/router); KV cache
  ``2 (K and V) * L * max(1, n_kv/g) * head_dim * kv_bytes`` per token (``g > n_kv``: KV heads replicated); SGLang reserves
  ``--mem-fraction-static`` of the GPU for weights + KV pool; the pool must hold ``min_seqs``
  full-length sequences.

Device capacities: H100 SXM 80 GB HBM3 (nvidia-smi reports 81559 MiB); H200 SXM 141 GB HBM3e
(NVIDIA H200 datasheet: 141 GB); GB200: NVIDIA's GB200 NVL72
spec gives 13.4 TB HBM3e for 72 GPUs, i.e. 186 GB per GPU (the "192 GB" B200 figure is the raw
stack size).

Runtime overheads on top of the buffers and activations (``runtime_bytes``; estimates, each stated):

* CUDA context and library workspaces: ``CUDA_CONTEXT_BYTES`` = 1 GiB per process (the context with
  lazy module loading is ~0.5 GiB on Hopper; cuBLAS/cuBLASLt, cuDNN and TE workspaces the rest).
* NCCL: ``NCCL_COMM_BYTES`` = 512 MiB per communicator this rank uses (NCCL_BUFFSIZE 4 MiB Simple +
  ~4.5 MiB LL128 + LL buffers, per channel and ring/tree peer, at 16-32 channels on NVLink/IB; NVLS and
  p2p (pipeline) connections add more). Communicators: one per parallel group of size > 1 that a training
  step communicates over (TP, DP, PP, the model-parallel group of the grad-norm when PP > 1; MoE: EP,
  expert-DP, expert-TP when it differs from TP) plus the weight-sync group of trainer rank 0.
* The fused LM head's transients on the last stage (objective/triton/fused_logprob.py): the FP32
  ``grad_W`` accumulator ``4 V_pad/t h``, the FP32 ``dlogits`` buffer ``min(512 MiB, 4 N V_pad/t)``, and
  the FP32 copies of the head input and its gradient ``2 * 4 N h`` (Float16Module upcasts the last
  stage's output). Without the fused head only the FP32 input copy ``4 N h``.
* MoE route tensors per MoE layer and micro-batch in flight: the router's dense routing map (bool)
  and probabilities (FP32), ``5 N E / t_sp``; the replayed expert ids on the device, ``8 N k / t_sp``
  per MoE layer (int64).
* Allocator fragmentation: ``FRAGMENTATION`` = 10% of the dynamic bytes (activations, head transients,
  route tensors; the caching allocator's reserved-but-unallocated share, typically 5-15%).

A layout fits when all of it stays within ``(1 - MARGIN_FRACTION)`` of the device's memory
(``MARGIN_FRACTION`` = 5%: headroom for what is not modelled, e.g. kernel autotuning workspaces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from scalerl_mega.cluster.gdn_shape import QWEN3_NEXT_GDN, GDNShape
from scalerl_mega.config.run import TrainLoopConfig

GiB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GiB
NCCL_COMM_BYTES = 512 * 2**20
FRAGMENTATION = 0.10
MARGIN_FRACTION = 0.05
FUSED_HEAD_DLOGITS_BYTES = 512 * 2**20  # objective/triton/fused_logprob.py DEFAULT_BWD_CHUNK_BYTES


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Decoder-only Llama-family shape. ``num_experts == 0`` means dense."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP intermediate size (unused for MoE layers)
    vocab: int
    tied_embeddings: bool = False
    num_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    moe_every: int = 1  # every n-th layer is MoE (HF interleave_moe_layer_step / decoder_sparse_step)
    moe_dense: tuple[int, ...] = ()  # layers kept dense although moe_every selects them (Qwen3-MoE mlp_only_layers)
    qk_norm: bool = False  # per-head RMSNorm weights on q and k (Qwen3): 2 * head_dim per layer
    mla: tuple[int, int, int, int] = ()  # DeepSeek-V3 MLA (q_lora_rank or 0, kv_lora_rank, rope dim, v dim)
    gdn: GDNShape | None = None  # Gated DeltaNet hybrid (cluster/gdn_shape.py); the other layers gated full attention
    shared_expert_gate: bool = False  # a sigmoid gate [1, hidden] on the shared expert (Qwen3-Next), replicated over TP

    def __post_init__(self) -> None:
        for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, key) <= 0:
                raise ValueError(f"ModelShape {self.name!r}: {key}={getattr(self, key)} must be > 0")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelShape {self.name!r}: heads={self.heads} not divisible by kv_heads={self.kv_heads}")
        if self.num_experts and (self.top_k <= 0 or self.expert_ffn <= 0):
            raise ValueError(f"ModelShape {self.name!r}: MoE needs top_k > 0 and expert_ffn > 0")

    def moe_layers_in(self, layers: range) -> int:
        """How many of `layers` (0-based) are MoE layers."""
        if not self.num_experts:
            return 0
        return sum(1 for i in layers if (i + 1) % self.moe_every == 0 and i not in self.moe_dense)

    def stage_moe_layers(self, pp: int, stage: int) -> int:
        lps = self.layers // pp
        return self.moe_layers_in(range(stage * lps, (stage + 1) * lps))

    @property
    def moe_layers(self) -> int:
        return self.moe_layers_in(range(self.layers))

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    # ---- parameter counts (unsharded)
    def attention_params(self) -> int:
        h, d = self.hidden, self.head_dim
        if self.mla:  # model/deepseek.py mla_attention_params less its two latent norms (norm_params_per_layer)
            ql, kvl, rope, v = self.mla
            n = self.heads
            q = h * ql + ql * n * (d + rope) if ql else h * n * (d + rope)
            return q + h * (kvl + rope) + kvl * n * (d + v) + n * v * h
        return h * self.heads * d * (3 if self.gdn else 2) + h * self.kv_heads * d * 2  # q (+ output gate), o + k, v

    def mixer_params(self, layers: range) -> tuple[int, int]:
        """(split over TP, replicated) parameters of the token mixers and norms of `layers` (0-based): attention,
        a hybrid's GDN mixers in its GDN layers (cluster/gdn_shape.py)."""
        g_split, g_repl = self.gdn.mixer_params(layers, hidden=self.hidden) if self.gdn else (0, 0)
        attn = len(layers) - (self.gdn.count(layers) if self.gdn else 0)
        return attn * self.attention_params() + g_split, attn * self.norm_params_per_layer() + g_repl

    def gdn_state_bytes(self, tp: int) -> int:
        """A generator GPU's recurrent + conv state of one sequence (value heads split over TP; 0 without GDN)."""
        return self.gdn.state_bytes // tp if self.gdn else 0

    def norm_params_per_layer(self) -> int:
        latent = self.mla[0] + self.mla[1] if self.mla else 0  # MLA's q / kv latent RMSNorms (replicated over TP)
        return 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0) + latent

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.ffn

    def expert_params_per_layer(self) -> int:
        return self.num_experts * 3 * self.hidden * self.expert_ffn

    def shared_expert_params(self) -> int:
        return 3 * self.hidden * self.shared_expert_ffn

    def router_params(self) -> int:  # the trainer's router weight (megatron keeps DeepSeek-V3's bias as a buffer)
        return self.hidden * self.num_experts

    def shared_expert_gate_params(self) -> int:
        return self.hidden if self.shared_expert_gate else 0

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def total_params(self) -> int:
        total = sum(self.mixer_params(range(self.layers))) + self.dense_layers * self.dense_mlp_params()
        total += self.moe_layers * (self.expert_params_per_layer() + self.shared_expert_params() + self.router_params()
                                    + self.shared_expert_gate_params())
        return total + self.embedding_params() + self.head_params() + self.hidden

    def active_params(self) -> int:
        """Parameters touched per token (top-k experts instead of all)."""
        if not self.num_experts:
            return self.total_params()
        inactive = self.moe_layers * (self.num_experts - self.top_k) * 3 * self.hidden * self.expert_ffn
        return self.total_params() - inactive


# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads,
# intermediate 14336, vocab 128256, untied).
LLAMA3_8B = ModelShape(
    name="llama3_8b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256
)
# Llama-4 Scout 17Bx16E text model: transformers 5.23 Llama4TextConfig() defaults (its docstring
# checkpoint is meta-llama/Llama-4-Scout-17B-16E): hidden 5120, 48 layers, 40 heads, 8 KV heads,
# head_dim 128, intermediate_size (expert) 8192, 16 local experts, top-1, vocab 202048,
# interleave_moe_layer_step 1 (every layer MoE), one shared expert of the same size, untied.
SCOUT_17B16E = ModelShape(name="scout_17b16e", hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128, ffn=16384,
                          vocab=202048, num_experts=16, top_k=1, expert_ffn=8192, shared_expert_ffn=8192, moe_every=1)
# Qwen3 (Qwen/Qwen3-*/config.json, tests/data/hf_configs/): head_dim 128 independent of hidden / heads,
# per-head q/k RMSNorm, vocab 151936, untied; the MoE models route top-8 of 128 experts in every layer
# (decoder_sparse_step 1, mlp_only_layers []) without a shared expert.
QWEN3_8B = ModelShape(name="qwen3_8b", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                      vocab=151936, qk_norm=True)
QWEN3_30B_A3B = ModelShape(name="qwen3_30b_a3b", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                           vocab=151936, num_experts=128, top_k=8, expert_ffn=768, qk_norm=True)
QWEN3_235B_A22B = ModelShape(name="qwen3_235b_a22b", hidden=4096, layers=94, heads=64, kv_heads=4, head_dim=128,
                             ffn=12288, vocab=151936, num_experts=128, top_k=8, expert_ffn=1536, qk_norm=True)
# DeepSeek-V3 architecture (tests/data/hf_configs/): MLA, `first_k_dense_replace` dense layers, sigmoid top-k
# with shared experts (conf/model/moonlight_16b_a3b.yaml, deepseek_v3_671b.yaml)
MOONLIGHT_16B_A3B = ModelShape(name="moonlight_16b_a3b", hidden=2048, layers=27, heads=16, kv_heads=16, head_dim=128,
                               ffn=11264, vocab=163840, num_experts=64, top_k=6, expert_ffn=1408,
                               shared_expert_ffn=2816, moe_dense=(0,), mla=(0, 512, 64, 128))
DEEPSEEK_V3_671B = ModelShape(name="deepseek_v3_671b", hidden=7168, layers=61, heads=128, kv_heads=128, head_dim=128,
                              ffn=18432, vocab=129280, num_experts=256, top_k=8, expert_ffn=2048,
                              shared_expert_ffn=2048, moe_dense=(0, 1, 2), mla=(1536, 512, 64, 128))
# Qwen3-Next-80B-A3B (conf/model/qwen3_next_80b_a3b.yaml): a Gated DeltaNet hybrid, 36 GDN layers (cluster/gdn_shape.py)
# and 12 gated full-attention layers of 16 query / 2 KV heads of 256; every layer MoE, top-10 of 512 experts plus a
# gated shared expert (dry_run.model_shape of the preset gives the same shape: tests/unit/test_plan_gdn.py)
QWEN3_NEXT_80B_A3B = ModelShape(name="qwen3_next_80b_a3b", hidden=2048, layers=48, heads=16, kv_heads=2, head_dim=256,
                                ffn=5120, vocab=151936, num_experts=512, top_k=10, expert_ffn=512,
                                shared_expert_ffn=512, qk_norm=True, gdn=QWEN3_NEXT_GDN, shared_expert_gate=True)
MODELS = {m.name: m for m in (LLAMA3_8B, SCOUT_17B16E, QWEN3_8B, QWEN3_30B_A3B, QWEN3_235B_A22B, MOONLIGHT_16B_A3B,
                              DEEPSEEK_V3_671B, QWEN3_NEXT_80B_A3B)}


@dataclass(frozen=True, kw_only=True)
class Device:
    name: str
    capacity_bytes: int
    runtime_reserve_bytes: int = 0  # subtracted on top of the margin (the runtime itself is modelled)
    source: str = ""
    margin_fraction: float = MARGIN_FRACTION

    @property
    def budget_bytes(self) -> int:
        return int(self.capacity_bytes * (1.0 - self.margin_fraction)) - self.runtime_reserve_bytes


H100_80GB = Device(name="h100_80gb", capacity_bytes=81559 * 1024**2, source="nvidia-smi on H100 SXM 80GB: 81559 MiB")
H200 = Device(name="h200", capacity_bytes=141 * 10**9, source="NVIDIA H200 SXM datasheet: 141 GB HBM3e")
GB200 = Device(name="gb200", capacity_bytes=186 * 10**9, source="NVIDIA GB200 NVL72 spec: 13.4 TB HBM3e / 72 GPUs")
DEVICES = {d.name: d for d in (H100_80GB, H200, GB200)}

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class TrainLayout:
    """Megatron parallel layout of the trainer. World size = tp * pp * dp; etp * ep divides tp * dp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1  # expert tensor parallel (parallel.etp)
    fp32_head: bool = True  # precision=fp32_head: output layer FP32 (weights 4 B, no main copy)
    sequence_parallel: bool = True
    distributed_optimizer: bool = True
    recompute: str = TrainLoopConfig.recompute  # the trainer's default (`train.recompute`)
    micro_batch: int = 1
    seq_len: int = 16384
    num_microbatches: int | None = None  # None: at least pp (typical for RL batches of hundreds)
    logits_chunk_tokens: int | None = None
    fused_head: bool = False  # the fused CISPO head (build.use_fused_cispo): chunk rows as the trainer sizes them
    vocab_divisible_by: int = 1  # the trainer builds the unpadded vocabulary (Megatron's flag: 128)
    moe_imbalance: float = 1.0  # routed tokens per EP rank relative to perfectly balanced

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (etp * ep * pp)."""
        return self.tp * self.dp // (self.ep * self.etp)

    def head_rows(self, model: ModelShape) -> int | None:
        """Logit rows the LM head holds at once: `logits_chunk_tokens`, else with `fused_head` the trainer's
        chunk for the vocabulary shard V / tp (objective.fused_logprob.default_chunk_size), else None (all N)."""
        if self.logits_chunk_tokens is not None or not self.fused_head:
            return self.logits_chunk_tokens
        from scalerl_mega.objective.fused_logprob import default_chunk_size

        return default_chunk_size(model.vocab // self.tp)

    def validate(self, model: ModelShape) -> None:
        for key in ("tp", "pp", "dp", "ep", "micro_batch", "seq_len", "num_microbatches"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"TrainLayout.{key}={getattr(self, key)} must be >= 1")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"TrainLayout.recompute={self.recompute!r} not in {RECOMPUTE_MODES}")
        if model.kv_heads % self.tp:
            raise ValueError(f"TrainLayout.tp={self.tp} must divide kv_heads={model.kv_heads} of {model.name}")
        if model.layers % self.pp:
            raise ValueError(f"TrainLayout.pp={self.pp} must divide layers={model.layers} of {model.name}")
        if not model.num_experts and self.ep != 1:
            raise ValueError(f"TrainLayout.ep={self.ep} needs an MoE model; {model.name} is dense")
        if model.num_experts:
            if model.num_experts % self.ep:
                raise ValueError(f"TrainLayout.ep={self.ep} must divide num_experts={model.num_experts}")
            if (self.tp * self.dp) % (self.ep * self.etp):
                raise ValueError(f"TrainLayout.ep={self.ep} * etp={self.etp} must divide tp*dp={self.tp * self.dp}")
            if model.expert_ffn % self.etp:
                raise ValueError(f"TrainLayout.etp={self.etp} must divide expert_ffn={model.expert_ffn}")
            if self.tp > 1 and not self.sequence_parallel:
                raise ValueError("TrainLayout.sequence_parallel must be true for MoE with tp > 1 (Megatron-Core)")


@dataclass(frozen=True, kw_only=True)
class GenLayout:
    """SGLang server layout: one server per TP group of ``tp`` GPUs."""

    tp: int = 1
    seq_len: int = 16384
    mem_fraction_static: float = 0.85
    kv_bytes: int = 2  # bf16 KV cache; 1 for fp8
    min_seqs: int = 16  # one prompt's group of G=16 full-length sequences must fit
    quantization: str = "none"  # "fp8": linear projections in blockwise FP8 (quant/fp8.py), the rest bf16

    def validate(self, model: ModelShape) -> None:
        if self.tp < 1 or (model.kv_heads % self.tp and self.tp % model.kv_heads):
            raise ValueError(f"GenLayout.tp={self.tp} must be >= 1 and divide kv_heads={model.kv_heads} or be a "
                             "multiple of it (each KV head then replicated on tp / kv_heads GPUs)")
        if not 0.0 < self.mem_fraction_static <= 1.0:
            raise ValueError(f"GenLayout.mem_fraction_static={self.mem_fraction_static} must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    role: str
    components: dict[str, int]
    budget_bytes: int
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes


def padded_vocab(vocab: int, *, tp: int, divisible_by: int) -> int:
    """Megatron pads the vocabulary to a multiple of ``divisible_by * tp``."""
    m = divisible_by * tp
    return int(math.ceil(vocab / m) * m)


# ------------------------------------------------------------------------- trainer: parameters
def stage_params(model: ModelShape, layout: TrainLayout, stage: int) -> dict[str, int]:
    """Parameters held by one GPU of pipeline stage ``stage``: ``body`` (non-expert, bf16 in mixed
    precision; includes the embedding on the first stage and the final norm on the last), ``head``
    (the untied output layer on the last stage; a tied embedding's last-stage copy counts as body) and ``expert``."""
    t, p = layout.tp, layout.pp
    lps = model.layers // p
    moe_per_stage = model.stage_moe_layers(p, stage)
    dense_per_stage = lps - moe_per_stage
    vpad = padded_vocab(model.vocab, tp=t, divisible_by=layout.vocab_divisible_by)
    sharded, replicated = model.mixer_params(range(stage * lps, (stage + 1) * lps))
    sharded += dense_per_stage * model.dense_mlp_params() + moe_per_stage * model.shared_expert_params()
    replicated += moe_per_stage * (model.router_params() + model.shared_expert_gate_params())
    body = sharded // t + replicated
    head = 0
    first, last = stage == 0, stage == p - 1
    if first:
        body += vpad * model.hidden // t
    if last:
        body += model.hidden
        if not model.tied_embeddings:
            head = vpad * model.hidden // t
        elif p > 1:  # the last stage's copy of the tied embedding: a body parameter (bf16, FP32 main copy)
            body += vpad * model.hidden // t
    expert = moe_per_stage * (model.num_experts // layout.ep) * 3 * model.hidden * model.expert_ffn // layout.etp
    return {"body": body, "head": head, "expert": expert}


def trainer_params_per_gpu(model: ModelShape, layout: TrainLayout) -> tuple[int, int]:
    """(non-expert params, expert params) held by the most loaded GPU (first or last pipeline stage)."""
    stages = [stage_params(model, layout, s) for s in {0, layout.pp - 1}]
    most = max(stages, key=lambda d: sum(d.values()))
    return most["body"] + most["head"], most["expert"]


def stage_static_bytes(model: ModelShape, layout: TrainLayout, stage: int) -> dict[str, int]:
    """Weights, gradients and optimizer bytes of one GPU of ``stage`` (module doc)."""
    sp = stage_params(model, layout, stage)
    body, head, expert = sp["body"], sp["head"], sp["expert"]
    head_w, head_opt = (4, 8) if layout.fp32_head else (2, 12)
    weights = 2 * (body + expert) + head_w * head
    grads = 4 * (body + head + expert)
    if layout.distributed_optimizer:
        optim = (12 * body + head_opt * head) // layout.dp + 12 * expert // layout.edp
    else:
        optim = 12 * (body + expert) + head_opt * head
    return {"weights": weights, "grads": grads, "optimizer": optim}


# ------------------------------------------------------------------------- trainer: activations
def layer_activation_bytes(model: ModelShape, layout: TrainLayout, *, moe: bool) -> int:
    """Activation bytes of one transformer layer for one micro-batch on one GPU (see module doc)."""
    s, b, t = layout.seq_len, layout.micro_batch, layout.tp
    n = s * b
    h, a = model.hidden, model.heads
    hkv = model.kv_heads * model.head_dim
    sp_div = t if layout.sequence_parallel else 1
    if layout.recompute == "full":
        return 2 * n * h // sp_div
    seq_region = 8 * n * h // sp_div
    attn = 2 * n * h + 4 * n * hkv + 2 * n * h
    if layout.recompute == "none":
        attn += 2 * a * s * s * b
    else:
        attn += 4 * a * n
    if moe:
        e, k = model.num_experts, model.top_k
        routed = int(n * k * (4 * h + 6 * model.expert_ffn) * layout.moe_imbalance)
        mlp = 4 * n * e + routed + (6 * n * model.shared_expert_ffn + 2 * n * h if model.shared_expert_ffn else 0)
    else:
        mlp = 6 * n * model.ffn
    return seq_region + (attn + mlp) // t


def stage_activation_bytes(model: ModelShape, layout: TrainLayout, stage: int) -> int:
    """Activation bytes of one GPU of pipeline stage ``stage`` under 1F1B: ``min(pp - stage, m)``
    micro-batches in flight (Korthikanti Sec. 4.2.3), plus the head's on the last stage."""
    lps = model.layers // layout.pp
    moe_per_stage = model.stage_moe_layers(layout.pp, stage)
    dense_per_stage = lps - moe_per_stage
    per_mb = moe_per_stage * layer_activation_bytes(model, layout, moe=True)
    per_mb += dense_per_stage * layer_activation_bytes(model, layout, moe=False)
    working = 0
    if layout.recompute == "full":  # one layer's activations as the recompute working set
        working = layer_activation_bytes(model, replace(layout, recompute="selective"), moe=bool(moe_per_stage))
    n = layout.seq_len * layout.micro_batch
    t = layout.tp
    vpad = padded_vocab(model.vocab, tp=t, divisible_by=layout.vocab_divisible_by)
    rows = layout.head_rows(model)
    logit_rows = n if rows is None else min(n, rows)
    sp_div = t if layout.sequence_parallel else 1
    head = 2 * n * model.hidden // sp_div + 2 * n * model.hidden // t + 4 * logit_rows * vpad // t
    m = layout.pp if layout.num_microbatches is None else layout.num_microbatches
    in_flight = min(layout.pp - stage, m)
    return in_flight * per_mb + working + (head if stage == layout.pp - 1 else 0)


def communicator_count(model: ModelShape, layout: TrainLayout) -> int:
    """NCCL communicators a training rank uses (module doc), the weight-sync group included."""
    groups = [layout.tp, layout.dp, layout.pp, layout.tp * layout.pp if layout.pp > 1 else 1]
    if model.num_experts:
        groups += [layout.ep, layout.edp, layout.etp if layout.etp != layout.tp else 1]
    return sum(1 for g in groups if g > 1) + 1


def runtime_bytes(model: ModelShape, layout: TrainLayout, stage: int, *, activations: int) -> dict[str, int]:
    """CUDA context, NCCL buffers, the fused head's transients, MoE route tensors and allocator
    fragmentation of one GPU of pipeline stage ``stage`` (module doc gives each formula)."""
    n, h, t = layout.seq_len * layout.micro_batch, model.hidden, layout.tp
    vpad = padded_vocab(model.vocab, tp=t, divisible_by=layout.vocab_divisible_by)
    head = 0
    if stage == layout.pp - 1:
        if layout.head_rows(model) is not None:  # the fused head (module doc)
            head = 4 * vpad // t * h + min(FUSED_HEAD_DLOGITS_BYTES, 4 * n * vpad // t) + 2 * 4 * n * h
        else:
            head = 4 * n * h
    routes = 0
    if model.num_experts:
        moe_per_stage = model.stage_moe_layers(layout.pp, stage)
        sp_div = t if layout.sequence_parallel else 1
        m = layout.pp if layout.num_microbatches is None else layout.num_microbatches
        in_flight = min(layout.pp - stage, m)
        routes = in_flight * moe_per_stage * (5 * n * model.num_experts + 8 * n * model.top_k) // sp_div
    return {"cuda_context": CUDA_CONTEXT_BYTES, "nccl": communicator_count(model, layout) * NCCL_COMM_BYTES,
            "head_transients": head, "route_tensors": routes,
            "fragmentation": int(FRAGMENTATION * (activations + head + routes))}


def trainer_memory(model: ModelShape, layout: TrainLayout, device: Device) -> MemoryReport:
    """Per-GPU trainer memory of the most loaded pipeline stage (module doc gives every byte count)."""
    layout.validate(model)
    reports = []
    for stage in sorted({0, layout.pp - 1}):
        static = stage_static_bytes(model, layout, stage)
        components = {"weights_bf16": static["weights"], "grads_fp32": static["grads"],
                      "optimizer_fp32": static["optimizer"], "activations": stage_activation_bytes(model, layout, stage)}
        components.update(runtime_bytes(model, layout, stage, activations=components["activations"]))
        sp = stage_params(model, layout, stage)
        notes = [f"pipeline stage {stage}: params/GPU non-expert={sp['body'] + sp['head']:,} "
                 f"(FP32 head {sp['head'] if layout.fp32_head else 0:,}) expert={sp['expert']:,}"]
        reports.append(MemoryReport(role="trainer", components=components, budget_bytes=device.budget_bytes,
                                    notes=notes))
    return max(reports, key=lambda r: r.total_bytes)


# ------------------------------------------------------------------------- generators
def kv_bytes_per_token(model: ModelShape, layout: GenLayout) -> int:
    """K and V of one token on one GPU; with tp > kv_heads every GPU keeps one (replicated) KV head, as
    SGLang's QKVParallelLinear does (`num_kv_heads = max(1, total_num_kv_heads // tp_size)`). MLA: SGLang caches
    the compressed KV and the RoPE key, (kv_lora_rank + rope dim) per layer, whole on every TP rank. A GDN hybrid
    caches K and V in its full-attention layers only (its GDN layers keep a per-sequence state: `generator_memory`)."""
    if model.mla:
        return model.layers * (model.mla[1] + model.mla[2]) * layout.kv_bytes
    kv_layers = model.layers - (len(model.gdn.layers) if model.gdn else 0)
    return 2 * kv_layers * max(1, model.kv_heads // layout.tp) * model.head_dim * layout.kv_bytes


def generator_weight_bytes(model: ModelShape, layout: GenLayout) -> int:
    replicated = model.mixer_params(range(model.layers))[1] + model.hidden
    replicated += model.moe_layers * (model.router_params() + model.shared_expert_gate_params())
    sharded = model.total_params() - replicated
    if layout.quantization == "none":
        return 2 * (sharded // layout.tp + replicated)
    from scalerl_mega.quant.fp8 import bytes_per_param  # FP8 projections (+ block scales); embedding, head: bf16
    table = model.embedding_params() + model.head_params()
    return int((2 * table + bytes_per_param(layout.quantization) * (sharded - table)) / layout.tp) + 2 * replicated


def generator_memory(model: ModelShape, layout: GenLayout, device: Device) -> MemoryReport:
    """SGLang per-GPU memory: weights + the KV pool needed for ``min_seqs`` full sequences (a GDN hybrid's: plus each
    sequence's recurrent + conv state, its value heads split over TP). The budget is ``mem_fraction_static *
    capacity`` (what SGLang reserves for weights + KV)."""
    layout.validate(model)
    weights = generator_weight_bytes(model, layout)
    per_tok, state = kv_bytes_per_token(model, layout), model.gdn_state_bytes(layout.tp)
    need_kv = layout.min_seqs * (layout.seq_len * per_tok + state)
    static = int(layout.mem_fraction_static * device.capacity_bytes)
    pool = max(0, static - weights)
    seqs = pool // (per_tok * layout.seq_len + state)
    notes = [f"KV bytes/token/GPU={per_tok:,}" + (f", GDN state bytes/sequence/GPU={state:,}" if state else ""),
             f"KV pool at mem_fraction_static={layout.mem_fraction_static}: {pool / GiB:.1f} GiB = "
             f"{pool // per_tok:,} tokens = {seqs} full sequences of {layout.seq_len}"]
    return MemoryReport(
        role="generator", components={"weights_bf16" if layout.quantization == "none" else "weights_fp8_bf16": weights,
                                      "kv_cache_min": need_kv}, budget_bytes=static, notes=notes
    )


# ------------------------------------------------------------------------- search
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smallest_trainer_layout(
    model: ModelShape, device: Device, *, base: TrainLayout, max_gpus: int = 1024, world: int | None = None,
    memory=None) -> TrainLayout | None:
    """Fewest-GPU layout (then lowest pp, then lowest tp) that fits, keeping ``base``'s micro-batch,
    sequence length, recompute, SP and optimizer settings. None if nothing up to ``max_gpus`` fits.
    With ``world``, only layouts of exactly that many GPUs are considered; ``memory``: the plan (``trainer_memory``)."""
    candidates = []
    tps = [t for t in (1, 2, 4, 8) if model.kv_heads % t == 0]
    pps = [p for p in _divisors(model.layers) if p <= 16]
    eps = _divisors(model.num_experts) if model.num_experts else [1]
    for t in tps:
        for p in pps:
            for d in range(1, max_gpus // (t * p) + 1):
                for e in eps:
                    if (t * d) % (e * base.etp) or (world is not None and t * p * d != world):
                        continue
                    lay = replace(base, tp=t, pp=p, dp=d, ep=e, sequence_parallel=base.sequence_parallel or t > 1)
                    candidates.append(lay)
    candidates.sort(key=lambda lay: (lay.world, lay.pp, lay.tp, -lay.ep))
    for lay in candidates:
        try:
            if (memory or trainer_memory)(model, lay, device).fits:
                return lay
        except ValueError:
            continue
    return None


def smallest_generator_layout(model: ModelShape, device: Device, *, base: GenLayout) -> GenLayout | None:
    for t in (1, 2, 4, 8):
        if model.kv_heads % t and t % model.kv_heads:
            continue
        lay = replace(base, tp=t)
        if generator_memory(model, lay, device).fits:
            return lay
    return None


def format_report(report: MemoryReport) -> str:
    lines = [f"{report.role}:"]
    for k, v in report.components.items():
        lines.append(f"  {k:<16} {v / GiB:9.2f} GiB")
    verdict = "fits" if report.fits else "DOES NOT FIT"
    lines.append(f"  {'total':<16} {report.total_bytes / GiB:9.2f} GiB of {report.budget_bytes / GiB:.2f} GiB -> {verdict}")
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)
