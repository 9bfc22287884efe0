"""Train-vs-inference importance-sampling corrections: truncated IS (TIS) and masked IS (MIS / IcePop).

The generator samples from pi_gen (its own kernels, precision, possibly stale weights), the trainer
differentiates pi_train. The correction reweights each trained token (or sequence) by the IS weight
of the trainer's old policy against the generator, computed without gradient:

    rho_t = pi_old(y_t) / pi_gen(y_t) = exp(sg(log pi_train_t) - log pi_gen_t)

Each batch is used for exactly one optimizer step (PipelineRL-k and PPO-off-policy-k alike, paper
Sec. 3.1), so the trainer's old policy is its policy at the step's forward pass: pi_old = sg(pi_train).

Modes (`IS_CORRECTIONS`):
- "tis_token": w_t = min(rho_t, cap)                                    (truncated IS, per token)
- "tis_seq":   w_i = min(prod_t rho_t, cap) for every token of sample i  (the sequence's IS ratio)
- "mis_token": w_t = rho_t if low <= rho_t <= high else 0                (masked IS, IcePop's M(k))
- "mis_seq":   w_i = rho_i if low <= rho_i <= high else 0, rho_i = prod_t rho_t
Sequence ratios are products over the sample's trained tokens (the true sequence likelihood ratio, not
GSPO's geometric mean), computed in log space. Positions outside the mask get weight 0.

`objective.losses.policy_loss` multiplies each token's term by w (see its docstring for how the
clipped ratio of DAPO/GRPO/GSPO is then taken against pi_old). Pure torch, no config objects.
"""

from __future__ import annotations

import math

import torch

IS_CORRECTIONS = ("none", "tis_token", "tis_seq", "mis_token", "mis_seq")
DEFAULT_IS_CAP = 2.0
DEFAULT_IS_LOW = 0.5
DEFAULT_IS_HIGH = 2.0


def check_is_params(mode: str, *, cap: float, low: float, high: float) -> None:
    """Raise ValueError naming the offending argument (`is_correction`, `is_cap`, `is_low`, `is_high`)."""
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"is_correction={mode!r} is unknown; expected one of {IS_CORRECTIONS}")
    if mode.startswith("tis") and not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"is_cap={cap!r} must be a finite number > 0 for is_correction={mode!r}")
    if mode.startswith("mis"):
        if not (low >= 0 and math.isfinite(low)):
            raise ValueError(f"is_low={low!r} must be a finite number >= 0 for is_correction={mode!r}")
        if not (high > low and math.isfinite(high)):
            raise ValueError(f"is_high={high!r} must be finite and > is_low={low!r} for is_correction={mode!r}")


def is_weights(old_logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor, *, mode: str,
               cap: float = DEFAULT_IS_CAP, low: float = DEFAULT_IS_LOW,
               high: float = DEFAULT_IS_HIGH) -> tuple[torch.Tensor, torch.Tensor]:
    """IS weights w [B, T] (dtype of `old_logp`, no gradient, 0 where mask is 0) and the flags of the
    units the correction changed (bool [n_tokens] of the trained tokens for token modes, [n_samples] of
    the samples with a trained token for sequence modes): truncated at `cap` (tis) or masked out (mis).

    `old_logp`, `gen_logp`: [B, T] log-probs of the trainer's old policy and of the generator.
    mode "none": w = 1 on trained tokens, nothing flagged.
    """
    check_is_params(mode, cap=cap, low=low, high=high)
    if old_logp.shape != gen_logp.shape or old_logp.shape != mask.shape or old_logp.dim() != 2:
        raise ValueError(f"old_logp {tuple(old_logp.shape)}, gen_logp {tuple(gen_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must be the same [B, T] shape")
    m = mask > 0
    dtype = old_logp.dtype
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float64, device=old_logp.device)
        log_rho = torch.where(m, old_logp.detach().double() - gen_logp.detach().double(), zero)
        if mode == "none":
            return m.to(dtype), torch.zeros(int(m.sum()), dtype=torch.bool, device=m.device)
        if mode.endswith("token"):
            unit_lr, unit_valid = log_rho, m
        else:
            unit_lr = log_rho.sum(1)  # log prod_t rho_t over trained tokens
            unit_valid = m.any(1)
        if mode.startswith("tis"):
            changed = unit_lr > math.log(cap)
            w = unit_lr.clamp(max=math.log(cap)).exp()
        else:
            lo = math.log(low) if low > 0 else -math.inf
            kept = (unit_lr >= lo) & (unit_lr <= math.log(high))
            changed = ~kept
            w = torch.where(kept, unit_lr, torch.full_like(unit_lr, -math.inf)).exp()
        flags = changed[unit_valid]
        if mode.endswith("seq"):
            w = w[:, None].expand_as(log_rho)
        w = torch.where(m, w, zero)
    return w.to(dtype), flags
