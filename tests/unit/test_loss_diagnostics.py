"""Per-step loss diagnostics (`train/clip_fraction`, `rho_mean`, `rho_max`, `approx_kl`, `entropy`) are exact
aggregates over micro-batches: the trainer's micro-batch shares, combined by the Megatron step's metric
reduction (`step._reduce_metrics`: sums, max for `_max` keys) and finalised by
`policy_loss.finalize_train_metrics`, equal a whole-batch float64 computation written here from the
definitions (paper Sec. 3.2 / App. A.2 for the clip rules; k3 = rho - 1 - log rho)."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.objective.losses import DEFAULT_EPS, token_weights
from scalerl_mega.trainer.policy_loss import (
    finalize_train_metrics, make_cispo_head_loss_fn, make_policy_loss_fn)

B, T, V, H = 12, 9, 41, 16
SPLITS = ([12], [5, 4, 3], [1] * 12)


@pytest.fixture
def single_rank(monkeypatch):
    """Megatron parallel state of a 1-rank job (TP = PP = DP = 1) without initialising Megatron."""
    from megatron.core import parallel_state as ps

    for name, value in (("is_pipeline_last_stage", True), ("get_pipeline_model_parallel_world_size", 1),
                        ("get_data_parallel_world_size", 1), ("get_tensor_model_parallel_world_size", 1)):
        monkeypatch.setattr(ps, name, lambda *a, _v=value, **k: _v)


def make_batch(seed: int = 0, *, aggregation: str = "prompt"):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.5
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.7).float()
    mask[:, 0] = 1.0  # every row trains a token (the logits-path loss rejects an empty micro-batch)
    pidx = torch.arange(B) // 3
    logits64 = hidden.double() @ weight.double().t()
    logp64 = torch.log_softmax(logits64, -1).gather(-1, targets[..., None])[..., 0]
    gen = (logp64 + 0.8 * torch.randn(B, T, generator=g).double()).float()
    adv = torch.randn(B, generator=g)
    data = {"input_ids": targets, "targets": targets, "loss_mask": mask, "gen_logp": gen, "advantages": adv,
            "prompt_index": pidx, "token_weights": token_weights(mask, pidx, aggregation)}
    return data, hidden, weight, logits64


def reference(data, logits64, loss_type: str) -> dict[str, float]:
    """Whole-batch float64 diagnostics from the definitions."""
    eps_low, eps_high = DEFAULT_EPS[loss_type]
    m = data["loss_mask"] > 0
    logp = torch.log_softmax(logits64, -1).gather(-1, data["targets"][..., None])[..., 0]
    lr = logp - data["gen_logp"].double()
    rho = lr.exp()
    A = data["advantages"].double()[:, None].expand(B, T)
    if loss_type == "cispo":
        clipped = (rho > eps_high)[m]
    elif loss_type in ("dapo", "grpo"):
        clipped = (((A > 0) & (rho > 1 + eps_high)) | ((A < 0) & (rho < 1 - eps_low)))[m]
    else:
        s = ((lr * m).sum(1) / m.sum(1)).exp()
        clipped = ((A[:, 0] > 0) & (s > 1 + eps_high)) | ((A[:, 0] < 0) & (s < 1 - eps_low))
    p = torch.softmax(logits64, -1)
    ent = -(p * p.log()).sum(-1)
    return {"clip_fraction": float(clipped.double().mean()), "rho_mean": float(rho[m].mean()),
            "rho_max": float(rho[m].max()), "approx_kl": float((rho - 1 - lr)[m].mean()),
            "entropy": float(ent[m].mean()), "is_ess": float(rho[m].sum() ** 2 / (m.sum() * rho[m].square().sum()))}


def run_logits_path(data, logits64, loss_type: str, sizes: list[int]) -> dict[str, float]:
    """As step.forward_backward's `loss_func` does per micro-batch, then `_reduce_metrics`."""
    from scalerl_mega.trainer.megatron import step

    loss_fn = make_policy_loss_fn(loss_type=loss_type, eps_low=None, eps_high=None, aggregation="prompt")
    logits = logits64.float()
    logp = torch.log_softmax(logits, -1).gather(-1, data["targets"][..., None])[..., 0]
    store, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        mb = {k: v[rows] for k, v in data.items()}
        mb["entropy"] = step.token_entropy(logits[rows], mb["loss_mask"])
        _, metrics = loss_fn(logp[rows], mb)
        store.append(metrics)
        start += size
    return finalize_train_metrics(step._reduce_metrics(store, collect_logprobs=False, device="cpu"))


