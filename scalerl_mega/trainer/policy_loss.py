"""Trainer-side RL losses: a `TrainBatch` becomes the trainer's per-micro-batch loss functions.

The loop hands the trainer a typed `TrainBatch` (interfaces.PolicyTrainer); trainers slice it with
`batch_tensors` into row-wise tensors and call one of the loss functions built here on each
micro-batch:

- `make_policy_loss_fn`: `loss_fn(logp_BT, mb) -> (loss, metrics)` on FP32 log-probs from full
  logits (objective.losses: CISPO / DAPO / GRPO / GSPO, paper Sec. 3.2), or next-token
  cross-entropy for SFT batches (no `advantages`);
- `make_cispo_head_loss_fn`: the fused FP32-head CISPO (`objective.fused_logprob.cispo_from_hidden`,
  paper Sec. 3.2 Eq. (cispo) and "FP32 Precision for LLM logits") on the last hidden states, without
  [N, V] logits.

Losses and metrics of a micro-batch are its *shares* of the global-batch quantities (the batch's
`token_weights_BT` are computed on the whole batch), so sums over micro-batches and data-parallel
ranks are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.types import TrainBatch

LossFn = Callable[[Any, dict], tuple[Any, dict]]


def batch_tensors(batch: TrainBatch) -> dict[str, Any]:
    """TrainBatch -> the dict of row-wise tensors (and the policy version) a trainer slices into
    micro-batches; keys are the loss functions' names."""
    import torch

    out = {"input_ids": batch.input_ids_BT, "position_ids": batch.position_ids_BT,
           "targets": batch.targets_BT, "loss_mask": batch.loss_mask_BT, "gen_logp": batch.gen_logp_BT,
           "advantages": batch.advantages_B, "prompt_index": batch.prompt_index_B,
           "token_weights": batch.token_weights_BT}
    if batch.weight_version_BT is not None:
        out["weight_version"] = batch.weight_version_BT
    if batch.route_ids_BTLK is not None:
        out.update(route_ids=batch.route_ids_BTLK, route_mask=batch.route_mask_BT)
        if batch.route_weights_BTLK is not None:
            out["route_weights"] = batch.route_weights_BTLK
    if batch.policy_version is not None:
        out["trainer_version"] = torch.tensor(int(batch.policy_version))
    return out


def pad_batch(data: dict[str, Any], *, cols_multiple: int = 1) -> dict[str, Any]:
    """Pad a batch dict with positions that train nothing, so the sequence length divides
    `cols_multiple` (a micro-batch's width: the TP size under sequence parallelism, which splits the
    sequence across TP ranks). Padded positions have loss mask, token weights and log-probs zero
    (weight version -1), so their loss and gradient contributions are exactly zero; positions continue."""
    import torch

    rows, cols = (int(n) for n in data["input_ids"].shape[:2])
    extra_c = (-cols) % cols_multiple
    out = dict(data)
    if extra_c:
        for key, value in data.items():
            if not (torch.is_tensor(value) and value.dim() >= 2 and tuple(value.shape[:2]) == (rows, cols)):
                continue
            if key == "position_ids":
                fill = value[:, -1:] + torch.arange(1, extra_c + 1, dtype=value.dtype, device=value.device)
            elif key == "weight_version":
                fill = torch.full((rows, extra_c), -1, dtype=value.dtype, device=value.device)
            else:  # per-position fields ([rows, cols, ...], e.g. MoE routes) padded with zeros
                fill = torch.zeros((rows, extra_c, *value.shape[2:]), dtype=value.dtype, device=value.device)
            out[key] = torch.cat([value, fill], dim=1)
    return out


