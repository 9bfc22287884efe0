"""The `rollout` group: the generation backend (the RolloutEngine seam of interfaces.py) and its checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl_mega.config.checks import one_of, positive

ROLLOUT_NAMES = ("local", "sglang")
SYNC_SENDERS = ("single", "per_stage")
QUANTIZATIONS = ("none", "fp8")  # quant/fp8.py QUANTIZATIONS (kept here: the config layer imports no torch)
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
"""`rollout.kv_cache_dtype`: the values of SGLang 0.5.23's `--kv-cache-dtype` the project launches with (SGLang also
takes bf16, mxfp8 and FP4 recipes; auto is the model dtype, which bf16 already is here)."""


def kv_cache_element_bytes(kv_cache_dtype: str, *, model_bytes: int) -> int:
    """Bytes per cached K or V element: one under an FP8 KV cache, else the model dtype's `model_bytes` (auto).
    The one rule of the planner (`tools/plan.py --kv-cache-dtype`) and the dry run (`rollout.kv_cache_dtype`)."""
    one_of("rollout.kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
    return model_bytes if kv_cache_dtype == "auto" else 1


@dataclass
class RolloutConfig:
    """Generation backend (the RolloutEngine seam of interfaces.py)."""

    name: str = "local"
    """local (HF-transformers engine in its own process) | sglang."""
    num_engines: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_batch_size: int = 256
    """Max concurrent sequences per engine: the local engine's decode batch; rollout=sglang: the
    /generate requests kept in flight on each server (num servers x this in all, pooled connections)."""
    weight_sync_bucket_mb: int = 64
    weight_sync_flattened: bool = False
    """Send each weight bucket as one uint8 tensor (`WeightSyncConfig.flattened`, SGLang's
    load_format="flattened_bucket") instead of one broadcast per tensor: the same weights, one round trip per
    bucket. The demo model's 51 tensors (the reproduction's predictability design) to an idle local engine: 2.0 ms against 13.3 ms per update."""
    weight_sync_senders: str = "single"
    """single: trainer rank 0 gathers the whole model and sends it over one group | per_stage: every
    pipeline stage's first rank, and with EP > 1 every expert-parallel rank, sends its own share over its
    own group, all at once, to every engine (weight_sync/plan.py, trainer/megatron/sync_senders.py;
    docs/cluster_and_gpu.md "Weight sync"). Local engine processes or SGLang servers (each joins every sender's
    named group); not with rollout.in_process. A one-rank trainer has one sender either way."""
    engine_threads: int = 1
    """torch threads in each local engine process."""
    engine_nice: int = 0
    """CPU niceness added to each local engine process (0-19; `LocalEngineConfig.nice`): >0 gives the trainer
    priority where trainer and engines share the cores (two engine processes beside a trainer on 2 cores)."""
    sglang_host: str = "127.0.0.1"
    sglang_port: int = 30000
    sglang_tp_size: int = 1
    sglang_mem_fraction: float = 0.8
    startup_timeout_s: float = 600.0
    engine_urls: list[str] = field(default_factory=list)
    """rollout=sglang: attach to these running servers (http://host:port, e.g. the generator job
    steps of slurm/common.sh) instead of launching `num_engines` servers."""
    sync_master_address: str = ""
    """Address the servers use to reach the trainer for weight sync when attached; empty:
    127.0.0.1 if every engine URL is on this host, else this host's name."""
    stall_timeout_s: float = 1800.0
    """A generation or validation wait with requests in flight and no completion for this long is an
    error naming the engines (a hung or dead server), not an endless wait."""
    in_process: bool = False
    """rollout=local: run the engine's GenerationCore in the trainer's process on the trainer's device (one GPU
    for both; a weight push is an in-place copy, no process group: rollout/inprocess.py). Generation then
    advances only while the loop waits (no overlap with training). One engine, one trainer rank."""
    quantization: str = "none"
    """The generators' weight format: none (the trainer's dtype) | fp8 (blockwise FP8, DeepSeek-V3 / Qwen3-FP8
    format: every weight push sends each linear projection as float8_e4m3fn with its 128x128-block
    `weight_scale_inv`, about half the bytes of bf16; norms, routers, embeddings and the head keep their dtype.
    SGLang servers start on an FP8 copy of the initial checkpoint with `--quantization fp8`; the local engine
    holds the dequantized FP8 weights, so a CPU run sees the generator's real FP8 mismatch (quant/fp8.py)."""
    kv_cache_dtype: str = "auto"
    """The generators' KV cache: auto (the model dtype) | fp8_e4m3 | fp8_e5m2 (one byte per cached K or V element,
    SGLang's `--kv-cache-dtype`: about twice the sequences in the same KV pool, at the cost of rounding every cached
    key and value). SGLang-only: the local engine keeps its cache in the model dtype, so rollout=local refuses it.
    SGLang 0.5.23 on a CPU refuses both (fp8_e4m3 needs Intel AMX, fp8_e5m2 is GPU-only)."""
    inflight_hold_tokens: int = 0
    """Rehearsal/test knob (local engine, PipelineRL only): a request that cannot be trained before
    the next weight update pauses after this many tokens until that update arrives, so in-flight
    updates on a stale KV cache happen deterministically instead of depending on relative speeds
    (`SamplingParams.hold_at`). 0: off (production)."""

