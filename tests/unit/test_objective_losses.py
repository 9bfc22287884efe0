"""policy_loss / token_weights against float64 references written from the paper's formulas.

References (in this file, not calling the code under test):
- rho_{i,t} = exp(logp - gen_logp) (Sec. 2 Eq. (is)).
- CISPO term: sg(min(rho, eps_max)) * A_i * logp (Sec. 3.2 Eq. (cispo)).
- DAPO/GRPO term: min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A) (Eq. (grpo_loss), Eq. (dapo_loss)).
- GSPO term: s_i = exp(mean_t(logp - gen_logp)), min(s*A, clip(s, 1-eps_low, 1+eps_high)*A) (Sec. 3.2).
- sample: 1/G sum_i 1/|y_i| sum_t; prompt: mean over prompts of 1/T_g sum_i sum_t (T_g = sum |y_i|);
  token: 1/sum|y_i| sum_{i,t}.  A GSPO sequence term stands for each of its tokens.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from scalerl_mega.objective.advantages import compute_advantages
from scalerl_mega.objective.losses import policy_loss, token_weights

EPS = {"cispo": (None, 1.3), "dapo": (0.2, 0.28), "grpo": (0.2, 0.2), "gspo": (3e-3, 5e-3)}


def make_batch(seed: int, *, noise: float, prompts=(3, 1, 4, 2)):
    g = torch.Generator().manual_seed(seed)
    prompt_index = torch.cat([torch.full((n,), p, dtype=torch.long) for p, n in enumerate(prompts)])
    B = prompt_index.numel()
    lengths = torch.randint(1, 9, (B,), generator=g)
    T = int(lengths.max()) + 2
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    gen = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = gen + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp = logp.clamp(max=-1e-3)
    # garbage at padded positions must not matter
    gen = torch.where(mask > 0, gen, torch.full_like(gen, 7.0))
    logp = torch.where(mask > 0, logp, torch.full_like(logp, 11.0))
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, gen, adv, mask, prompt_index, lengths


def ref_objective(logp, gen, adv, lengths, prompt_index, loss_type, aggregation, eps_low, eps_high):
    """J in float64 by explicit loops over prompts, samples and tokens."""
    B = len(lengths)
    sample_sums = []  # sum over tokens of each sample's term (GSPO: |y_i| * term_i)
    for i in range(B):
        L = int(lengths[i])
        lp, gp, A = logp[i, :L], gen[i, :L], adv[i]
        if loss_type == "cispo":
            rho = torch.exp(lp - gp).detach()
            trunc = torch.minimum(rho, torch.tensor(eps_high, dtype=torch.float64))
            if eps_low is not None:
                trunc = torch.maximum(trunc, torch.tensor(eps_low, dtype=torch.float64))
            sample_sums.append((trunc * A * lp).sum())
        elif loss_type in ("dapo", "grpo"):
            rho = torch.exp(lp - gp)
            clipped = torch.clamp(rho, 1 - eps_low, 1 + eps_high)
            sample_sums.append(torch.minimum(rho * A, clipped * A).sum())
        else:
            s = torch.exp((lp - gp).sum() / L)
            term = torch.minimum(s * A, torch.clamp(s, 1 - eps_low, 1 + eps_high) * A)
            sample_sums.append(L * term)
    if aggregation == "sample":
        return sum(sample_sums[i] / int(lengths[i]) for i in range(B)) / B
    if aggregation == "token":
        return sum(sample_sums) / int(lengths.sum())
    groups = sorted(set(prompt_index.tolist()))
    total = 0.0
    for p in groups:
        idx = [i for i in range(B) if int(prompt_index[i]) == p]
        T_g = sum(int(lengths[i]) for i in idx)
        total = total + sum(sample_sums[i] for i in idx) / T_g
    return total / len(groups)


@pytest.mark.parametrize("loss_type,aggregation,normalization",
                         list(itertools.product(["cispo", "dapo", "grpo", "gspo"], ["prompt", "sample", "token"],
                                                ["batch", "prompt", "none"])))
def test_loss_and_grad_match_float64_reference(loss_type, aggregation, normalization):
    noise = 0.02 if loss_type == "gspo" else 0.35
    logp, gen, _, mask, pidx, lengths = make_batch(zlib.crc32(f"{loss_type}{aggregation}{normalization}".encode()) % 1000,
                                                   noise=noise)
    g = torch.Generator().manual_seed(7)
    rewards = torch.randint(0, 2, (len(pidx),), generator=g).double()
    adv = compute_advantages(rewards, pidx, normalization=normalization)
    eps_low, eps_high = EPS[loss_type]

    lp1 = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(lp1, gen, adv, mask, pidx, loss_type=loss_type, aggregation=aggregation,
                                eps_low=eps_low, eps_high=eps_high)
    loss.backward()

    lp2 = logp.clone().requires_grad_(True)
    J = ref_objective(lp2, gen, adv, lengths, pidx, loss_type, aggregation, eps_low, eps_high)
    (-J).backward()
    torch.testing.assert_close(loss, -J, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lp1.grad, lp2.grad, rtol=1e-10, atol=1e-12)
    assert lp1.grad[mask == 0].abs().max() == 0
    assert metrics["loss"] == pytest.approx(float(-J.detach()), rel=1e-9, abs=1e-12)
    assert 0 < metrics["clip_fraction"] < 1  # both branches of the clip are exercised


def test_hand_worked_aggregation_weights():
    # prompt 0: samples of 1 and 3 tokens; prompt 1: one sample of 2 tokens. T = 4.
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    pidx = torch.tensor([0, 0, 1])
    w_sample = torch.tensor([[1 / 3, 0, 0, 0], [1 / 9, 1 / 9, 1 / 9, 0], [1 / 6, 1 / 6, 0, 0]])
    w_prompt = torch.tensor([[1 / 8, 0, 0, 0], [1 / 8, 1 / 8, 1 / 8, 0], [1 / 4, 1 / 4, 0, 0]])
    w_token = torch.tensor([[1 / 6, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0], [1 / 6, 1 / 6, 0, 0]])
    torch.testing.assert_close(token_weights(mask, pidx, "sample"), w_sample)
    torch.testing.assert_close(token_weights(mask, pidx, "prompt"), w_prompt)
    torch.testing.assert_close(token_weights(mask, pidx, "token"), w_token)

    # On-policy CISPO (rho = 1): loss = -sum w * A * logp.  A = (1, -1, 2), logp = -1 everywhere:
    # prompt: -(1/8*1*-1 + 3/8*-1*-1 + 2/4*2*-1) = -(-1/8 + 3/8 - 1) = 0.75
    logp = -torch.ones(3, 4)
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, pidx, loss_type="cispo", aggregation="prompt")
    assert float(loss) == pytest.approx(0.75)
    # sample: -(1/3*-1 + 3/9*1 + 2/6*-2) = -(-1/3 + 1/3 - 2/3) = 2/3
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, pidx, loss_type="cispo", aggregation="sample")
    assert float(loss) == pytest.approx(2 / 3)
    # token: -(1/6)(-1 + 3 - 4) = 1/3
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, pidx, loss_type="cispo", aggregation="token")
    assert float(loss) == pytest.approx(1 / 3)
    # GSPO, sample aggregation, on policy: s = 1, loss = -mean_i A_i = -2/3
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, pidx, loss_type="gspo")
    assert float(loss) == pytest.approx(-2 / 3)


@pytest.mark.parametrize("loss_type", ["cispo", "dapo", "grpo", "gspo"])
def test_zero_variance_prompt_gets_exactly_zero_gradient(loss_type):
    logp, gen, _, mask, pidx, _ = make_batch(11, noise=0.3)
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 1], dtype=torch.float64)  # prompt 1 and 3 constant
    for norm in ("batch", "prompt", "none"):
        adv = compute_advantages(rewards, pidx, normalization=norm)
        lp = logp.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, gen, adv, mask, pidx, loss_type=loss_type)
        loss.backward()
        zero_rows = (pidx == 1) | (pidx == 3)
        assert torch.all(lp.grad[zero_rows] == 0)
        assert lp.grad[~zero_rows].abs().sum() > 0


def test_cispo_passes_no_gradient_through_the_truncated_ratio():
    logp, gen, adv, mask, pidx, _ = make_batch(5, noise=0.5)
    eps_high = 1.2
    lp = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, gen, adv, mask, pidx, loss_type="cispo", aggregation="token",
                                eps_high=eps_high)
    loss.backward()
    rho = torch.exp(logp - gen)
    w = mask / mask.sum()
    expected = -w * torch.clamp(rho, max=eps_high) * adv[:, None]  # d/dlogp of sg(.)*A*logp
    torch.testing.assert_close(lp.grad, expected, rtol=1e-12, atol=1e-14)
    m = mask > 0
    assert metrics["clip_fraction"] == pytest.approx(float((rho[m] > eps_high).double().mean()))
    assert 0 < metrics["clip_fraction"] < 1


def test_cispo_eps_low_is_an_absolute_floor():
    logp, gen, adv, mask, pidx, _ = make_batch(6, noise=0.5)
    lp = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, gen, adv, mask, pidx, loss_type="cispo", aggregation="token",
                                eps_low=0.9, eps_high=1.1)
    loss.backward()
    rho = torch.exp(logp - gen)
    expected = -(mask / mask.sum()) * rho.clamp(0.9, 1.1) * adv[:, None]
    torch.testing.assert_close(lp.grad, expected, rtol=1e-12, atol=1e-14)
    m = mask > 0
    assert metrics["clip_fraction"] == pytest.approx(float(((rho[m] > 1.1) | (rho[m] < 0.9)).double().mean()))


def test_metrics_against_independent_computation():
    logp, gen, adv, mask, pidx, _ = make_batch(8, noise=0.3)
    ent = torch.rand_like(logp)
    _, met = policy_loss(logp, gen, adv, mask, pidx, loss_type="dapo", entropy=ent)
    m = mask > 0
    rho = torch.exp(logp - gen)[m]
    A = adv[:, None].expand_as(logp)[m]
    # k3 estimator of KL(gen || train): E_gen[rho - 1 - log rho]
    assert met["approx_kl"] == pytest.approx(float((rho - 1 - torch.log(rho)).mean()), rel=1e-9)
    assert met["rho_mean"] == pytest.approx(float(rho.mean()), rel=1e-9)
    assert met["rho_max"] == pytest.approx(float(rho.max()), rel=1e-9)
    assert met["entropy"] == pytest.approx(float(ent[m].mean()), rel=1e-9)
    clipped = ((A > 0) & (rho > 1.28)) | ((A < 0) & (rho < 0.8))
    assert met["clip_fraction"] == pytest.approx(float(clipped.double().mean()))
    assert met["num_tokens"] == float(m.sum())


@pytest.mark.parametrize("loss_type", ["cispo", "dapo", "gspo"])
@pytest.mark.parametrize("aggregation", ["prompt", "sample", "token"])
def test_micro_batches_with_global_weights_sum_to_unsplit_loss(loss_type, aggregation):
    noise = 0.02 if loss_type == "gspo" else 0.3
    logp, gen, adv, mask, pidx, _ = make_batch(21, noise=noise)
    lp_full = logp.clone().requires_grad_(True)
    full, _ = policy_loss(lp_full, gen, adv, mask, pidx, loss_type=loss_type, aggregation=aggregation)
    full.backward()

    w = token_weights(mask, pidx, aggregation, dtype=torch.float64)
    # Uneven split that cuts through prompts (as packing / DP sharding would), in a shuffled order.
    perm = torch.randperm(len(pidx), generator=torch.Generator().manual_seed(0))
    lp_parts = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in (perm[:3], perm[3:4], perm[4:]):
        part, _ = policy_loss(lp_parts[rows], gen[rows], adv[rows], mask[rows], pidx[rows],
                              loss_type=loss_type, aggregation=aggregation, weights=w[rows])
        total = total + part
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lp_parts.grad, lp_full.grad, rtol=1e-12, atol=1e-15)
    # Without global weights the split loss is different (the test would catch a wrong trainer).
    local = sum(policy_loss(logp[r], gen[r], adv[r], mask[r], pidx[r], loss_type=loss_type,
                            aggregation=aggregation)[0] for r in (perm[:3], perm[3:4], perm[4:]))
    assert abs(float(local.detach()) - float(full.detach())) > 1e-6


def test_bad_inputs_raise_value_error_naming_the_fault():
    logp, gen, adv, mask, pidx, _ = make_batch(1, noise=0.1)
    with pytest.raises(ValueError, match="gen_logp"):
        policy_loss(logp, gen[:, :-1], adv, mask, pidx)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, gen, adv[:-1], mask, pidx)
    with pytest.raises(ValueError, match="prompt_index"):
        policy_loss(logp, gen, adv, mask, pidx[:-1])
    with pytest.raises(ValueError, match="empty batch"):
        policy_loss(logp[:0], gen[:0], adv[:0], mask[:0], pidx[:0])
    with pytest.raises(ValueError, match="empty batch"):
        policy_loss(logp, gen, adv, torch.zeros_like(mask), pidx)
    bad = gen.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="gen_logp contains NaN"):
        policy_loss(logp, bad, adv, mask, pidx)
    with pytest.raises(ValueError, match="loss_type='ppo'"):
        policy_loss(logp, gen, adv, mask, pidx, loss_type="ppo")
    with pytest.raises(ValueError, match="aggregation='batch'"):
        policy_loss(logp, gen, adv, mask, pidx, aggregation="batch")
    with pytest.raises(ValueError, match="eps_high"):
        policy_loss(logp, gen, adv, mask, pidx, loss_type="cispo", eps_high=0.0)
    with pytest.raises(ValueError, match="symmetric"):
        policy_loss(logp, gen, adv, mask, pidx, loss_type="grpo", eps_low=0.1, eps_high=0.2)
    with pytest.raises(ValueError, match="weights"):
        policy_loss(logp, gen, adv, mask, pidx, weights=mask[:, :-1])
