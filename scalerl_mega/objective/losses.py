"""Policy-gradient surrogate losses of the paper, returned as loss = -J (to minimise).

Every objective here is a weighted sum over tokens, J = sum_{i,t} w_{i,t} * term_{i,t}, where the weights
w come from the loss aggregation (`token_weights`) and the per-token term from the loss type:

- "cispo" (Sec. 3.2 Eq. (cispo), Sec. 4 J_ScaleRL): term = sg(min(rho, eps_high)) * A_i * log pi_train.
  `eps_high` is the absolute cap on the ratio (paper: 4, 5 or 8 make no difference; default 5).
  There is no lower truncation by default; `eps_low`, if given, is an absolute *floor* on the truncated
  weight: sg(clamp(rho, eps_low, eps_high)). No gradient flows through the ratio.
- "dapo" (App. A.2 Eq. (dapo_loss), Sec. 2 Eq. (is)): term = min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A),
  gradient through rho. Defaults eps_low=0.2, eps_high=0.28 (App. A.17 "Qwen2.5 (DAPO)").
- "grpo" (App. A.2 J_GRPO): the same term with a symmetric clip 1 +- eps (eps_low == eps_high, default 0.2).
- "gspo" (Sec. 3.2 "Loss type", App. A.10 / "GSPO ablations"): sequence-level ratio
  s_i = exp(mean_t(log pi_train - log pi_gen)) and term_i = min(s_i*A_i, clip(s_i, 1-eps_low, 1+eps_high)*A_i),
  gradient through s_i. Defaults eps_low=3e-3, eps_high=5e-3 (the paper's 10^-3 scale). Its term is per
  sample; it enters J as sum_i (sum_t w_{i,t}) * term_i, so under "sample" aggregation (its default) it counts
  once per sample.

Aggregations (Sec. 3.2 "Loss Aggregation"):
- "sample": w = 1 / (B * |y_i|)  — mean over samples of each sample's token mean (Eq. (grpo_loss)).
- "prompt": w = 1 / (P * T_g), T_g = sum of |y_j| over the prompt's samples — per prompt, sum of its tokens'
  terms over its total tokens, then mean over prompts (Eq. (dapo_loss), J_ScaleRL).
- "token":  w = 1 / sum_i |y_i| — all tokens of the batch averaged directly.
Samples (prompts) with no trained token get weight 0 and are not counted in B (P).

Off-policy corrections (`is_correction`, objective/is_correction.py; off by default, as in ScaleRL):
the per-token term is multiplied by the IS weight w of the trainer's old policy against the generator
(TIS: truncated at `is_cap`; MIS/IcePop: masked outside [`is_low`, `is_high`]; per token or per
sequence). The mismatch then enters only through w, so for dapo/grpo/gspo the clipped ratio is taken
against the trainer's old policy pi_old = sg(pi_train) (decoupled PPO: each batch is used for one
optimizer step, so pi_old is the step's pre-update policy and the ratio is 1 with gradient
grad log pi_train; the clip is inactive and `clip_fraction` is 0). cispo: its sg(min(rho, eps_high))
already is a token-level TIS weight against the generator, so only the masks (mis_token, mis_seq)
apply on top of it; tis_* with cispo is refused.

Micro-batches and data-parallel ranks: compute `token_weights` once on the *global* batch, slice it like
the other [B, T] tensors, and pass the slice as `weights=`; the micro-batch losses then sum exactly to
the unsplit loss (tests/unit/test_objective_losses.py checks this).
"""

from __future__ import annotations

import torch

from scalerl_mega.objective.is_correction import (
    DEFAULT_IS_CAP, DEFAULT_IS_HIGH, DEFAULT_IS_LOW, is_weights)
from scalerl_mega.objective.names import AGGREGATIONS, LOSS_NAMES

DEFAULT_AGGREGATION = {"cispo": "prompt", "dapo": "prompt", "grpo": "sample", "gspo": "sample"}
DEFAULT_EPS = {  # (eps_low, eps_high)
    "cispo": (None, 5.0),
    "dapo": (0.2, 0.28),
    "grpo": (0.2, 0.2),
    "gspo": (3e-3, 5e-3),
}