def make_policy_loss_fn(*, loss_type: str, eps_low: float | None, eps_high: float | None,
                        aggregation: str, is_correction: str = "none", is_cap: float | None = None,
                        is_low: float | None = None, is_high: float | None = None) -> LossFn:
    """The trainer's loss_fn (trainer/megatron/step.py contract): RL micro-batches carry `advantages`
    and the global-batch `token_weights`, so micro-batch losses sum to the full-batch -J; batches
    without `advantages` (the SFT warm start) use the next-token cross-entropy.

    Metrics are returned as shares that sum over micro-batches: token-weighted IS ratio and the
    policy loss; `is_ratio_mean` = sum_t w_t * rho_t. On-policy check: over completions generated
    entirely by the weights the trainer holds (`trainer_version`; PipelineRL tokens of a newer
    version on a stale KV cache are excluded), `onpolicy_abs_log_ratio_sum` / `onpolicy_tokens`
    is the mean |log pi_train - log pi_gen|, ~0 when engine and trainer agree, and
    `onpolicy_abs_log_ratio_max` its max (a `_max` key: the step reduces it with max). Loss diagnostics:
    the `objective.losses.diagnostic_sums` shares of `policy_loss` (entropy from `mb["entropy"]`, which
    the Megatron step provides on the logits path); `finalize_train_metrics` turns the global sums into
    `clip_fraction`, `rho_mean`, `rho_max`, `approx_kl`, `entropy`, `is_ess`, `is_correction_fraction`.
    `is_correction` / `is_cap` / `is_low` / `is_high`: the train-vs-generator IS correction of
    `objective.losses.policy_loss` (objective/is_correction.py; None: its default threshold).
    """
    from scalerl_mega.objective import is_correction as isc

    is_kw = {"is_correction": is_correction, "is_cap": isc.DEFAULT_IS_CAP if is_cap is None else is_cap,
             "is_low": isc.DEFAULT_IS_LOW if is_low is None else is_low,
             "is_high": isc.DEFAULT_IS_HIGH if is_high is None else is_high}
    isc.check_is_params(is_correction, cap=is_kw["is_cap"], low=is_kw["is_low"], high=is_kw["is_high"])

    def loss_fn(logp_BT, mb: dict):
        if "advantages" not in mb:
            return next_token_ce_loss(logp_BT, mb)
        from scalerl_mega.objective.losses import policy_loss

        loss, diag = policy_loss(logp_BT, mb["gen_logp"], mb["advantages"], mb["loss_mask"], mb["prompt_index"],
                                 loss_type=loss_type, aggregation=aggregation, eps_low=eps_low, eps_high=eps_high,
                                 weights=mb["token_weights"], entropy=mb.get("entropy"), sums=True, **is_kw)
        return loss, {**diag, **policy_metrics(logp_BT, mb, loss)}

    return loss_fn


def next_token_ce_loss(logp_BT: torch.Tensor, mb: dict) -> tuple[torch.Tensor, dict]:
    """Masked next-token cross-entropy, normalised by the global number of trained tokens
    (`mb["global_tokens"]`, set by the trainer when it splits the batch)."""
    mask = mb["loss_mask"].float()
    loss = -(logp_BT * mask).sum() / mb["global_tokens"]
    return loss, {"loss": loss.detach()}


def policy_metrics(logp_BT: torch.Tensor, mb: dict, loss: torch.Tensor) -> dict:
    """Micro-batch shares of the IS metrics (see `make_policy_loss_fn`)."""
    import torch

    with torch.no_grad():
        m = mb["loss_mask"] > 0
        log_ratio = torch.where(m, logp_BT.detach() - mb["gen_logp"].to(logp_BT.dtype), torch.zeros_like(logp_BT))
        wd = mb["token_weights"].to(logp_BT.dtype)
        metrics = {"loss": loss.detach(), "is_ratio_mean": (wd * log_ratio.exp() * m).sum(),
                   "abs_log_ratio_mean": (wd * log_ratio.abs()).sum()}
        if "trainer_version" in mb and "weight_version" in mb:
            whole_B = ((mb["weight_version"] == mb["trainer_version"]) | ~m).all(1)
            sel = whole_B[:, None] & m
            metrics["onpolicy_tokens"] = sel.sum().to(logp_BT.dtype)
            abs_on = log_ratio.abs() * sel
            metrics["onpolicy_abs_log_ratio_sum"] = abs_on.sum()
            # k3 estimate of KL(pi_gen || pi_train) on the generator's own samples: rho - 1 - log rho >= 0
            metrics["onpolicy_kl_sum"] = ((log_ratio.exp() - 1 - log_ratio) * sel).sum()
            metrics["onpolicy_abs_log_ratio_max"] = abs_on.max() if abs_on.numel() else abs_on.sum()
    return metrics


