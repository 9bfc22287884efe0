"""Advantages and the zero-variance filter (paper Sec. 2, Sec. 3.2 "Advantage Normalization",
"Zero-Variance Filtering", Sec. 4 J_ScaleRL, App. A.2 Eq. (advantage)).

Â_i = r_i - mean({r_j}_{j in prompt(i)})                                       (Sec. 2)
normalization="prompt": Â_i / (std_prompt(r) + eps)      (GRPO, App. A.2)
normalization="batch":  Â_i / (std({Â_k}_{k in batch}) + eps)   (Sec. 4: Â^norm = Â / Â_std)
normalization="none":   Â_i                              (Dr. GRPO)

"std" is the population standard deviation (ddof=0) everywhere. For "batch", pass the *effective*
batch (after the zero-variance filter) so that Â_std is taken over the kept samples only, as in
J_ScaleRL. `eps` is added to the batch std too, so an all-zero batch yields zeros instead of NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NORMALIZATIONS = ("batch", "prompt", "none")


def _check_1d(name: str, t: torch.Tensor, n: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(t.shape)}")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"{name} has length {t.shape[0]}, expected {n} (shape mismatch with rewards)")


def _validate(rewards_B: torch.Tensor, prompt_index_B: torch.Tensor) -> None:
    _check_1d("rewards", rewards_B)
    _check_1d("prompt_index", prompt_index_B, rewards_B.shape[0])
    if rewards_B.shape[0] == 0:
        raise ValueError("rewards is empty: empty batch")
    if not rewards_B.is_floating_point():
        raise ValueError(f"rewards must be floating point, got {rewards_B.dtype}")
    if not torch.isfinite(rewards_B).all():
        raise ValueError("rewards contains NaN or inf")
    if prompt_index_B.is_floating_point() or prompt_index_B.dtype == torch.bool:
        raise ValueError(f"prompt_index must be an integer tensor, got {prompt_index_B.dtype}")


def _group_stats(values_B: torch.Tensor, prompt_index_B: torch.Tensor):
    """Per-sample group mean and population std of `values_B` (float64 internally)."""
    _, inv_B = torch.unique(prompt_index_B, return_inverse=True)
    n_groups = int(inv_B.max().item()) + 1
    v = values_B.double()
    count_P = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv_B, torch.ones_like(v))
    mean_P = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv_B, v) / count_P
    dev_B = v - mean_P[inv_B]
    var_P = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv_B, dev_B * dev_B) / count_P
    return dev_B, var_P.sqrt()[inv_B], inv_B


def compute_advantages(
    rewards: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    normalization: str = "batch",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages [B] from rewards [B] grouped by `prompt_index` [B] (see module docstring).

    Returns a tensor of the rewards' dtype. Zero-variance prompts get exactly 0.
    """
    _validate(rewards, prompt_index)
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is unknown; expected one of {NORMALIZATIONS}")
    if not eps >= 0:
        raise ValueError(f"eps={eps} must be >= 0")
    dev_B, std_B, _ = _group_stats(rewards, prompt_index)
    # Exact zero for zero-variance prompts (the centred values may carry rounding noise otherwise).
    dev_B = torch.where(std_B == 0, torch.zeros_like(dev_B), dev_B)
    if normalization == "prompt":
        adv = dev_B / (std_B + eps)
    elif normalization == "batch":
        batch_std = dev_B.std(correction=0)
        adv = dev_B / (batch_std + eps)
    else:
        adv = dev_B
    return adv.to(rewards.dtype)


def zero_variance_mask(rewards: torch.Tensor, prompt_index: torch.Tensor) -> torch.Tensor:
    """Bool [B]: True for samples whose prompt has non-identical rewards (Sec. 3.2 "effective batch").

    With binary pass/fail rewards this is exactly "keep prompts with 0 < mean pass < 1" (J_ScaleRL).
    """
    _validate(rewards, prompt_index)
    _, inv_B = torch.unique(prompt_index, return_inverse=True)
    n = int(inv_B.max().item()) + 1
    r = rewards.double()
    rmax = torch.full((n,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, inv_B, r, "amax")
    rmin = torch.full((n,), torch.inf, dtype=torch.float64).scatter_reduce_(0, inv_B, r, "amin")
    return (rmax > rmin)[inv_B]


@dataclass(kw_only=True)
class FilterResult:
    """Outcome of `zero_variance_filter`."""

    keep: torch.Tensor
    """Bool [B]: samples kept in the effective batch."""
    kept_prompts: list[int]
    """Prompt indices (values of `prompt_index`) kept."""
    dropped: dict[int, str] = field(default_factory=dict)
    """Dropped prompt index -> reason: "all_passed", "all_failed" or "constant_reward"."""

    def metrics(self, prefix: str = "filter/") -> dict[str, float]:
        n_drop = len(self.dropped)
        total = n_drop + len(self.kept_prompts)
        out = {
            f"{prefix}prompts_kept": float(len(self.kept_prompts)),
            f"{prefix}prompts_dropped": float(n_drop),
            f"{prefix}dropped_fraction": n_drop / total if total else 0.0,
            f"{prefix}samples_kept": float(self.keep.sum().item()),
        }
        for reason in ("all_passed", "all_failed", "constant_reward"):
            out[f"{prefix}dropped_{reason}"] = float(sum(1 for r in self.dropped.values() if r == reason))
        return out


def zero_variance_filter(
    rewards: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    passed: torch.Tensor | None = None,
) -> FilterResult:
    """Drop zero-variance prompts (Sec. 3.2 "Zero-Variance Filtering"), recording why each was dropped.

    `passed` [B] (bool, optional) names the reason: a constant-reward prompt whose samples all passed is
    "all_passed", all failed "all_failed"; without `passed` (or with mixed pass flags but equal
    rewards) the reason is "constant_reward".
    """
    keep_B = zero_variance_mask(rewards, prompt_index)
    if passed is not None:
        _check_1d("passed", passed, rewards.shape[0])
    kept: list[int] = []
    dropped: dict[int, str] = {}
    for p in torch.unique(prompt_index).tolist():
        sel = prompt_index == p
        if bool(keep_B[sel][0]):
            kept.append(int(p))
            continue
        reason = "constant_reward"
        if passed is not None:
            flags = passed[sel].bool()
            if bool(flags.all()):
                reason = "all_passed"
            elif not bool(flags.any()):
                reason = "all_failed"
        dropped[int(p)] = reason
    return FilterResult(keep=keep_B, kept_prompts=kept, dropped=dropped)
