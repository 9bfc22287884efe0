"""The run's own groups: cluster (where it runs, compute accounting), train (loop sizes and cadences), sft
(the optional warm start), metrics, moe (routing replay) and forecast (the live fit), each with its checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from scalerl_mega.config.checks import one_of, positive

CLUSTER_NAMES = ("local", "slurm")
RESUME_MODES = ("auto", "never")
MISMATCH_MODES = ("warn", "stop", "assert")
RECOMPUTE_MODES = ("none", "selective", "full")
REPLAY_MODES = ("none", "ids", "ids_and_weights")
VAL_MODES = ("point", "window")
"""`train.val_mode`: one validation at the step (the paper's), or spread over the `val_every` steps before it."""


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
    padding (docs/running_scalerl.md "Micro-batches"), and the mask path's attention is quadratic in the packed length."""
    fused_cispo: bool = True
    """loss=cispo with the FP32 head: compute the head and CISPO from the last hidden states chunk by
    chunk (objective.fused_logprob.cispo_from_hidden), never materialising [N, V] logits."""
    val_every: int = 100
    """Validation cadence in steps (paper: 100); 0 disables validation."""
    val_mode: str = "point"
    """`point`: each validation generates every held-out sample with the weights of its step (the paper's).
    `window`: the held-out prompts are split into `val_every` slices, one generated at each step of the window
    before the point, and the point is the pass rate over all of them (the mean of R over the window's
    policies, at the window centre's compute; same samples and cost; metrics/val_window.py). For policies that
    move between neighbouring steps more than the binomial noise of a point (a toy model's high learning rate)."""
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
    else runs the warm start and writes it there (another `train.micro_batch_tokens` is loaded and logged:
    same maths, `train.SFT_NUMERICS_ONLY`). Empty: no sharing."""
    any_seed: bool = False
    """Accept a `checkpoint` written by a run with another seed: every seed then starts RL from the same
    weights, as the paper's seeds all start from one SFT checkpoint (their spread is RL noise only)."""
    synthetic_num_prompts: int = 0
    """0: the warm start trains on this run's training prompts. N > 0 (data.name=synthetic only): on those of
    the synthetic set of N prompts (the first N of the same draws, with its own held-out split), as a run with
    `data.synthetic_num_prompts=N` would, and its fingerprint says so: one base model for runs of several
    lengths (the reproduction's predictability design warm-starts on the first 102,400 of its 204,800 prompts).
    None of this run's held-out prompts may be among those training prompts (checked when the warm start is run or loaded; ValueError naming the key)."""


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
    over the generator's weights, taken after the step's clock stops and outside the next step's)."""
    weights_digest_steps: list[int] = field(default_factory=list)
    """With `weights_digest`: only after these steps (1-based loop steps); empty: after every step."""
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
    dump_episodes: bool = False
    """Write `episodes.jsonl` in the run directory: one line per trained episode (step, prompt_id, turns, reward,
    ids, loss_mask, messages; `env=custom` / `env=agent`)."""


@dataclass
class MoEConfig:
    """MoE train/inference consistency: rollout routing replay, the trainer re-using the experts the engine
    picked (trainer/megatron/routing.py)."""

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
    """Compute budget (same unit as the fit's C) at which to report the predicted reward and its 95% band (and at
    twice it); 0 = this run's own budget: the compute at `train.steps`, extrapolated from the compute per step so
    far."""
    min_points: int = 4
    """Validation points needed before a fit is attempted (A is identified only from
    `scaling.identify.MIN_POINTS` = 8 points after the cut)."""
    fit_from: float = 0.0
    """Exclude validation points below this compute; 0 = the automatic cut: the paper's 1.5k GPU-hours
    on a GPU-hour axis that reaches it (App. A.5/A.7), else `cut_fraction` x the compute so far."""
    cut_fraction: float = 0.1
    """The automatic cut for small runs: points below this share of the compute so far are not fitted
    (the paper's 1.5k of 16k GPU-hours is 0.094: about one epoch). 0: no cut."""


def validate_cluster(cluster: ClusterConfig) -> None:
    one_of("cluster.name", cluster.name, CLUSTER_NAMES)
    one_of("cluster.device", cluster.device, ("cpu", "cuda"))
    positive("cluster.nodes", cluster.nodes)
    positive("cluster.devices_per_node", cluster.devices_per_node)
    positive("cluster.trainer_threads", cluster.trainer_threads, allow_zero=True)
    positive("cluster.trainer_devices", cluster.trainer_devices, allow_zero=True)
    positive("cluster.generator_devices", cluster.generator_devices, allow_zero=True)


def validate_train_loop(train: TrainLoopConfig) -> None:
    one_of("train.recompute", train.recompute, RECOMPUTE_MODES)
    positive("train.steps", train.steps)
    positive("train.prompts_per_step", train.prompts_per_step)
    positive("train.generations_per_prompt", train.generations_per_prompt)
    if train.generations_per_prompt < 2:
        raise ValueError(
            f"train.generations_per_prompt={train.generations_per_prompt} must be >= 2 "
            "(group-relative advantages need at least two samples)"
        )
    positive("train.micro_batch_tokens", train.micro_batch_tokens)
    positive("train.val_every", train.val_every, allow_zero=True)
    one_of("train.val_mode", train.val_mode, VAL_MODES)
    positive("train.save_every", train.save_every, allow_zero=True)
    positive("train.keep_checkpoints", train.keep_checkpoints, allow_zero=True)
    positive("train.follower_timeout_s", train.follower_timeout_s)
    positive("train.sigterm_grace_s", train.sigterm_grace_s)


def validate_sft(sft: SFTConfig) -> None:
    """SFT warm-start keys (used only when sft.steps > 0, after the trainer is built: checked up front)."""
    positive("sft.steps", sft.steps, allow_zero=True)
    if not sft.steps:
        return
    positive("sft.lr", sft.lr)
    positive("sft.batch_size", sft.batch_size)
    positive("sft.warmup_steps", sft.warmup_steps, allow_zero=True)
    positive("sft.eval_every", sft.eval_every, allow_zero=True)
    positive("sft.synthetic_num_prompts", sft.synthetic_num_prompts, allow_zero=True)


def validate_metrics(metrics: MetricsConfig) -> None:
    bad = [s for s in metrics.weights_digest_steps if int(s) < 1]
    if bad:
        raise ValueError(f"metrics.weights_digest_steps={list(metrics.weights_digest_steps)!r}: steps are 1-based, "
                         f"got {bad}")
    if not 0.0 < metrics.truncation_alarm <= 1.0:
        raise ValueError(f"metrics.truncation_alarm={metrics.truncation_alarm!r} must be in (0, 1]")
    one_of("metrics.mismatch_mode", metrics.mismatch_mode, MISMATCH_MODES)
    if metrics.max_logprob_mismatch is not None:
        positive("metrics.max_logprob_mismatch", metrics.max_logprob_mismatch)


def validate_moe(moe: MoEConfig) -> None:
    one_of("moe.routing_replay", moe.routing_replay, REPLAY_MODES)
    if moe.routing_replay != "none" and moe.record_routes is False:
        raise ValueError(f"moe.routing_replay={moe.routing_replay!r} needs the generator's routes: "
                         "moe.record_routes=false")


def validate_forecast(forecast: ForecastConfig) -> None:
    if not 0.0 <= forecast.cut_fraction < 1.0:
        raise ValueError(f"forecast.cut_fraction={forecast.cut_fraction} must be in [0, 1)")
