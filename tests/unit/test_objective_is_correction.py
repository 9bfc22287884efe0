"""Train-vs-generator IS corrections (objective/is_correction.py) and their use in policy_loss.

References written here, not calling the code under test:
- rho_t = pi_old / pi_gen = exp(logp_t - gen_logp_t) (the trainer's policy at the step is pi_old);
  rho_i = prod_t rho_t over the sample's trained tokens.
- TIS: w = min(rho, C) (token or sequence); MIS / IcePop: w = rho if low <= rho <= high else 0.
- With a correction, dapo/grpo/gspo clip r = pi_train / pi_old (= 1 at the step, gradient
  grad log pi_train) and the term is multiplied by w; cispo keeps sg(min(rho, eps_high)) * A * logp
  and takes only the MIS masks.
"""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.objective.is_correction import IS_CORRECTIONS, check_is_params, is_weights
from scalerl_mega.objective.losses import policy_loss, token_weights

LN = math.log


def hand_batch():
    """Row 0: ratios 0.25, 1.5, 4 (all trained); row 1: ratios 3, 0.5 and an untrained position."""
    gen = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], dtype=torch.float64)
    log_rho = torch.tensor([[LN(0.25), LN(1.5), LN(4.0)], [LN(3.0), LN(0.5), 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    return gen + log_rho, gen, mask


@pytest.mark.parametrize("mode,kw,w_expected,flags_expected", [
    ("tis_token", dict(cap=2.0), [[0.25, 1.5, 2.0], [2.0, 0.5, 0.0]], [0, 0, 1, 1, 0]),
    # sequence ratios: 0.25 * 1.5 * 4 = 1.5 and 3 * 0.5 = 1.5
    ("tis_seq", dict(cap=2.0), [[1.5, 1.5, 1.5], [1.5, 1.5, 0.0]], [0, 0]),
    ("tis_seq", dict(cap=1.0), [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], [1, 1]),
    # bounds are inclusive: 0.5 is kept
    ("mis_token", dict(low=0.5, high=2.0), [[0.0, 1.5, 0.0], [0.0, 0.5, 0.0]], [1, 0, 1, 1, 0]),
    ("mis_seq", dict(low=0.5, high=2.0), [[1.5, 1.5, 1.5], [1.5, 1.5, 0.0]], [0, 0]),
    ("mis_seq", dict(low=0.5, high=1.2), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [1, 1]),
    ("none", {}, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], [0, 0, 0, 0, 0]),
])
def test_weights_of_a_hand_worked_batch(mode, kw, w_expected, flags_expected):
    old, gen, mask = hand_batch()
    w, flags = is_weights(old, gen, mask, mode=mode, **kw)
    assert torch.allclose(w, torch.tensor(w_expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert flags.tolist() == [bool(f) for f in flags_expected]
    assert not w.requires_grad


def ref_weights(logp, gen, lengths, mode, cap, low, high):
    """w [B, T] by explicit loops (float64)."""
    B, T = logp.shape
    w = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        L = int(lengths[i])
        rhos = [math.exp(float(logp[i, t] - gen[i, t])) for t in range(L)]
        seq = math.prod(rhos)
        for t in range(L):
            r = rhos[t] if mode.endswith("token") else seq
            if mode.startswith("tis"):
                w[i, t] = min(r, cap)
            else:
                w[i, t] = r if low <= r <= high else 0.0
    return w


def make_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    prompt_index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    B = prompt_index.numel()
    lengths = torch.randint(1, 7, (B,), generator=g)
    T = int(lengths.max()) + 1
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    gen = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = (gen + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    gen = torch.where(mask > 0, gen, torch.full_like(gen, 7.0))  # garbage at untrained positions
    logp = torch.where(mask > 0, logp, torch.full_like(logp, 11.0))
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, gen, adv, mask, prompt_index, lengths


PARAMS = dict(cap=1.4, low=0.7, high=1.6)


@pytest.mark.parametrize("mode", [m for m in IS_CORRECTIONS if m != "none"])
def test_weights_equal_loop_reference(mode):
    logp, gen, _, mask, _, lengths = make_batch(1)
    w, flags = is_weights(logp, gen, mask, mode=mode, **PARAMS)
    ref = ref_weights(logp, gen, lengths, mode, **PARAMS)
    assert torch.allclose(w, ref, rtol=1e-12, atol=1e-14)
    if mode.startswith("mis"):
        kept = (ref > 0)[mask > 0] if mode.endswith("token") else (ref[:, 0] > 0)
        assert flags.tolist() == (~kept).tolist()
    assert 0 < int(flags.sum()) < flags.numel()  # the thresholds bite on this batch


def ref_objective(logp, gen, adv, lengths, prompt_index, loss_type, mode, eps_low, eps_high):
    """J (prompt aggregation) in float64 by loops; the correction as in the module docstring."""
    iw = ref_weights(logp.detach(), gen, lengths, mode, **PARAMS)
    B = len(lengths)
    sums = []
    for i in range(B):
        L = int(lengths[i])
        lp, gp, A, wi = logp[i, :L], gen[i, :L], adv[i], iw[i, :L]
        if loss_type == "cispo":
            trunc = torch.exp(lp - gp).detach().clamp(max=eps_high)
            sums.append(((wi > 0).double() * trunc * A * lp).sum())
        elif loss_type in ("dapo", "grpo"):
            r = torch.exp(lp - lp.detach())
            sums.append((wi * torch.minimum(r * A, r.clamp(1 - eps_low, 1 + eps_high) * A)).sum())
        else:
            s = torch.exp((lp - lp.detach()).sum() / L)
            sums.append(wi.sum() * torch.minimum(s * A, s.clamp(1 - eps_low, 1 + eps_high) * A))
    total = 0.0
    groups = sorted(set(prompt_index.tolist()))
    for p in groups:
        idx = [i for i in range(B) if int(prompt_index[i]) == p]
        total = total + sum(sums[i] for i in idx) / sum(int(lengths[i]) for i in idx)
    return total / len(groups)


CASES = [("dapo", m) for m in ("tis_token", "tis_seq", "mis_token", "mis_seq")] + [
    ("grpo", "tis_token"), ("gspo", "tis_token"), ("gspo", "mis_seq"), ("cispo", "mis_token"), ("cispo", "mis_seq")]
EPS = {"cispo": (None, 1.3), "dapo": (0.2, 0.28), "grpo": (0.2, 0.2), "gspo": (3e-3, 5e-3)}


@pytest.mark.parametrize("loss_type,mode", CASES)
def test_corrected_loss_and_grad_match_float64_reference(loss_type, mode):
    logp, gen, adv, mask, pidx, lengths = make_batch(2)
    eps_low, eps_high = EPS[loss_type]
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, gen, adv, mask, pidx, loss_type=loss_type, aggregation="prompt",
                                eps_low=eps_low, eps_high=eps_high, is_correction=mode, **{f"is_{k}": v
                                                                                           for k, v in PARAMS.items()})
    (grad,) = torch.autograd.grad(loss, x)
    y = logp.clone().requires_grad_(True)
    ref = -ref_objective(y, gen, adv, lengths, pidx, loss_type, mode, eps_low, eps_high)
    (ref_grad,) = torch.autograd.grad(ref, y)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-10, abs=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    if loss_type != "cispo":
        # hand-derived: the clipped ratio against pi_old is 1, so dJ/dlogp_t = w_agg * iw * A
        # (gspo: the sample's sum_t w_agg*iw spread as 1/|y_i| over its tokens)
        iw = ref_weights(logp, gen, lengths, mode, **PARAMS)
        wa = token_weights(mask, pidx, "prompt", dtype=torch.float64)
        if loss_type == "gspo":
            expect = -((wa * iw).sum(1) * adv / lengths)[:, None] * mask
        else:
            expect = -wa * iw * adv[:, None]
        assert torch.allclose(grad, expect, rtol=1e-10, atol=1e-13)
        assert metrics["clip_fraction"] == 0.0
    assert 0 < metrics["is_correction_fraction"] < 1


@pytest.mark.parametrize("loss_type,mode", [("dapo", "tis_seq"), ("gspo", "mis_token"), ("cispo", "mis_seq")])
def test_micro_batch_losses_sum_to_the_whole_batch(loss_type, mode):
    logp, gen, adv, mask, pidx, _ = make_batch(3)
    kw = dict(loss_type=loss_type, aggregation="prompt", is_correction=mode,
              **{f"is_{k}": v for k, v in PARAMS.items()})
    whole, _ = policy_loss(logp, gen, adv, mask, pidx, **kw)
    w = token_weights(mask, pidx, "prompt", dtype=torch.float64)
    parts = sum(float(policy_loss(logp[r], gen[r], adv[r], mask[r], pidx[r], weights=w[r], **kw)[0])
                for r in (slice(0, 3), slice(3, 4), slice(4, 8)))
    assert parts == pytest.approx(float(whole), rel=1e-12, abs=1e-14)


def test_no_correction_is_the_plain_loss_and_cispo_refuses_tis():
    logp, gen, adv, mask, pidx, _ = make_batch(4)
    for loss_type in ("cispo", "dapo", "gspo"):
        a, _ = policy_loss(logp, gen, adv, mask, pidx, loss_type=loss_type)
        b, _ = policy_loss(logp, gen, adv, mask, pidx, loss_type=loss_type, is_correction="none")
        assert float(a) == float(b)
    with pytest.raises(ValueError, match=r"is_correction='tis_token' with loss_type='cispo'"):
        policy_loss(logp, gen, adv, mask, pidx, loss_type="cispo", is_correction="tis_token")


@pytest.mark.parametrize("mode,kw,key", [
    ("tis", {}, "is_correction"), ("tis_token", dict(cap=0.0), "is_cap"), ("tis_seq", dict(cap=math.inf), "is_cap"),
    ("mis_token", dict(low=-0.1), "is_low"), ("mis_seq", dict(low=1.0, high=1.0), "is_high"),
])
def test_bad_parameters_name_the_argument(mode, kw, key):
    args = {"cap": 2.0, "low": 0.5, "high": 2.0, **kw}
    with pytest.raises(ValueError, match=key):
        check_is_params(mode, **args)


def test_ess_metric_is_the_normalised_effective_sample_size():
    """is_ess = (sum rho)^2 / (n sum rho^2) over trained tokens; on the hand batch rho = 0.25, 1.5, 4, 3, 0.5."""
    old, gen, mask = hand_batch()
    _, metrics = policy_loss(old, gen, torch.tensor([1.0, -1.0], dtype=torch.float64), mask,
                             torch.tensor([0, 0]), loss_type="dapo")
    rho = [0.25, 1.5, 4.0, 3.0, 0.5]
    assert metrics["is_ess"] == pytest.approx(sum(rho) ** 2 / (5 * sum(r * r for r in rho)), rel=1e-12)
    assert "is_correction_fraction" not in metrics