def validate_rollout(rollout: RolloutConfig) -> None:
    """`rollout.*` on its own (the pause mode and routes depend on other groups: `config.tree.validate`)."""
    one_of("rollout.name", rollout.name, ROLLOUT_NAMES)
    positive("rollout.num_engines", rollout.num_engines)
    positive("rollout.max_batch_size", rollout.max_batch_size)
    if not 0 <= rollout.engine_nice <= 19:
        raise ValueError(f"rollout.engine_nice={rollout.engine_nice!r} must be in 0..19 (added to the engine "
                         "processes' CPU niceness)")
    positive("rollout.temperature", rollout.temperature)
    if not 0.0 < rollout.top_p <= 1.0:
        raise ValueError(f"rollout.top_p={rollout.top_p!r} must be in (0, 1]")
    if rollout.top_p < 1.0:
        raise ValueError(
            f"rollout.top_p={rollout.top_p!r} is refused: the engine would sample from the top-p nucleus "
            "while the trainer's log-probs (and the engine's returned log-probs) are over the full vocabulary, "
            "which biases every importance ratio; the trainer cannot renormalise over the same nucleus exactly "
            "with vocab-parallel logits or the fused FP32 head (docs/running_scalerl.md 'Train/inference "
            "consistency'). Use rollout.top_p=1.0")
    positive("rollout.stall_timeout_s", rollout.stall_timeout_s)
    if rollout.in_process and (rollout.name != "local" or rollout.num_engines != 1):
        raise ValueError(f"rollout.in_process=true needs rollout.name=local and rollout.num_engines=1 (got "
                         f"{rollout.name!r}, {rollout.num_engines})")
    one_of("rollout.weight_sync_senders", rollout.weight_sync_senders, SYNC_SENDERS)
    if rollout.weight_sync_senders == "per_stage" and rollout.in_process:
        raise ValueError("rollout.weight_sync_senders=per_stage needs rollout.in_process=false (an in-process engine "
                         "takes the weights by copy, no sender groups); use rollout.weight_sync_senders=single")
    positive("rollout.inflight_hold_tokens", rollout.inflight_hold_tokens, allow_zero=True)
    one_of("rollout.quantization", rollout.quantization, QUANTIZATIONS)
    one_of("rollout.kv_cache_dtype", rollout.kv_cache_dtype, KV_CACHE_DTYPES)
    if rollout.kv_cache_dtype != "auto" and rollout.name != "sglang":
        raise ValueError(f"rollout.kv_cache_dtype={rollout.kv_cache_dtype!r} is SGLang-only (the servers' "
                         f"--kv-cache-dtype): rollout={rollout.name} keeps its KV cache in the model dtype; use "
                         "rollout=sglang, or rollout.kv_cache_dtype=auto")