def _check_bt(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape} (shape mismatch)")


def _validate_mask_index(mask_BT: torch.Tensor, prompt_index_B: torch.Tensor, *, allow_empty: bool = False) -> None:
    if not isinstance(mask_BT, torch.Tensor) or mask_BT.dim() != 2:
        raise ValueError(f"mask must be a 2-D [B, T] tensor, got {getattr(mask_BT, 'shape', type(mask_BT))}")
    B = mask_BT.shape[0]
    if B == 0 or mask_BT.shape[1] == 0:
        raise ValueError(f"empty batch: mask has shape {tuple(mask_BT.shape)}")
    _check_bt("prompt_index", prompt_index_B, (B,))
    if prompt_index_B.is_floating_point() or prompt_index_B.dtype == torch.bool:
        raise ValueError(f"prompt_index must be an integer tensor, got {prompt_index_B.dtype}")
    if not allow_empty and not (mask_BT > 0).any():
        raise ValueError("empty batch: mask selects no token")


def token_weights(
    mask: torch.Tensor, prompt_index: torch.Tensor, aggregation: str, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Aggregation weights w [B, T] with J = sum w * term; see the module docstring.

    Weights are computed in float64, returned in `dtype`, and sum to 1 over the batch given.
    """
    _validate_mask_index(mask, prompt_index)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")
    m = (mask > 0).double()
    len_B = m.sum(1)
    if aggregation == "token":
        w = m / len_B.sum()
    elif aggregation == "sample":
        n_samples = (len_B > 0).sum()
        w = m / (len_B.clamp(min=1) * n_samples)[:, None]
    else:
        _, inv_B = torch.unique(prompt_index, return_inverse=True)
        n = int(inv_B.max().item()) + 1
        tok_P = torch.zeros(n, dtype=torch.float64).index_add_(0, inv_B, len_B)
        n_prompts = (tok_P > 0).sum()
        w = m / (tok_P.clamp(min=1)[inv_B] * n_prompts)[:, None]
    return w.to(dtype)


def cispo_weight(rho: torch.Tensor, *, eps_low: float | None, eps_high: float) -> torch.Tensor:
    """The truncated IS weight min(rho, eps_high) (floored at `eps_low` if given), detached (Eq. (cispo))."""
    return rho.detach().clamp(min=eps_low, max=eps_high)


def _resolve(loss_type: str, aggregation: str | None, eps_low: float | None, eps_high: float | None):
    if loss_type not in LOSS_NAMES:
        raise ValueError(f"loss_type={loss_type!r} is unknown; expected one of {LOSS_NAMES}")
    aggregation = DEFAULT_AGGREGATION[loss_type] if aggregation is None else aggregation
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")
    d_low, d_high = DEFAULT_EPS[loss_type]
    if loss_type == "grpo":
        if eps_low is not None and eps_high is not None and eps_low != eps_high:
            raise ValueError(f"grpo clips symmetrically: eps_low={eps_low} != eps_high={eps_high}")
        eps = eps_high if eps_high is not None else (eps_low if eps_low is not None else d_high)
        eps_low = eps_high = eps
    else:
        eps_low = d_low if eps_low is None else eps_low
        eps_high = d_high if eps_high is None else eps_high
    if loss_type == "cispo":
        if not eps_high > 0:
            raise ValueError(f"eps_high={eps_high} must be > 0 (absolute cap of the CISPO ratio)")
        if eps_low is not None and not 0 <= eps_low <= eps_high:
            raise ValueError(f"eps_low={eps_low} must be in [0, eps_high={eps_high}] for cispo")
    else:
        if not 0 <= eps_low < 1:
            raise ValueError(f"eps_low={eps_low} must be in [0, 1) for {loss_type}")
        if not eps_high >= 0:
            raise ValueError(f"eps_high={eps_high} must be >= 0 for {loss_type}")
    return aggregation, eps_low, eps_high


def _check_inputs(logp: torch.Tensor, gen_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  prompt_index: torch.Tensor, *, loss_type: str, is_correction: str, micro_batch: bool) -> None:
    """`policy_loss`'s argument checks (shapes, finite values where trained, the loss/IS-correction pair)."""
    if loss_type == "cispo" and is_correction.startswith("tis"):
        raise ValueError(f"is_correction={is_correction!r} with loss_type='cispo': CISPO's sg(min(rho, eps_high)) "
                         "already is a token-level truncated IS weight against the generator (eps_high is its "
                         "cap); only mis_token / mis_seq apply on top of it")
    # a micro-batch of a global batch (`weights` given) may train no token (e.g. data-parallel padding rows)
    _validate_mask_index(mask, prompt_index, allow_empty=micro_batch)
    B, T = mask.shape
    _check_bt("logp", logp, (B, T))
    _check_bt("gen_logp", gen_logp, (B, T))
    _check_bt("advantages", advantages, (B,))
    m = mask > 0
    if torch.isnan(gen_logp).any():
        raise ValueError("gen_logp contains NaN")
    if not torch.isfinite(gen_logp[m]).all():
        raise ValueError("gen_logp contains inf at a trained (mask=1) position")
    if not torch.isfinite(logp.detach()[m]).all():
        raise ValueError("logp contains NaN or inf at a trained (mask=1) position")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages contains NaN or inf")


def _objective(loss_type: str, *, w: torch.Tensor, m: torch.Tensor, logp_m: torch.Tensor, log_ratio: torch.Tensor,
               clip_log_ratio: torch.Tensor, A_B1: torch.Tensor, eps_low: float | None, eps_high: float,
               seq_metrics: dict[str, float] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """J of `policy_loss` (module docstring) and the clipped flags of its units (tokens; GSPO: samples).
    GSPO writes `seq_rho_mean`, `seq_rho_max` into `seq_metrics` when given."""
    if loss_type == "cispo":
        rho = log_ratio.detach().exp()
        term = cispo_weight(rho, eps_low=eps_low, eps_high=eps_high) * A_B1 * logp_m
        clipped = (rho > eps_high) | ((rho < eps_low) if eps_low is not None else torch.zeros_like(m))
        return (w * term).sum(), clipped[m]
    if loss_type in ("dapo", "grpo"):
        rho = clip_log_ratio.exp()
        term = torch.minimum(rho * A_B1, rho.clamp(1 - eps_low, 1 + eps_high) * A_B1)
        J = (w * term).sum()
        with torch.no_grad():
            clipped = ((A_B1 > 0) & (rho > 1 + eps_high)) | ((A_B1 < 0) & (rho < 1 - eps_low))
            return J, clipped[m]
    # gspo
    len_B = m.sum(1)
    s_B = ((clip_log_ratio.sum(1)) / len_B.clamp(min=1)).exp()
    A_B = A_B1[:, 0]
    term_B = torch.minimum(s_B * A_B, s_B.clamp(1 - eps_low, 1 + eps_high) * A_B)
    J = (w.sum(1) * term_B).sum()
    with torch.no_grad():
        valid = len_B > 0
        clipped_u = (((A_B > 0) & (s_B > 1 + eps_high)) | ((A_B < 0) & (s_B < 1 - eps_low)))[valid]
        if seq_metrics is not None and valid.any():
            seq_metrics["seq_rho_mean"] = float(s_B[valid].mean())
            seq_metrics["seq_rho_max"] = float(s_B[valid].max())
    return J, clipped_u


def policy_loss(
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    loss_type: str = "cispo",
    aggregation: str | None = None,
    eps_low: float | None = None,
    eps_high: float | None = None,
    weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    sums: bool = False,
    is_correction: str = "none",
    is_cap: float = DEFAULT_IS_CAP,
    is_low: float = DEFAULT_IS_LOW,
    is_high: float = DEFAULT_IS_HIGH,
) -> tuple[torch.Tensor, dict]:
    """loss = -J for `loss_type` with `aggregation` (defaults per loss type: see module docstring).

    Args: logp [B, T] trainer log-probs (carries the graph), gen_logp [B, T] generator log-probs,
    advantages [B], mask [B, T] (1 = trained token), prompt_index [B]; `weights` [B, T] overrides the
    weights computed from this batch (pass global-batch weights when this is a micro-batch, which may then
    train no token at all: loss 0, still connected to `logp`); `entropy`
    [B, T] is only reported. `is_correction` ("none" | "tis_token" | "tis_seq" | "mis_token" | "mis_seq")
    with `is_cap` (TIS) or `is_low`, `is_high` (MIS): the IS correction of the module docstring.

    Metrics (over trained tokens): `clip_fraction` (tokens whose ratio is clipped so that the gradient is
    cut — for CISPO the fraction truncated at the cap/floor, for GSPO the fraction of samples clipped),
    `rho_mean`, `rho_max` (token ratios pi_train/pi_gen), `approx_kl` (k3 estimator of KL(gen||train):
    mean of rho - 1 - log rho over tokens sampled from pi_gen; unbiased and >= 0), `entropy` if given,
    and for GSPO `seq_rho_mean`, `seq_rho_max`; `is_ess` (normalised effective sample size of the token
    ratios) always, `is_correction_fraction` (units truncated or masked by `is_correction`) when a
    correction is on. With `sums=True` the metrics are instead `loss` and the
    float64 tensor shares of `diagnostic_sums` (no host sync), exact to aggregate over micro-batches.
    """
    aggregation, eps_low, eps_high = _resolve(loss_type, aggregation, eps_low, eps_high)
    _check_inputs(logp, gen_logp, advantages, mask, prompt_index, loss_type=loss_type, is_correction=is_correction,
                  micro_batch=weights is not None)
    B, T = mask.shape
    m, w, logp_m, log_ratio, clip_log_ratio, A_B1, is_flags = _loss_terms(
        logp, gen_logp, advantages, mask, prompt_index, weights=weights, aggregation=aggregation,
        loss_type=loss_type, is_correction=is_correction, is_cap=is_cap, is_low=is_low, is_high=is_high)

    metrics: dict[str, float] = {}
    J, clipped_u = _objective(loss_type, w=w, m=m, logp_m=logp_m, log_ratio=log_ratio, clip_log_ratio=clip_log_ratio,
                              A_B1=A_B1, eps_low=eps_low, eps_high=eps_high, seq_metrics=None if sums else metrics)
    loss = -J
    with torch.no_grad():
        if entropy is not None:
            _check_bt("entropy", entropy, (B, T))
        diag = diagnostic_sums(log_ratio.detach()[m], clipped_u,
                               entropy_t=None if entropy is None else entropy.detach()[m], is_flags_u=is_flags)
        if sums:
            return loss, {"loss": loss.detach(), **diag}
        metrics.update(loss=float(loss.detach()), **diagnostic_means(diag),
                       num_tokens=float(m.sum()), num_samples=float((m.sum(1) > 0).sum()))
    return loss, metrics


def _loss_terms(
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    weights: torch.Tensor | None,
    aggregation: str,
    loss_type: str,
    is_correction: str,
    is_cap: float,
    is_low: float,
    is_high: float,
) -> tuple[torch.Tensor, ...]:
    """The per-token inputs of `_objective` for `policy_loss`: (m trained-token mask, w token weights times
    the IS-correction weights, masked logp, masked log ratio against the generator, the log ratio the clip
    sees, advantages [B, 1], IS-correction flags or None)."""
    B, T = mask.shape
    m = mask > 0
    if weights is None:
        w = token_weights(mask, prompt_index, aggregation, dtype=logp.dtype)
    else:
        _check_bt("weights", weights, (B, T))
        w = weights
    w = w.to(logp.dtype)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp_m = torch.where(m, logp, zero)
    log_ratio = torch.where(m, logp - gen_logp.to(logp.dtype), zero)
    A_B1 = advantages.to(logp.dtype)[:, None]
    is_flags = None
    # the ratio the PPO-style clip sees: against the generator, or against pi_old = sg(pi_train) when
    # an IS correction carries the train-vs-generator mismatch (module docstring)
    clip_log_ratio = log_ratio
    if is_correction != "none":
        iw, is_flags = is_weights(logp.detach(), gen_logp, mask, mode=is_correction, cap=is_cap,
                                  low=is_low, high=is_high)
        if loss_type == "cispo":
            iw = (iw > 0).to(logp.dtype)  # the masks only: the CISPO weight already holds the ratio
        w = w * iw
        clip_log_ratio = torch.where(m, logp - logp.detach(), zero)
    return m, w, logp_m, log_ratio, clip_log_ratio, A_B1, is_flags


DIAGNOSTIC_SUM_KEYS = ("clip_num", "clip_den", "rho_sum", "rho_sq_sum", "kl_sum", "rho_tokens", "entropy_sum",
                       "entropy_tokens", "is_corr_num", "is_corr_den", "rho_max")
"""Additive shares of the loss diagnostics (float64 sums and counts over trained tokens; `rho_max` is
a max, combined with max). Summed over micro-batches and data-parallel ranks they give the exact
global-batch diagnostics through `diagnostic_means`."""


def diagnostic_sums(log_ratio_t: torch.Tensor, clipped_u: torch.Tensor, *,
                    entropy_t: torch.Tensor | None = None,
                    is_flags_u: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Diagnostic shares (`DIAGNOSTIC_SUM_KEYS`) of some trained tokens: `log_ratio_t` [n] are their
    log(pi_train / pi_gen), `clipped_u` [u] flags the clipped units (tokens; GSPO: samples),
    `entropy_t` [n] their policy entropies if known (else `entropy_tokens` is 0), `is_flags_u` the
    units an IS correction truncated or masked (`is_correction.is_weights`; None: no correction, then
    `is_corr_den` is 0). No host sync."""
    lr = log_ratio_t.detach().double()
    rho = lr.exp()
    zero = torch.zeros((), dtype=torch.float64, device=lr.device)
    ent = zero if entropy_t is None else entropy_t.detach().double().sum()
    return {
        "clip_num": clipped_u.double().sum(), "clip_den": torch.tensor(float(clipped_u.numel()),
                                                                       dtype=torch.float64, device=lr.device),
        "rho_sum": rho.sum(), "rho_sq_sum": rho.square().sum(), "kl_sum": (rho - 1 - lr).sum(),
        "rho_tokens": torch.tensor(float(lr.numel()), dtype=torch.float64, device=lr.device),
        "entropy_sum": ent,
        "entropy_tokens": zero if entropy_t is None else torch.tensor(float(entropy_t.numel()),
                                                                        dtype=torch.float64, device=lr.device),
        "is_corr_num": zero if is_flags_u is None else is_flags_u.double().sum(),
        "is_corr_den": zero if is_flags_u is None else torch.tensor(float(is_flags_u.numel()), dtype=torch.float64,
                                                                    device=lr.device),
        "rho_max": rho.max() if rho.numel() else zero,
    }


def diagnostic_means(sums: dict) -> dict[str, float]:
    """Summed `diagnostic_sums` -> `clip_fraction`, `rho_mean`, `rho_max`, `approx_kl` (k3: mean of
    rho - 1 - log rho), `is_ess` = (sum rho)^2 / (n sum rho^2) over the n trained tokens' ratios
    rho = pi_train / pi_gen (the effective sample size divided by n: in (0, 1], 1 when all ratios are
    equal), `entropy` (only when some entropy was given) and `is_correction_fraction` (only when an IS
    correction ran). Empty: 0 clipped, rho 1, KL 0, ESS 1."""
    v = {k: float(sums[k]) for k in DIAGNOSTIC_SUM_KEYS}
    tok = v["rho_tokens"]
    out = {"clip_fraction": v["clip_num"] / v["clip_den"] if v["clip_den"] else 0.0,
           "rho_mean": v["rho_sum"] / tok if tok else 1.0,
           "rho_max": v["rho_max"] if tok else 1.0,
           "approx_kl": v["kl_sum"] / tok if tok else 0.0,
           "is_ess": v["rho_sum"] ** 2 / (tok * v["rho_sq_sum"]) if tok else 1.0}
    if v["is_corr_den"]:
        out["is_correction_fraction"] = v["is_corr_num"] / v["is_corr_den"]
    if v["entropy_tokens"]:
        out["entropy"] = v["entropy_sum"] / v["entropy_tokens"]
    return out
