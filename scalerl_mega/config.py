"""Typed configuration schemas for `scalerl-train` (one Hydra group per axis under `conf/`).

One dataclass per ablation axis; each Hydra group under `conf/<group>/` fills one of them, and the
`experiment/` overlays pick one option per axis (paper Sec. 4, App. A.9 LOO, App. A.15 recipes).
The model / parallelism / optimizer sections are the Megatron trainer's own dataclasses
(`scalerl_mega.model.config`), composed here rather than duplicated.

`register_configs()` puts the schema into Hydra's ConfigStore (call it before composing);
`validate(cfg)` checks cross-field constraints and raises ValueError naming the offending key;
`validate_machine(cfg)` checks what needs this machine (devices, the tokenizer directory), also
before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from scalerl_mega.rewards.custom import RewardSettings
from scalerl_mega.model.config import ModelConfig, OptimConfig, ParallelConfig

SCHEMA_NAME = "train_schema"

LOSS_NAMES = ("cispo", "dapo", "grpo", "gspo")
AGGREGATION_NAMES = ("prompt", "sample", "token")
ADV_NORM_NAMES = ("batch", "prompt", "none")
OFF_POLICY_NAMES = ("pipeline_rl", "ppo_off_policy")
LENGTH_NAMES = ("interruption", "penalty")
CURRICULUM_NAMES = ("no_positive_resampling", "uniform")
FILTER_NAMES = ("zero_variance", "none")
PRECISION_NAMES = ("fp32_head", "bf16_head")
ROLLOUT_NAMES = ("local", "sglang")
CLUSTER_NAMES = ("local", "slurm")
DATA_NAMES = ("synthetic", "polaris", "deepcoder", "math_code", "jsonl")
RESUME_MODES = ("auto", "never")
MISMATCH_MODES = ("warn", "stop", "assert")

INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
"""Paper Sec. 4: the end-of-thinking phrase injected at a forced interruption."""


@dataclass
class DataConfig:
    """Prompt sources and the held-out validation split (paper Sec. 2 "Scaling curve on held-out")."""

    name: str = "synthetic"
    """synthetic | polaris | deepcoder | math_code | jsonl (your own files; data/columns.py)."""
    train_files: list[str] = field(default_factory=list)
    """JSONL / Parquet files (or HF dataset names) for the non-synthetic sources."""
    code_files: list[str] = field(default_factory=list)
    """Extra code-task files mixed in by `math_code` (Deepcoder schema)."""
    synthetic_num_prompts: int = 20000
    """Number of distinct problems the synthetic task draws from (only for name=synthetic)."""
    synthetic_max_digits: int = 3
    val_prompts: int = 1000
    """Held-out prompts (paper: 1,000 from Polaris-53K)."""
    val_samples: int = 16
    """Samples per validation prompt (paper: mean@16)."""
    val_paired_draws: bool = False
    """false: the validation sampling seeds include the run's `seed`, so seeds draw independent validation
    noise (runs of different recipes with the same seed still share their draws: paired by seed).
    true: every run draws the same random numbers whatever its seed (the old behaviour; common random
    numbers for A/B comparisons of one seed each, but seed spreads then understate the noise)."""
    split_seed: int = 0
    max_prompt_tokens: int = 2048
    tokenizer_path: str = ""
    """Local HF tokenizer directory (e.g. the model's HF checkpoint) for polaris/deepcoder/math_code."""
    template: str = ""
    """Prompt template with `{problem}` (the user turn under a chat template); empty: the task's default
    (data/sources.py)."""
    prompt_key: str = ""
    """Column of `train_files` holding the problem text; empty: the dataset's (problem)."""
    answer_key: str = ""
    """Column of `train_files` holding the reference (math answer / code tests); empty: the dataset's."""
    task: str = "math"
    """data=jsonl: the reward family of its rows, math | code."""
    use_chat_template: bool = True
    """Format prompts through the tokenizer's chat template when it has one."""


@dataclass
class LossConfig:
    """Policy loss (paper Sec. 3.2 "Loss type"); conventions of `scalerl_mega.objective.losses`."""

    name: str = "cispo"
    """cispo | dapo | grpo | gspo."""
    eps_low: Optional[float] = None
    """dapo/grpo/gspo: ratio clipped below at 1 - eps_low. cispo: optional absolute floor of the
    truncated weight (None = no floor, the paper's setting). None = the loss's default."""
    eps_high: Optional[float] = None
    """dapo/grpo/gspo: ratio clipped above at 1 + eps_high. cispo: the absolute cap eps_max of
    sg(min(rho, eps_max)) (paper Sec. 4; App. A.16: 4, 5 and 8 are equivalent). None = default."""
    is_correction: str = "none"
    """Train-vs-generator importance-sampling correction (objective/is_correction.py): none (ScaleRL,
    the paper's setting) | tis_token | tis_seq (truncated IS, weight min(rho, is_cap)) | mis_token |
    mis_seq (masked IS / IcePop: weight rho inside [is_low, is_high], 0 outside). With a correction,
    dapo/grpo/gspo clip the ratio against the trainer's own old policy; cispo takes only mis_*. Runs
    the logits path (no fused CISPO head)."""
    is_cap: float = 2.0
    """tis_*: the cap C of the truncated IS weight min(rho, C)."""
    is_low: float = 0.5
    """mis_*: tokens (sequences) whose IS ratio is below this are masked out."""
    is_high: float = 2.0
    """mis_*: tokens (sequences) whose IS ratio is above this are masked out."""


@dataclass
class AggregationConfig:
    """Loss aggregation (paper Sec. 3.2): prompt average, sample average or token average."""

    name: str = "prompt"


@dataclass
class AdvNormConfig:
    """Advantage normalization (paper Sec. 3.2): batch-level std, prompt-level std, or none."""

    name: str = "batch"
    eps: float = 1e-6
    """The epsilon added to the std (GRPO Eq. advantage)."""


@dataclass
class OffPolicyConfig:
    """Asynchronous RL setup (paper Sec. 3.1): PipelineRL-k or PPO-off-policy-k."""

    name: str = "pipeline_rl"
    k: int = 8
    """PipelineRL: max trainer steps between a sample's admission and its use. PPO-off-policy:
    optimizer steps per generation phase (k * B prompts generated on fixed weights)."""
    overlap: bool = False
    """PPO-off-policy only. False (the paper's phases): generate all k * B prompts on fixed weights,
    then take k optimizer steps while the generators are idle. True: start training as soon as the
    phase's oldest B groups are complete, while the rest of the phase is still generating (same
    weights and staleness, less idle time; not the paper's accounting)."""


@dataclass
class LengthConfig:
    """Generation length control (paper App. A.10): forced interruption or DAPO overlong penalty."""

    name: str = "interruption"
    max_new_tokens: int = 14336
    """Total generation budget (paper: 12k thinking + 2k solution)."""
    interruption_min: int = 10240
    """Interruption position is drawn uniformly in [interruption_min, interruption_max] (App. A.10)."""
    interruption_max: int = 12288
    answer_budget: int = 2048
    """Tokens allowed after the injected phrase (paper: 2,048 for the solution)."""
    interruption_phrase: str = INTERRUPTION_PHRASE
    penalty_max_len: int = 14336
    """DAPO overlong penalty L_max (paper App. A.10: 14k)."""
    penalty_cache_len: int = 2048
    """DAPO overlong penalty tolerance L_cache (paper App. A.10: 2k)."""


@dataclass
class CurriculumConfig:
    """Prompt sampling across epochs (paper Sec. 3.2 "Adaptive Prompt Filtering")."""

    name: str = "no_positive_resampling"
    pass_rate_threshold: float = 0.9
    """No-Positive-Resampling: prompts whose historical pass rate is >= this are dropped for good."""


@dataclass
class FilterConfig:
    """Batch definition (paper Sec. 3.2 "Zero-Variance Filtering")."""

    name: str = "zero_variance"


@dataclass
class PrecisionConfig:
    """LM-head precision on generator and trainer (paper Sec. 3.2 "FP32 Precision")."""

    name: str = "fp32_head"
    """fp32_head | bf16_head; the group also sets `model.fp32_lm_head` (trainer) accordingly."""
    params_dtype: str = "bfloat16"
    """Parameter/activation dtype of the model body on trainer and generators: bfloat16 | float32.
    bfloat16: Megatron mixed precision (bf16 params, FP32 main weights + Adam in the optimizer)."""
    grad_reduce_in_fp32: bool = True
    """Trainer: accumulate and all-reduce gradients in FP32 (Megatron DDP `grad_reduce_in_fp32`)."""


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
    engine_threads: int = 1
    """torch threads in each local engine process."""
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
    inflight_hold_tokens: int = 0
    """Rehearsal/test knob (local engine, PipelineRL only): a request that cannot be trained before
    the next weight update pauses after this many tokens until that update arrives, so in-flight
    updates on a stale KV cache happen deterministically instead of depending on relative speeds
    (`SamplingParams.hold_at`). 0: off (production)."""


@dataclass
class ClusterConfig:
    """Where the job runs; also the device count used for compute accounting (paper Sec. 2)."""

    name: str = "local"
    device: str = "cpu"
    """cpu | cuda."""
    nodes: int = 1
    devices_per_node: int = 1
    trainer_devices: int = 0
    """Devices (ranks) of the trainer job; 0: the launcher's WORLD_SIZE. A value that differs from
    the launched world size is refused at start-up."""
    generator_devices: int = 0
    """All generator devices of the allocation (paper: 64), counted once in the compute C; 0:
    rollout.num_engines x devices per engine (rollout.sglang_tp_size, or 1 for local engines)."""
    trainer_threads: int = 0
    """torch intra-op threads in the trainer process; 0 keeps torch's default. On a shared CPU
    machine use 1: OpenMP spin-waiting under contention made 2-thread steps 10-40x slower."""
    partition: Optional[str] = None
    """Slurm partition (None: the cluster's default); with `account`, `time_min`, `cpus_per_task`,
    `mem_gb` and `gpus_per_node` it feeds conf/hydra/launcher/scalerl_slurm.yaml."""
    account: Optional[str] = None
    time_min: int = 60
    cpus_per_task: int = 1
    """Slurm launcher (Hydra multirun via submitit): CPUs per job (conf/hydra/launcher reads these)."""
    mem_gb: int = 4
    gpus_per_node: int = 0
    """GPUs requested per job by the sweep launcher (0: CPU jobs, no --gpus-per-node)."""


@dataclass
class TrainLoopConfig:
    """RL loop sizes and cadences (paper App. A.3: 48 prompts x 16 generations per step)."""

    steps: int = 1000
    prompts_per_step: int = 48
    """B: prompts per optimizer step (before zero-variance filtering)."""
    generations_per_prompt: int = 16
    """G: completions per prompt."""
    micro_batch_tokens: int = 16384
    """Token budget of one Megatron micro-batch: rows x its own longest row (or the packed length)."""
    pack_sequences: bool = False
    """Pack several samples into each micro-batch row, attention masked per sample (Megatron THD
    packed sequences with Transformer Engine on GPU, a block-diagonal causal mask otherwise). Off by
    default: length-sorted micro-batches trimmed to their own longest row already execute little
    padding (README "Micro-batches"), and the mask path's attention is quadratic in the packed length."""
    fused_cispo: bool = True
    """loss=cispo with the FP32 head: compute the head and CISPO from the last hidden states chunk by
    chunk (objective.fused_logprob.cispo_from_hidden), never materialising [N, V] logits."""
    val_every: int = 100
    """Validation cadence in steps (paper: 100); 0 disables validation."""
    save_every: int = 100
    """Checkpoint cadence in steps; 0 disables checkpoints."""
    keep_checkpoints: int = 2
    """Retention: the newest N complete checkpoints are kept (the one `latest` names always); 0 keeps
    all. With 1 there is no previous checkpoint to fall back to when the latest is found damaged."""
    poll_timeout_s: float = 0.05
    sigterm_grace_s: float = 120.0
    """On SIGTERM (Slurm preemption / time limit) the run checkpoints at its next safe point and exits
    0; if none comes within this many seconds it kills what it started and exits 143
    (scalerl_mega/preemption.py)."""
    follower_timeout_s: float = 10800.0
    """Multi-rank trainer jobs: how long the non-controller ranks wait for the controller's next
    command (it generates, scores and validates in between; a slow validation pass can take an hour
    at the paper's sizes). A controller that dies is noticed at once, not after this."""
    recompute: str = "selective"
    """Activation recompute on the trainer: none | selective (core attention, Megatron
    `recompute_granularity=selective`; drops the s^2 attention scores) | full (every layer,
    `recompute_method=uniform`). Same losses and gradients in every mode."""


@dataclass
class SFTConfig:
    """Optional supervised warm start before RL (used by the CPU demo; Megatron next-token loss)."""

    steps: int = 0
    """0 disables the warm start."""
    lr: float = 1e-3
    warmup_steps: int = 50
    batch_size: int = 64
    eval_every: int = 100
    checkpoint: str = ""
    """A shared warm-start checkpoint directory (e.g. one per seed for a sweep whose recipes differ only
    in RL): a fresh run loads it instead of running the warm start when it holds a complete checkpoint
    whose fingerprint (`train.sft_fingerprint`: seed, model, data, optim, sft, params dtype) matches,
    else runs the warm start and writes it there. Empty: no sharing."""
    any_seed: bool = False
    """Accept a `checkpoint` written by a run with another seed: every seed then starts RL from the same
    weights, as the paper's seeds all start from one SFT checkpoint (their spread is RL noise only)."""


@dataclass
class MetricsConfig:
    """metrics.jsonl, TensorBoard, optional W&B / MLflow, and the console progress line."""

    tensorboard: bool = True
    loggers: list[str] = field(default_factory=list)
    """Optional trackers mirroring metrics.jsonl: wandb, mlflow (metrics/loggers.py)."""
    wandb_project: str = "scalerl-mega"
    wandb_mode: str = "offline"
    """offline (sync later with `wandb sync`) | online | disabled."""
    mlflow_tracking_uri: str = ""
    """Empty: a local file store in <output_dir>/mlruns."""
    progress_every: int = 1
    weights_digest: bool = False
    """After every weight push, log the SHA-256 of the weights the (local) engine holds as
    `gen/weights_sha256` (checks a multi-rank export against a single-process one; costs a pass
    over the generator's weights)."""
    truncation_alarm: float = 0.10
    """Warn when the step's truncation rate exceeds this (paper App. A.13: 10-15% destabilises)."""
    max_logprob_mismatch: Optional[float] = None
    """Engine-vs-trainer guard: when a step's `train/onpolicy_abs_log_ratio_max` (max over on-policy
    tokens of |log pi_train - log pi_engine|) exceeds this, act per `mismatch_mode`. None: off."""
    mismatch_mode: str = "stop"
    """What `max_logprob_mismatch` does (metrics/alarms.py `MismatchGuard`): warn (a warning once per
    excursion, the run goes on) | stop (after logging the step, exit non-zero with a message; no
    checkpoint of that step is written) | assert (CI: like stop but an AssertionError, and the run also
    fails at its end if no step had an on-policy token to check)."""


@dataclass
class MoEConfig:
    """MoE train/inference consistency: rollout routing replay (issue #19, trainer/megatron/routing.py)."""

    routing_replay: str = "none"
    """none: the trainer routes by itself | ids: replay the generator's expert ids (Megatron router
    replay; the trainer recomputes the gate weights) | ids_and_weights: also the generator's gate
    weights (forward value; straight-through gradient)."""
    record_routes: Optional[bool] = None
    """Record the generators' MoE routes (the local engine's router hooks; SGLang's
    `return_routed_experts` and its `--enable-return-routed-experts`). None: only when
    `routing_replay` is not none (`records_routes`): on Scout they are ~5 GB a step that nothing
    reads otherwise. true: also without replay, for the `train/routing_agreement*` metrics."""


@dataclass
class ForecastConfig:
    """Live sigmoid fit at every validation (paper Eq. sigmoid_law, App. A.5)."""

    enabled: bool = True
    budget: float = 0.0
    """Compute budget (same unit as the fit's C) at which to report the predicted reward; 0 = 2x
    the compute spent so far."""
    min_points: int = 4
    """Validation points needed before a fit is attempted (A is identified only from
    `scaling.identify.MIN_POINTS` = 8 points after the cut)."""
    fit_from: float = 0.0
    """Exclude validation points below this compute; 0 = the automatic cut: the paper's 1.5k GPU-hours
    on a GPU-hour axis that reaches it (App. A.5/A.7), else `cut_fraction` x the compute so far."""
    cut_fraction: float = 0.1
    """The automatic cut for small runs: points below this share of the compute so far are not fitted
    (the paper's 1.5k of 16k GPU-hours is 0.094: about one epoch). 0: no cut."""


@dataclass
class TrainConfig:
    """The whole `scalerl-train` configuration (conf/train.yaml)."""

    run_name: str = "scalerl"
    seed: int = 0
    output_dir: str = "."
    """Run directory (train.yaml sets it to Hydra's run dir)."""
    resume: str = "auto"
    """auto: continue from the newest checkpoint in output_dir if one exists; never; or a path."""
    init_from_hf: str = ""
    """Hugging Face checkpoint dir (config.json + safetensors) whose weights initialise the policy on a
    fresh run, e.g. Llama-3.1-8B or Llama-4-Scout (the paper starts RL from an SFT checkpoint). Its
    shapes must match `model`; converted on the fly to the trainer's TP/PP/EP layout. Empty: random
    init (the CPU demo, which warm-starts with `sft`)."""
    dry_run: bool = False
    """Build the trainer's real Megatron layout on the meta device for every distinct rank role of a
    `cluster.trainer_devices` world (fake process group, one CPU process), write
    `output_dir/dry_run.json` with per-rank bytes and exit (trainer/megatron/dry_run.py)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardSettings = field(default_factory=RewardSettings)
    loss: LossConfig = field(default_factory=LossConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    adv_norm: AdvNormConfig = field(default_factory=AdvNormConfig)
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    length: LengthConfig = field(default_factory=LengthConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)


def records_routes(cfg: Any) -> bool:
    """Whether the generators record MoE routes: an MoE model and `moe.record_routes`, which unset
    (None) means "when `moe.routing_replay` replays them"."""
    record = cfg.moe.record_routes
    return bool(cfg.model.is_moe) and (cfg.moe.routing_replay != "none" if record is None else bool(record))


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore; conf/train.yaml lists it first in its defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {list(allowed)}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{key}={value!r} must be {bound}")


def validate(cfg: Any) -> None:
    """Check a composed config (a TrainConfig or an OmegaConf node with the same keys).

    Raises ValueError naming the first offending key and its value.
    """
    _one_of("data.name", cfg.data.name, DATA_NAMES)
    _one_of("loss.name", cfg.loss.name, LOSS_NAMES)
    _one_of("aggregation.name", cfg.aggregation.name, AGGREGATION_NAMES)
    _one_of("adv_norm.name", cfg.adv_norm.name, ADV_NORM_NAMES)
    _one_of("off_policy.name", cfg.off_policy.name, OFF_POLICY_NAMES)
    _one_of("length.name", cfg.length.name, LENGTH_NAMES)
    _one_of("curriculum.name", cfg.curriculum.name, CURRICULUM_NAMES)
    _one_of("filter.name", cfg.filter.name, FILTER_NAMES)
    _one_of("precision.name", cfg.precision.name, PRECISION_NAMES)
    _one_of("precision.params_dtype", cfg.precision.params_dtype, ("bfloat16", "float32"))
    _one_of("train.recompute", cfg.train.recompute, ("none", "selective", "full"))
    _one_of("rollout.name", cfg.rollout.name, ROLLOUT_NAMES)
    _one_of("cluster.name", cfg.cluster.name, CLUSTER_NAMES)
    _one_of("cluster.device", cfg.cluster.device, ("cpu", "cuda"))
    _one_of("moe.routing_replay", cfg.moe.routing_replay, ("none", "ids", "ids_and_weights"))
    if cfg.moe.routing_replay == "ids_and_weights" and cfg.rollout.name == "sglang":
        raise ValueError("moe.routing_replay='ids_and_weights' with rollout.name='sglang': SGLang 0.5.23 returns "
                         "the routed expert ids only (meta_info.routed_experts), no gate weights; use "
                         "moe.routing_replay=ids")
    if cfg.moe.routing_replay != "none" and cfg.train.pack_sequences:
        raise ValueError(f"moe.routing_replay={cfg.moe.routing_replay!r} with train.pack_sequences=true: the "
                         "generator's routes are per sample and are not packed; use train.pack_sequences=false")
    if cfg.moe.routing_replay != "none" and cfg.moe.record_routes is False:
        raise ValueError(f"moe.routing_replay={cfg.moe.routing_replay!r} needs the generator's routes: "
                         "moe.record_routes=false")
    if not str(cfg.resume):
        raise ValueError("resume='' must be 'auto', 'never' or a checkpoint directory")

    if bool(cfg.model.fp32_lm_head) != (cfg.precision.name == "fp32_head"):
        raise ValueError(
            f"model.fp32_lm_head={cfg.model.fp32_lm_head} contradicts precision.name={cfg.precision.name!r}"
        )

    _positive("off_policy.k", cfg.off_policy.k)
    if cfg.off_policy.overlap and cfg.off_policy.name != "ppo_off_policy":
        raise ValueError(f"off_policy.overlap=true applies to off_policy.name=ppo_off_policy only "
                         f"(got {cfg.off_policy.name!r})")
    _positive("train.steps", cfg.train.steps)
    _positive("train.prompts_per_step", cfg.train.prompts_per_step)
    _positive("train.generations_per_prompt", cfg.train.generations_per_prompt)
    if cfg.train.generations_per_prompt < 2:
        raise ValueError(
            f"train.generations_per_prompt={cfg.train.generations_per_prompt} must be >= 2 "
            "(group-relative advantages need at least two samples)"
        )
    _positive("train.micro_batch_tokens", cfg.train.micro_batch_tokens)
    if cfg.train.pack_sequences and int(getattr(cfg.parallel, "cp", 1)) > 1:
        raise ValueError(f"train.pack_sequences=true with parallel.cp={cfg.parallel.cp}: packed rows are not "
                         "split for context parallelism")
    _positive("train.val_every", cfg.train.val_every, allow_zero=True)
    if not 0.0 <= cfg.forecast.cut_fraction < 1.0:
        raise ValueError(f"forecast.cut_fraction={cfg.forecast.cut_fraction} must be in [0, 1)")
    _positive("train.save_every", cfg.train.save_every, allow_zero=True)
    _positive("train.keep_checkpoints", cfg.train.keep_checkpoints, allow_zero=True)
    _positive("data.val_prompts", cfg.data.val_prompts, allow_zero=True)
    _positive("data.val_samples", cfg.data.val_samples)
    _positive("sft.steps", cfg.sft.steps, allow_zero=True)
    _validate_sizes(cfg)
    _validate_sft(cfg)
    _positive("rollout.num_engines", cfg.rollout.num_engines)
    _positive("rollout.max_batch_size", cfg.rollout.max_batch_size)
    _positive("rollout.temperature", cfg.rollout.temperature)
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ValueError(f"rollout.top_p={cfg.rollout.top_p!r} must be in (0, 1]")
    if cfg.rollout.top_p < 1.0:
        raise ValueError(
            f"rollout.top_p={cfg.rollout.top_p!r} is refused: the engine would sample from the top-p nucleus "
            "while the trainer's log-probs (and the engine's returned log-probs) are over the full vocabulary, "
            "which biases every importance ratio; the trainer cannot renormalise over the same nucleus exactly "
            "with vocab-parallel logits or the fused FP32 head (README 'Train/inference consistency'). "
            "Use rollout.top_p=1.0")
    _positive("cluster.nodes", cfg.cluster.nodes)
    _positive("cluster.devices_per_node", cfg.cluster.devices_per_node)
    _positive("cluster.trainer_threads", cfg.cluster.trainer_threads, allow_zero=True)
    _positive("cluster.trainer_devices", cfg.cluster.trainer_devices, allow_zero=True)
    _positive("cluster.generator_devices", cfg.cluster.generator_devices, allow_zero=True)
    _positive("train.follower_timeout_s", cfg.train.follower_timeout_s)
    _positive("train.sigterm_grace_s", cfg.train.sigterm_grace_s)
    _positive("rollout.stall_timeout_s", cfg.rollout.stall_timeout_s)
    _positive("rollout.inflight_hold_tokens", cfg.rollout.inflight_hold_tokens, allow_zero=True)
    if cfg.rollout.inflight_hold_tokens and (cfg.rollout.name != "local" or cfg.off_policy.name != "pipeline_rl"):
        raise ValueError(f"rollout.inflight_hold_tokens={cfg.rollout.inflight_hold_tokens} needs rollout.name=local "
                         f"and off_policy.name=pipeline_rl (got {cfg.rollout.name!r}, {cfg.off_policy.name!r})")

    eps_low, eps_high = cfg.loss.eps_low, cfg.loss.eps_high
    if eps_high is not None and not eps_high > 0:
        raise ValueError(f"loss.eps_high={eps_high!r} must be > 0")
    if cfg.loss.name == "cispo":
        if eps_low is not None and eps_high is not None and not 0 <= eps_low <= eps_high:
            raise ValueError(f"loss.eps_low={eps_low!r} must be in [0, loss.eps_high={eps_high}] for cispo")
    else:
        if eps_low is not None and not 0 <= eps_low < 1:
            raise ValueError(f"loss.eps_low={eps_low!r} must be in [0, 1) for {cfg.loss.name}")
        if cfg.loss.name == "grpo" and eps_low is not None and eps_high is not None and eps_low != eps_high:
            raise ValueError(f"loss.eps_low={eps_low} != loss.eps_high={eps_high}: grpo clips symmetrically")
    if not 0.0 < cfg.curriculum.pass_rate_threshold <= 1.0:
        raise ValueError(
            f"curriculum.pass_rate_threshold={cfg.curriculum.pass_rate_threshold!r} must be in (0, 1]"
        )
    if not 0.0 < cfg.metrics.truncation_alarm <= 1.0:
        raise ValueError(f"metrics.truncation_alarm={cfg.metrics.truncation_alarm!r} must be in (0, 1]")
    _validate_mismatch(cfg)

    length = cfg.length
    _positive("length.max_new_tokens", length.max_new_tokens)
    if length.name == "interruption":
        _positive("length.interruption_min", length.interruption_min)
        if length.interruption_min > length.interruption_max:
            raise ValueError(
                f"length.interruption_min={length.interruption_min} > "
                f"length.interruption_max={length.interruption_max}"
            )
        if length.interruption_max + length.answer_budget > length.max_new_tokens:
            raise ValueError(
                f"length.interruption_max + length.answer_budget = "
                f"{length.interruption_max + length.answer_budget} exceeds "
                f"length.max_new_tokens={length.max_new_tokens}"
            )
        if not length.interruption_phrase:
            raise ValueError("length.interruption_phrase must not be empty")
    else:
        _positive("length.penalty_cache_len", length.penalty_cache_len)
        if length.penalty_cache_len > length.penalty_max_len:
            raise ValueError(
                f"length.penalty_cache_len={length.penalty_cache_len} > "
                f"length.penalty_max_len={length.penalty_max_len}"
            )


def _validate_mismatch(cfg: Any) -> None:
    """loss.is_* (off-policy corrections) and metrics.max_logprob_mismatch / mismatch_mode."""
    from scalerl_mega.objective.is_correction import IS_CORRECTIONS

    loss = cfg.loss
    _one_of("loss.is_correction", loss.is_correction, IS_CORRECTIONS)
    if loss.is_correction.startswith("tis"):
        _positive("loss.is_cap", loss.is_cap)
        if loss.name == "cispo":
            raise ValueError(f"loss.is_correction={loss.is_correction!r} with loss.name='cispo': CISPO's "
                             "sg(min(rho, eps_high)) already is a token-level truncated IS weight (loss.eps_high "
                             "is its cap); use none, mis_token or mis_seq")
    if loss.is_correction.startswith("mis"):
        _positive("loss.is_low", loss.is_low, allow_zero=True)
        _positive("loss.is_high", loss.is_high)
        if not loss.is_high > loss.is_low:
            raise ValueError(f"loss.is_high={loss.is_high!r} must be > loss.is_low={loss.is_low!r}")
    _one_of("metrics.mismatch_mode", cfg.metrics.mismatch_mode, MISMATCH_MODES)
    if cfg.metrics.max_logprob_mismatch is not None:
        _positive("metrics.max_logprob_mismatch", cfg.metrics.max_logprob_mismatch)


def _validate_sft(cfg: Any) -> None:
    """SFT warm-start keys (used only when sft.steps > 0, after the trainer is built: check them now)."""
    if not cfg.sft.steps:
        return
    _positive("sft.lr", cfg.sft.lr)
    _positive("sft.batch_size", cfg.sft.batch_size)
    _positive("sft.warmup_steps", cfg.sft.warmup_steps, allow_zero=True)
    _positive("sft.eval_every", cfg.sft.eval_every, allow_zero=True)
    if cfg.data.name == "synthetic":
        n_train = cfg.data.synthetic_num_prompts - cfg.data.val_prompts
        if cfg.sft.batch_size > n_train:
            raise ValueError(f"sft.batch_size={cfg.sft.batch_size} exceeds the {n_train} SFT examples "
                             f"(data.synthetic_num_prompts - data.val_prompts)")


def _validate_sizes(cfg: Any) -> None:
    """Sizes that only clash with each other: held-out set vs dataset, prompt + generation vs context."""
    _positive("data.max_prompt_tokens", cfg.data.max_prompt_tokens)
    if cfg.data.name == "synthetic":
        _positive("data.synthetic_num_prompts", cfg.data.synthetic_num_prompts)
        if cfg.data.val_prompts >= cfg.data.synthetic_num_prompts:
            raise ValueError(f"data.val_prompts={cfg.data.val_prompts} must be < data.synthetic_num_prompts="
                             f"{cfg.data.synthetic_num_prompts} (the held-out set would take the whole dataset)")
    need = cfg.data.max_prompt_tokens + cfg.length.max_new_tokens
    if need > cfg.model.max_position_embeddings:
        raise ValueError(f"data.max_prompt_tokens + length.max_new_tokens = {need} exceeds "
                         f"model.max_position_embeddings={cfg.model.max_position_embeddings}")


def validate_machine(cfg: Any) -> None:
    """Checks against this machine (run by `scalerl-train` before anything is built; skipped for
    cluster.name=slurm, whose jobs run elsewhere): the requested devices exist, and the tokenizer
    directory loads. Raises ValueError naming the key."""
    if cfg.cluster.name == "local" and cfg.cluster.device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            raise ValueError("cluster.device='cuda' but this machine has no usable CUDA device")
        if cfg.cluster.devices_per_node > have:
            raise ValueError(f"cluster.devices_per_node={cfg.cluster.devices_per_node} but this machine has "
                             f"{have} CUDA device(s)")
        if cfg.cluster.trainer_devices > have:
            raise ValueError(f"cluster.trainer_devices={cfg.cluster.trainer_devices} but this machine has "
                             f"{have} CUDA device(s)")
    if cfg.cluster.name == "local" and cfg.data.name != "synthetic":
        for key, path in (("data.tokenizer_path", str(cfg.data.tokenizer_path)), ("init_from_hf", str(cfg.init_from_hf))):
            if path:
                check_tokenizer_dir(path, key=key)
                break
    if cfg.cluster.name == "local" and cfg.cluster.device == "cpu" and cfg.precision.params_dtype == "bfloat16":
        warn_cpu_bf16()


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of native bf16 arithmetic: x86 AVX512-BF16 and AMX-BF16, AArch64 BF16 (`Features`)."""
_cpu_bf16_warned = False


def cpu_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bf16 natively (`CPU_BF16_FLAGS` among the flags of `cpuinfo`, default
    /proc/cpuinfo); None when that cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return any(f in flags for f in CPU_BF16_FLAGS)


def warn_cpu_bf16(*, cpuinfo: str | None = None) -> bool:
    """Warn (once per process, rank 0 only) that bf16 parameters on a CPU without native bf16 run
    emulated: several times slower than FP32 (4.7x on the reproduction config, measured on an AVX2-only
    machine; issue 26). Returns whether it warned."""
    import logging
    import os

    global _cpu_bf16_warned
    if _cpu_bf16_warned or os.environ.get("RANK", "0") != "0" or cpu_native_bf16(cpuinfo) is not False:
        return False
    _cpu_bf16_warned = True
    logging.getLogger("scalerl_mega.config").warning(
        "precision.params_dtype=bfloat16 with cluster.device=cpu: this CPU has no native bf16 (none of %s in "
        "/proc/cpuinfo), so bf16 matmuls are emulated and run several times slower than FP32 (4.7x measured on "
        "the reproduction config). Override with precision.params_dtype=float32 (the FP32 head stays on).",
        "/".join(CPU_BF16_FLAGS))
    return True


def check_tokenizer_dir(path: str, *, key: str) -> None:
    """Load the HF tokenizer in `path` once; any failure (missing dir, corrupt tokenizer.json -- which
    surfaces from `tokenizers` as KeyError/Exception) becomes ValueError naming `key` and the path."""
    import os

    if not os.path.isdir(path):
        raise ValueError(f"{key}={path!r}: no such directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - every loader failure is a bad tokenizer directory
        raise ValueError(f"{key}={path!r}: not a loadable HF tokenizer ({type(exc).__name__}: {exc})") from exc
    if getattr(tok, "eos_token_id", None) is None:
        raise ValueError(f"{key}={path!r}: the tokenizer has no EOS token")