@pytest.mark.parametrize("loss_type", ["cispo", "dapo", "grpo", "gspo"])
def test_filler_micro_batch_trains_nothing_and_keeps_the_aggregates(single_rank, loss_type):
    """The filler micro-batch a data-parallel rank short of one runs (trainer/microbatch.cut_micro_batch with
    no rows: no trained token) has loss 0, zero gradient, and the same metric keys; the aggregates are
    unchanged."""
    from scalerl_mega.trainer.megatron import step
    from scalerl_mega.trainer.microbatch import cut_micro_batch

    data, _, _, logits64 = make_batch(3)
    filler = cut_micro_batch(data, [], [int(data["input_ids"].shape[1])] * B, packed=False)
    assert filler["input_ids"].shape == (1, 1) and not filler["loss_mask"].any()
    loss_fn = make_policy_loss_fn(loss_type=loss_type, eps_low=None, eps_high=None, aggregation="prompt")
    logits = logits64.float().requires_grad_(True)
    store, losses = [], []
    for rows, mb in ((slice(0, 7), None), (slice(7, B), None), (slice(0, 1), filler)):
        mb_logits = logits[rows] if mb is None else logits[rows, :1]
        mb = {k: v[rows] for k, v in data.items()} if mb is None else mb
        logp = torch.log_softmax(mb_logits, -1).gather(-1, mb["targets"][..., None])[..., 0]
        mb["entropy"] = step.token_entropy(mb_logits.detach(), mb["loss_mask"])
        loss, metrics = loss_fn(logp, mb)
        store.append(metrics)
        losses.append(loss)
    assert set(store[2]) == set(store[0]) and float(losses[2].detach()) == 0.0
    (grad,) = torch.autograd.grad(losses[2], logits)
    assert not grad.any()
    out = finalize_train_metrics(step._reduce_metrics(store, collect_logprobs=False, device="cpu"))
    for key, value in reference(data, logits64, loss_type).items():
        assert out[key] == pytest.approx(value, rel=2e-5, abs=1e-6), key


@pytest.mark.parametrize("loss_type", ["cispo", "dapo", "grpo", "gspo"])
def test_logits_path_diagnostics_equal_whole_batch_float64(single_rank, loss_type):
    data, _, _, logits64 = make_batch(1)
    ref = reference(data, logits64, loss_type)
    outs = [run_logits_path(data, logits64, loss_type, sizes) for sizes in SPLITS]
    for out in outs:
        for key, value in ref.items():
            assert out[key] == pytest.approx(value, rel=2e-5, abs=1e-6), key
        # micro-batch splits change only the float64 summation order
        for key in ref:
            assert out[key] == pytest.approx(outs[0][key], rel=1e-12, abs=1e-15), key
    assert 0 < ref["clip_fraction"] < 1 and ref["approx_kl"] > 0
    assert not any(k in outs[0] for k in ("clip_num", "rho_sum", "kl_sum", "entropy_sum"))


def test_fused_head_diagnostics_equal_whole_batch_and_run_the_head_once(single_rank, monkeypatch):
    from scalerl_mega.trainer.megatron import step

    data, hidden, weight, logits64 = make_batch(2)
    data["loss_mask"][8:] = 0.0  # a micro-batch without trained tokens must give the same metric keys
    data["token_weights"] = token_weights(data["loss_mask"], data["prompt_index"], "prompt")

    def no_second_pass(*a, **k):
        raise AssertionError("the fused CISPO loss must not run the LM head a second time")

    monkeypatch.setattr(step.LMHead, "logprobs", no_second_pass)
    head_loss_fn = make_cispo_head_loss_fn(eps_low=None, eps_high=None)
    store = []
    for rows in (slice(0, 5), slice(5, 8), slice(8, 12)):
        mb = {k: v[rows] for k, v in data.items()}
        head = step.LMHead(hidden_BTH=hidden[rows].clone().requires_grad_(True), weight_VH=weight,
                           vocab_start=0, group=None)
        _, metrics = head_loss_fn(head, mb)
        store.append(metrics)
    assert all(set(m) == set(store[0]) for m in store)
    out = finalize_train_metrics(step._reduce_metrics(store, collect_logprobs=False, device="cpu"))
    ref = reference(data, logits64, "cispo")
    for key, value in ref.items():
        assert out[key] == pytest.approx(value, rel=2e-5, abs=1e-6), key
    assert 0 < ref["clip_fraction"] < 1
    # the IS metrics come from the fused pass's log-probs
    m = data["loss_mask"] > 0
    logp = torch.log_softmax(logits64, -1).gather(-1, data["targets"][..., None])[..., 0]
    rho = (logp - data["gen_logp"].double()).exp()
    w = data["token_weights"].double()
    assert out["is_ratio_mean"] == pytest.approx(float((w * rho)[m].sum()), rel=2e-5)