def make_cispo_head_loss_fn(*, eps_low: float | None, eps_high: float | None,
                            with_entropy: bool = True) -> Callable[[Any, dict], tuple[Any, dict]]:
    """The trainer's fused `head_loss_fn` (step.py `LMHead` contract) for CISPO with the FP32 head:
    RL micro-batches go through `objective.fused_logprob.cispo_from_hidden` (paper Sec. 3.2 Eq. (cispo)
    and "FP32 Precision for LLM logits") on their trained tokens only, with the global-batch
    `token_weights`, vocab-parallel over the TP group, never forming [N, V] logits; SFT batches (no
    `advantages`) use next-token cross-entropy on `LMHead.logprobs`. Same loss and metrics as
    `make_policy_loss_fn(loss_type="cispo", ...)`: the IS metrics use the per-token log-probs of the
    same fused pass (the head runs once), and the entropy is computed in that pass on the torch backend
    (the Triton kernels do not compute it: no `entropy` metric then).
    """
    from scalerl_mega.objective.losses import DEFAULT_EPS

    d_low, d_high = DEFAULT_EPS["cispo"]
    eps_low = d_low if eps_low is None else eps_low
    eps_high = d_high if eps_high is None else eps_high

    def head_loss_fn(head: Any, mb: dict) -> tuple[torch.Tensor, dict]:  # step.LMHead (no import circle)
        import torch

        from scalerl_mega.objective.fused_logprob import cispo_from_hidden
        from scalerl_mega.objective.losses import diagnostic_sums

        mask_BT = mb["loss_mask"] > 0
        if "advantages" not in mb:
            return next_token_ce_loss(head.logprobs(mb["targets"], mask_BT=mask_BT), mb)
        B, T, H = head.hidden_BTH.shape
        logp_BT = torch.zeros((B, T), dtype=torch.float32, device=head.hidden_BTH.device)
        if not bool(mask_BT.any()):
            loss = head.zero_loss()
            empty = torch.zeros(0, device=loss.device)
            diag = diagnostic_sums(empty, empty.bool(), entropy_t=empty if with_entropy else None)
            return loss, {**diag, **policy_metrics(logp_BT, mb, loss)}
        sel = mask_BT.reshape(-1)
        adv_BT = mb["advantages"].float()[:, None].expand(B, T)
        loss, diag, logp_N = cispo_from_hidden(
            head.hidden_BTH.reshape(B * T, H)[sel], head.weight_VH, mb["targets"].reshape(-1)[sel],
            mb["gen_logp"].reshape(-1)[sel], adv_BT.reshape(-1)[sel], mb["token_weights"].reshape(-1)[sel],
            eps_high=eps_high, eps_low=eps_low, group=head.group, vocab_start=head.vocab_start,
            reduce_grad_hidden=False, sums=True, with_entropy=with_entropy, return_logp=True)
        logp_BT = logp_BT.masked_scatter(mask_BT, logp_N)
        return loss, {**diag, **policy_metrics(logp_BT, mb, loss)}

    return head_loss_fn


def finalize_train_metrics(summed: dict[str, float]) -> dict[str, float]:
    """The trainer's global metric sums (micro-batch shares summed over micro-batches and DP ranks) ->
    the logged metrics: `objective.losses.diagnostic_sums` shares become `clip_fraction`, `rho_mean`,
    `rho_max`, `approx_kl` (k3), `is_ess`, `entropy` (if computed), `is_correction_fraction` (if a
    correction ran); `onpolicy_abs_log_ratio_mean` from its sum and token count, and
    `onpolicy_abs_log_ratio_max` only when some on-policy token was seen (else both are absent), and with them
    `onpolicy_mismatch_kl`: the mean of rho - 1 - log rho over those tokens, the k3 estimate of
    KL(pi_gen || pi_train) per token (the generator-vs-trainer mismatch: an FP8 generator's, for one).
    Other keys pass through. SFT metrics (no diagnostic shares) are returned as is."""
    from scalerl_mega.objective.losses import DIAGNOSTIC_SUM_KEYS, diagnostic_means

    out = {k: v for k, v in summed.items() if k not in DIAGNOSTIC_SUM_KEYS}
    if all(k in summed for k in DIAGNOSTIC_SUM_KEYS):
        out.update(diagnostic_means(summed))
    kl_sum = out.pop("onpolicy_kl_sum", None)
    if summed.get("onpolicy_tokens", 0.0) > 0:
        out["onpolicy_abs_log_ratio_mean"] = summed["onpolicy_abs_log_ratio_sum"] / summed["onpolicy_tokens"]
        if kl_sum is not None:
            out["onpolicy_mismatch_kl"] = kl_sum / summed["onpolicy_tokens"]
    else:
        out.pop("onpolicy_abs_log_ratio_max", None)
    return out
