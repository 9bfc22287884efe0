"""The whole `scalerl-train` configuration: the tree of group configs (conf/train.yaml), its registration
with Hydra, and `validate`, which runs each group's own checks and then the ones across groups.

One dataclass per ablation axis; each Hydra group under `conf/<group>/` fills one of them, and the
`experiment/` overlays pick one option per axis (paper Sec. 4, App. A.9 LOO, App. A.15 recipes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalerl_mega.config.data import DataConfig, validate_data
from scalerl_mega.config.env import EnvConfig, episode_budget, validate_env
from scalerl_mega.config.recipe import (
    AdvNormConfig,
    AggregationConfig,
    CurriculumConfig,
    FilterConfig,
    LengthConfig,
    LossConfig,
    OffPolicyConfig,
    PrecisionConfig,
    validate_length,
    validate_loss,
    validate_off_policy,
    validate_recipe_choices,
)
from scalerl_mega.config.reward import RewardSettings
from scalerl_mega.config.rollout import RolloutConfig, validate_rollout
from scalerl_mega.config.run import (
    ClusterConfig,
    ForecastConfig,
    MetricsConfig,
    MoEConfig,
    SFTConfig,
    TrainLoopConfig,
    validate_cluster,
    validate_forecast,
    validate_metrics,
    validate_moe,
    validate_sft,
    validate_train_loop,
)
from scalerl_mega.model.config import MegatronConfig, ModelConfig, OptimConfig, ParallelConfig

SCHEMA_NAME = "train_schema"


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
    `output_dir/dry_run.json` with per-rank bytes and exit (scalerl_mega/dry_run.py)."""
    dry_run_gpu: str = ""
    """The GPU type the dry run's planned peak must fit (a key of cluster/plan.py's DEVICES: h100_80gb, h200,
    gb200), else it exits 2; empty: it must fit at least one of them."""
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
    env: EnvConfig = field(default_factory=EnvConfig)

def records_routes(cfg: TrainConfig) -> bool:
    """Whether the generators record MoE routes: an MoE model and `moe.record_routes`, which unset
    (None) means "when `moe.routing_replay` replays them"."""
    record = cfg.moe.record_routes
    return bool(cfg.model.is_moe) and (cfg.moe.routing_replay != "none" if record is None else bool(record))


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore; conf/train.yaml lists it first in its defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)


def validate(cfg: TrainConfig) -> None:
    """Check a composed config (a TrainConfig or an OmegaConf node with the same keys): every group's own
    checks, then the constraints across groups. Raises ValueError naming the first offending key and value."""
    validate_data(cfg.data)
    validate_loss(cfg.loss)
    validate_recipe_choices(aggregation=cfg.aggregation, adv_norm=cfg.adv_norm, curriculum=cfg.curriculum,
                            filter=cfg.filter, precision=cfg.precision)
    validate_off_policy(cfg.off_policy)
    validate_length(cfg.length)
    validate_rollout(cfg.rollout)
    validate_cluster(cfg.cluster)
    validate_train_loop(cfg.train)
    validate_sft(cfg.sft)
    validate_metrics(cfg.metrics)
    validate_moe(cfg.moe)
    validate_forecast(cfg.forecast)
    validate_env(cfg.env)
    _validate_trainer(cfg)
    if not str(cfg.resume):
        raise ValueError("resume='' must be 'auto', 'never' or a checkpoint directory")
    _validate_across_groups(cfg)


def _validate_trainer(cfg: TrainConfig) -> None:
    """What building the trainer checks (`MegatronConfig.validate`: model, parallel, optim, precision), first on its
    own, then against the world size `cluster.trainer_devices` when it is set (the error then names that key)."""
    mcfg = megatron_config(cfg)
    mcfg.validate()
    world = int(cfg.cluster.trainer_devices)
    if world:
        try:
            mcfg.validate(world_size=world)
        except ValueError as exc:
            raise ValueError(f"cluster.trainer_devices={world}: {exc}") from None


