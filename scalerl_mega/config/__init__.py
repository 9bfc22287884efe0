"""Typed configuration of `scalerl-train`, one module per concern, each dataclass next to its own checks:

    data      DataConfig                                    validate_data
    recipe    the recipe's axes (loss, aggregation, ...)     validate_loss, validate_length, ...
    rollout   RolloutConfig                                 validate_rollout
    run       cluster, train loop, sft, metrics, moe, forecast
    reward    RewardSettings (checked by rewards/ where it is used)
    env       EnvConfig: single-turn samples or multi-turn episodes   validate_env
    peft      PeftConfig: LoRA adapters on the trainer (peft=lora)    validate_peft, validate_peft_for
    tree      TrainConfig (the whole tree), register_configs, validate (every group, then across groups)
    machine   validate_machine: devices, tokenizer directory, emulated-bf16 warning

The model / parallelism / optimizer groups are the trainer's own dataclasses (`scalerl_mega.model.config`).
Composing the tree from `conf/` is `scalerl_mega.compose`'s one job. This package is at the base layer:
it imports nothing above it (docs/architecture.md).
"""

from scalerl_mega.config.data import DATA_NAMES, DataConfig
from scalerl_mega.config.env import ENV_NAMES, EnvConfig, episode_budget
from scalerl_mega.config.machine import (
    check_tokenizer_dir,
    check_tokenizer_fits,
    check_tokenizer_source,
    cpu_native_bf16,
    validate_machine,
    warn_cpu_bf16,
)
from scalerl_mega.config.peft import PEFT_KINDS, PeftConfig, validate_peft, validate_peft_for
from scalerl_mega.config.recipe import (
    ADV_NORM_NAMES,
    AGGREGATION_NAMES,
    CURRICULUM_NAMES,
    FILTER_NAMES,
    INTERRUPTION_PHRASE,
    LENGTH_NAMES,
    LOSS_NAMES,
    OFF_POLICY_NAMES,
    PRECISION_NAMES,
    AdvNormConfig,
    AggregationConfig,
    CurriculumConfig,
    FilterConfig,
    LengthConfig,
    LossConfig,
    OffPolicyConfig,
    PrecisionConfig,
    pause_mode,
)
from scalerl_mega.config.reward import RewardSettings
from scalerl_mega.config.rollout import ROLLOUT_NAMES, RolloutConfig
from scalerl_mega.config.run import (
    CLUSTER_NAMES,
    MISMATCH_MODES,
    RESUME_MODES,
    ClusterConfig,
    ForecastConfig,
    MetricsConfig,
    MoEConfig,
    SFTConfig,
    TrainLoopConfig,
)
from scalerl_mega.config.tree import (
    SCHEMA_NAME,
    TrainConfig,
    flat_config,
    megatron_config,
    records_routes,
    register_configs,
    validate,
)
from scalerl_mega.model.config import ModelConfig, OptimConfig, ParallelConfig

__all__ = [
    "ADV_NORM_NAMES", "AGGREGATION_NAMES", "CLUSTER_NAMES", "CURRICULUM_NAMES", "DATA_NAMES", "FILTER_NAMES",
    "INTERRUPTION_PHRASE", "LENGTH_NAMES", "LOSS_NAMES", "MISMATCH_MODES", "OFF_POLICY_NAMES", "PRECISION_NAMES",
    "RESUME_MODES", "ROLLOUT_NAMES", "SCHEMA_NAME", "AdvNormConfig", "AggregationConfig", "ClusterConfig",
    "CurriculumConfig", "DataConfig", "ENV_NAMES", "EnvConfig", "episode_budget", "FilterConfig", "ForecastConfig", "LengthConfig", "LossConfig",
    "MetricsConfig", "MoEConfig", "ModelConfig", "OffPolicyConfig", "OptimConfig", "ParallelConfig",
    "PrecisionConfig", "RewardSettings", "RolloutConfig", "SFTConfig", "TrainConfig", "TrainLoopConfig",
    "check_tokenizer_dir", "check_tokenizer_fits", "check_tokenizer_source", "cpu_native_bf16", "flat_config",
    "megatron_config", "pause_mode", "records_routes", "register_configs",
    "validate", "validate_machine", "validate_peft", "validate_peft_for", "warn_cpu_bf16",
]
