"""The FP8 generator's bias and its correction, exactly (paper Sec. 3.2 / App. on IS corrections): a tiny Qwen3 policy
p (float64) and its blockwise-FP8 copy q (the generator an FP8 server is: quant/fp8.py), every 2-token continuation
of one prompt enumerated (16^2 = 256), so expectations are sums, not samples.

Through the project's own loss (`objective.losses.policy_loss`, DAPO, each sample's tokens weighted by q(y), the
probability the generator samples it): with sequence-level TIS (`tis_seq`, cap inactive) the gradient is
E_q[(p/q) A grad log p] = E_p[A grad log p], the on-policy gradient, to float64 rounding; uncorrected it is
E_q[A grad log p], off by the FP8 mismatch."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scalerl_mega.objective.losses import policy_loss
from scalerl_mega.quant import fp8

V, PROMPT = 16, [5, 11, 2]


def _models():
    import transformers

    cfg = transformers.Qwen3Config(hidden_size=256, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64, vocab_size=V, tie_word_embeddings=False,
                                   initializer_range=0.1)
    torch.manual_seed(0)
    p = transformers.Qwen3ForCausalLM(cfg).double().eval()
    q = copy.deepcopy(p)
    state = {n: t.detach().clone() for n, t in p.state_dict().items()}
    q.load_state_dict(dict(fp8.dequantize_named(fp8.quantize_named(state.items()), dtype=torch.float64)))
    return p, q


def _enumerate(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [V*V, 5] of prompt + every (y1, y2), log-probs [V*V, 2] of y1 and y2)."""
    y = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(y), 3), y], 1)
    logits = model(ids[:, :-1]).logits[:, len(PROMPT) - 1:]
    return ids, torch.log_softmax(logits, -1).gather(-1, y[..., None])[..., 0]


def _grad(model, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.slow  # ~70 s on the shared 2-core machine (float64 forward and backward passes)
def test_tis_corrects_the_fp8_generators_bias_exactly():
    p, q = _models()
    with torch.no_grad():
        ids, logq = _enumerate(q)
    y1, y2 = ids[:, 3].double(), ids[:, 4].double()
    adv = torch.cos(y1) + 0.5 * torch.sin(3 * y2)  # any fixed function of the sequence
    q_seq = logq.sum(1).exp()
    assert math.isclose(float(q_seq.sum()), 1.0, rel_tol=1e-12)  # the enumeration is the whole distribution

    _, logp = _enumerate(p)
    p_seq = logp.sum(1).exp().detach()
    ratio = p_seq / q_seq
    # a real mismatch: per-token |log p - log q| and the sequence ratios' spread
    assert float((logp.detach() - logq).abs().mean()) > 1e-3 and float(ratio.max()) < 10.0
    on_policy = _grad(p, -(p_seq * adv * logp.sum(1)).sum())  # E_p[A grad log p]

    def project_loss(mode: str, cap: float = 10.0) -> tuple[torch.Tensor, dict]:
        _, lp = _enumerate(p)
        loss, metrics = policy_loss(lp, logq, adv, torch.ones_like(lp), torch.zeros(len(lp), dtype=torch.long),
                                    loss_type="dapo", weights=q_seq[:, None].expand_as(lp), is_correction=mode,
                                    is_cap=cap)
        return _grad(p, loss), metrics

    corrected, m = project_loss("tis_seq")
    assert m["is_correction_fraction"] == 0.0  # the cap never bit: the plain IS estimator
    rel = float((corrected - on_policy).norm() / on_policy.norm())
    assert rel < 1e-10, rel
    uncorrected, _ = project_loss("none")
    off = float((uncorrected - on_policy).norm() / on_policy.norm())
    assert off > 1e-3, off
    print(f"FP8 generator: mean |log p - log q| per token {float((logp.detach() - logq).abs().mean()):.3g}, "
          f"sequence ratios {float(ratio.min()):.3g}..{float(ratio.max()):.3g}; relative gradient error "
          f"tis_seq {rel:.3g}, uncorrected {off:.3g}")
    # a cap below the largest ratio truncates some sequences: TIS's known bias, smaller than none at all
    truncated, m = project_loss("tis_seq", cap=float(ratio.quantile(0.9)))
    assert 0.0 < m["is_correction_fraction"] < 0.2
    assert rel < float((truncated - on_policy).norm() / on_policy.norm()) < off