def _validate_across_groups(cfg: TrainConfig) -> None:
    """Settings that are each valid but clash with another group's."""
    n_sft = int(cfg.sft.synthetic_num_prompts)
    if cfg.sft.steps and n_sft and (cfg.data.name != "synthetic" or not cfg.data.val_prompts < n_sft
                                    <= cfg.data.synthetic_num_prompts):
        raise ValueError(f"sft.synthetic_num_prompts={n_sft} needs data.name=synthetic (is {cfg.data.name!r}) and "
                         f"data.val_prompts={cfg.data.val_prompts} < it <= data.synthetic_num_prompts="
                         f"{cfg.data.synthetic_num_prompts}")
    if cfg.moe.routing_replay == "ids_and_weights" and cfg.rollout.name == "sglang":
        raise ValueError("moe.routing_replay='ids_and_weights' with rollout.name='sglang': SGLang 0.5.23 returns "
                         "the routed expert ids only (meta_info.routed_experts), no gate weights; use "
                         "moe.routing_replay=ids")
    if cfg.moe.routing_replay != "none" and cfg.train.pack_sequences:
        raise ValueError(f"moe.routing_replay={cfg.moe.routing_replay!r} with train.pack_sequences=true: the "
                         "generator's routes are per sample and are not packed; use train.pack_sequences=false")
    if bool(cfg.model.fp32_lm_head) != (cfg.precision.name == "fp32_head"):
        raise ValueError(
            f"model.fp32_lm_head={cfg.model.fp32_lm_head} contradicts precision.name={cfg.precision.name!r}"
        )
    if cfg.train.pack_sequences and int(getattr(cfg.parallel, "cp", 1)) > 1:
        raise ValueError(f"train.pack_sequences=true with parallel.cp={cfg.parallel.cp}: packed rows are not "
                         "split for context parallelism")
    if cfg.train.pack_sequences and cfg.model.arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        raise ValueError(f"train.pack_sequences=true with model.arch={cfg.model.arch!r}: its Gated DeltaNet layers "
                         "cannot run packed rows (megatron-core 0.16.1 refuses them, and the torch GDN path has no "
                         "per-sequence boundaries; fla's varlen kernels would be needed); use train.pack_sequences=false")
    if cfg.rollout.inflight_hold_tokens and (cfg.rollout.name != "local" or cfg.off_policy.name != "pipeline_rl"):
        raise ValueError(f"rollout.inflight_hold_tokens={cfg.rollout.inflight_hold_tokens} needs rollout.name=local "
                         f"and off_policy.name=pipeline_rl (got {cfg.rollout.name!r}, {cfg.off_policy.name!r})")
    if cfg.sft.steps and cfg.data.name == "synthetic":
        n_train = cfg.data.synthetic_num_prompts - cfg.data.val_prompts
        if cfg.sft.batch_size > n_train:
            raise ValueError(f"sft.batch_size={cfg.sft.batch_size} exceeds the {n_train} SFT examples "
                             f"(data.synthetic_num_prompts - data.val_prompts)")
    need = cfg.data.max_prompt_tokens + cfg.length.max_new_tokens
    if need > cfg.model.max_position_embeddings:
        raise ValueError(f"data.max_prompt_tokens + length.max_new_tokens = {need} exceeds "
                         f"model.max_position_embeddings={cfg.model.max_position_embeddings}")
    if cfg.env.name != "single":
        need = cfg.data.max_prompt_tokens + episode_budget(cfg.env, max_new_tokens=cfg.length.max_new_tokens)
        if need > cfg.model.max_position_embeddings:
            raise ValueError(f"data.max_prompt_tokens + the episode budget (env.max_tokens, else "
                             f"length.max_new_tokens x env.max_turns) = {need} exceeds "
                             f"model.max_position_embeddings={cfg.model.max_position_embeddings}")


def megatron_config(cfg: TrainConfig) -> MegatronConfig:
    """The trainer's settings (`MegatronConfig`: model, parallel, optim with the run's seed added, precision,
    recompute, routing replay, logit temperature); `config.validate` checks them before anything is built."""
    from dataclasses import replace

    return MegatronConfig(model=cfg.model, parallel=cfg.parallel,
                          optim=replace(cfg.optim, seed=int(cfg.optim.seed) + int(cfg.seed)),
                          params_dtype=cfg.precision.params_dtype, grad_reduce_in_fp32=cfg.precision.grad_reduce_in_fp32,
                          recompute=cfg.train.recompute, routing_replay=cfg.moe.routing_replay,
                          logit_temperature=float(cfg.rollout.temperature))


def flat_config(config: Any) -> dict[str, Any]:
    """Dotted key -> value of a TrainConfig (or any dataclass / mapping tree)."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(OmegaConf.structured(config) if not isinstance(config, dict) else
                                  OmegaConf.create(config), resolve=True)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}{k}.", v)
        else:
            out[prefix[:-1]] = node

    walk("", tree)
    return out