def test_finalize_passes_sft_metrics_and_takes_the_on_policy_mean():
    assert finalize_train_metrics({"loss": 2.0, "grad_norm": 1.0}) == {"loss": 2.0, "grad_norm": 1.0}
    out = finalize_train_metrics({"onpolicy_tokens": 4.0, "onpolicy_abs_log_ratio_sum": 1.0,
                                  "onpolicy_abs_log_ratio_max": 0.5})
    assert out["onpolicy_abs_log_ratio_mean"] == 0.25 and out["onpolicy_abs_log_ratio_max"] == 0.5
    # no on-policy token this step: neither the mean nor the (meaningless 0) max is logged
    out = finalize_train_metrics({"onpolicy_tokens": 0.0, "onpolicy_abs_log_ratio_sum": 0.0,
                                  "onpolicy_abs_log_ratio_max": 0.0})
    assert "onpolicy_abs_log_ratio_mean" not in out and "onpolicy_abs_log_ratio_max" not in out


@pytest.mark.parametrize("loss_type,mode", [("dapo", "tis_token"), ("gspo", "mis_seq"), ("cispo", "mis_token")])
def test_on_policy_mismatch_and_correction_fraction_are_exact_over_micro_batches(single_rank, loss_type, mode):
    """`onpolicy_abs_log_ratio_mean` / `_max` over the rows generated entirely by the trainer's version
    (mixed-version rows excluded) and `is_correction_fraction`, whole batch in float64 vs any split."""
    from scalerl_mega.trainer.megatron import step

    data, _, _, logits64 = make_batch(4)
    version = torch.full((B, T), 3, dtype=torch.long)
    version[[1, 4, 9]] = 2
    version[6, T // 2:] = 2  # switched versions mid-completion (PipelineRL): not on-policy
    data["weight_version"], data["trainer_version"] = version, torch.tensor(3)
    m = data["loss_mask"] > 0
    logp = torch.log_softmax(logits64, -1).gather(-1, data["targets"][..., None])[..., 0]
    lr = logp - data["gen_logp"].double()
    on_rows = [b for b in range(B) if b not in (1, 4, 6, 9)]
    on = lr[on_rows].abs()[m[on_rows]]
    rho = lr.exp()
    low, high, cap = 0.6, 1.8, 1.5
    if mode == "tis_token":
        changed = (rho > cap)[m]
    elif mode == "mis_token":
        changed = ((rho < low) | (rho > high))[m]
    else:
        seq = (lr * m).sum(1).exp()
        changed = (seq < low) | (seq > high)
    loss_fn = make_policy_loss_fn(loss_type=loss_type, eps_low=None, eps_high=None, aggregation="prompt",
                                  is_correction=mode, is_cap=cap, is_low=low, is_high=high)
    logits = logits64.float()
    logp32 = torch.log_softmax(logits, -1).gather(-1, data["targets"][..., None])[..., 0]
    for sizes in SPLITS:
        store, start = [], 0
        for size in sizes:
            rows = slice(start, start + size)
            _, metrics = loss_fn(logp32[rows], {k: (v[rows] if v.dim() else v) for k, v in data.items()})
            store.append(metrics)
            start += size
        out = finalize_train_metrics(step._reduce_metrics(store, collect_logprobs=False, device="cpu"))
        assert out["onpolicy_abs_log_ratio_mean"] == pytest.approx(float(on.mean()), rel=2e-5)
        assert out["onpolicy_abs_log_ratio_max"] == pytest.approx(float(on.max()), rel=2e-5)
        assert out["onpolicy_tokens"] == float(on.numel())
        assert out["is_correction_fraction"] == pytest.approx(float(changed.double().mean()), abs=1e-12)
    assert 0 < float(changed.double().mean()) < 1


def test_reduce_metrics_takes_max_of_max_keys(single_rank):
    from scalerl_mega.trainer.megatron import step

    store = [{"a": torch.tensor(1.0), "rho_max": torch.tensor(3.0)},
             {"a": torch.tensor(2.5), "rho_max": torch.tensor(0.5)}]
    assert step._reduce_metrics(store, collect_logprobs=False, device="cpu") == {"a": 3.5, "rho_max": 3.0}
