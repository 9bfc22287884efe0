"""The recipe's axes (paper Sec. 3-4, App. A.9 leave-one-out): loss, aggregation, advantage normalization,
off-policy setup, length control, curriculum, batch filter and LM-head precision, each a Hydra group with
its own checks. The loss and aggregation names are the objective's own lists (`objective/names.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from scalerl_mega.config.checks import one_of, positive
from scalerl_mega.objective.names import AGGREGATIONS as AGGREGATION_NAMES
from scalerl_mega.objective.names import LOSS_NAMES

ADV_NORM_NAMES = ("batch", "prompt", "none")
OFF_POLICY_NAMES = ("pipeline_rl", "ppo_off_policy")
LENGTH_NAMES = ("interruption", "penalty")
CURRICULUM_NAMES = ("no_positive_resampling", "uniform")
FILTER_NAMES = ("zero_variance", "none")
PRECISION_NAMES = ("fp32_head", "bf16_head")

INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
"""Paper Sec. 4: the end-of-thinking phrase injected at a forced interruption."""


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


def pause_mode(off_policy: OffPolicyConfig) -> str:
    """How generators take a weight update (SGLang's /pause_generation mode): PipelineRL keeps every
    in-flight request and its KV cache (`in_place`, paper Sec. 3.1); PPO-off-policy updates between phases,
    retracting whatever is in flight (`retract`)."""
    return "in_place" if off_policy.name == "pipeline_rl" else "retract"


def validate_loss(loss: LossConfig) -> None:
    """`loss.*`: the name, the clip range of the named loss, and the train-vs-generator IS correction."""
    one_of("loss.name", loss.name, LOSS_NAMES)
    eps_low, eps_high = loss.eps_low, loss.eps_high
    if eps_high is not None and not eps_high > 0:
        raise ValueError(f"loss.eps_high={eps_high!r} must be > 0")
    if loss.name == "cispo":
        if eps_low is not None and eps_high is not None and not 0 <= eps_low <= eps_high:
            raise ValueError(f"loss.eps_low={eps_low!r} must be in [0, loss.eps_high={eps_high}] for cispo")
    else:
        if eps_low is not None and not 0 <= eps_low < 1:
            raise ValueError(f"loss.eps_low={eps_low!r} must be in [0, 1) for {loss.name}")
        if loss.name == "grpo" and eps_low is not None and eps_high is not None and eps_low != eps_high:
            raise ValueError(f"loss.eps_low={eps_low} != loss.eps_high={eps_high}: grpo clips symmetrically")
    from scalerl_mega.objective.is_correction import IS_CORRECTIONS  # torch: only when validating

    one_of("loss.is_correction", loss.is_correction, IS_CORRECTIONS)
    if loss.is_correction.startswith("tis"):
        positive("loss.is_cap", loss.is_cap)
        if loss.name == "cispo":
            raise ValueError(f"loss.is_correction={loss.is_correction!r} with loss.name='cispo': CISPO's "
                             "sg(min(rho, eps_high)) already is a token-level truncated IS weight (loss.eps_high "
                             "is its cap); use none, mis_token or mis_seq")
    if loss.is_correction.startswith("mis"):
        positive("loss.is_low", loss.is_low, allow_zero=True)
        positive("loss.is_high", loss.is_high)
        if not loss.is_high > loss.is_low:
            raise ValueError(f"loss.is_high={loss.is_high!r} must be > loss.is_low={loss.is_low!r}")


def validate_off_policy(off_policy: OffPolicyConfig) -> None:
    one_of("off_policy.name", off_policy.name, OFF_POLICY_NAMES)
    positive("off_policy.k", off_policy.k)
    if off_policy.overlap and off_policy.name != "ppo_off_policy":
        raise ValueError(f"off_policy.overlap=true applies to off_policy.name=ppo_off_policy only "
                         f"(got {off_policy.name!r})")


def validate_length(length: LengthConfig) -> None:
    """`length.*` (paper App. A.10): the interruption window fits the budget, or the penalty's cache fits
    its maximum."""
    one_of("length.name", length.name, LENGTH_NAMES)
    positive("length.max_new_tokens", length.max_new_tokens)
    if length.name == "interruption":
        positive("length.interruption_min", length.interruption_min)
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
        positive("length.penalty_cache_len", length.penalty_cache_len)
        if length.penalty_cache_len > length.penalty_max_len:
            raise ValueError(
                f"length.penalty_cache_len={length.penalty_cache_len} > "
                f"length.penalty_max_len={length.penalty_max_len}"
            )


def validate_recipe_choices(*, aggregation: AggregationConfig, adv_norm: AdvNormConfig,
                            curriculum: CurriculumConfig, filter: FilterConfig, precision: PrecisionConfig) -> None:
    """The one-option groups: each name is one of its group's options."""
    one_of("aggregation.name", aggregation.name, AGGREGATION_NAMES)
    one_of("adv_norm.name", adv_norm.name, ADV_NORM_NAMES)
    one_of("curriculum.name", curriculum.name, CURRICULUM_NAMES)
    if not 0.0 < curriculum.pass_rate_threshold <= 1.0:
        raise ValueError(f"curriculum.pass_rate_threshold={curriculum.pass_rate_threshold!r} must be in (0, 1]")
    one_of("filter.name", filter.name, FILTER_NAMES)
    one_of("precision.name", precision.name, PRECISION_NAMES)
    one_of("precision.params_dtype", precision.params_dtype, ("bfloat16", "float32"))
