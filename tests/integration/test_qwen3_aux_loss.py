"""Qwen3-MoE's load-balancing loss as configured (`model.moe_aux_loss_coeff`, from config.json's
`router_aux_loss_coef` under `model=hf`): Megatron's Switch loss per MoE layer, recomputed here in float64 from
each router's input (E * sum_i f_i P_i with f_i = tokens routed to expert i / (N k) over the natural top-k, P_i =
mean softmax probability of expert i), is what the trainer logs, and its gradient reaches the router scaled by
the coefficient; with the coefficient 0 the routers get no gradient from it. One CPU rank, FP32; the worker
runs in a subprocess (Megatron's global state)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_launch import run_single_worker  # noqa: E402

COEFF = 0.5


def _switch_loss(x, w, topk: int):
    """Switch load-balancing loss of one router in float64 (Megatron's moe_utils definition)."""
    import torch

    logits = x @ w.t()
    probs = torch.softmax(logits, dim=-1)
    n, e = probs.shape
    routed = torch.zeros_like(probs).scatter(1, torch.topk(logits, topk, dim=1).indices, 1.0)
    f = routed.sum(0) / (n * topk)
    p = probs.sum(0) / n
    return e * (f * p).sum()


def worker(out: str) -> None:
    import dataclasses

    import torch
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    from scalerl_mega.model.config import ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron import models, parallel

    torch.set_num_threads(1)
    report = {}
    for coeff in (COEFF, 0.0):
        m = dataclasses.replace(load_model_preset("tiny_qwen3_moe"), moe_aux_loss_coeff=coeff, init_method_std=0.2)
        parallel.init_parallel(ParallelConfig(), model=m, seed=3)
        gpt, _ = models.build_model(m, ParallelConfig())
        gpt.train()
        inputs = {}
        for layer in gpt.decoder.layers:
            router = getattr(layer.mlp, "router", None)
            if router is not None:
                router.register_forward_pre_hook(
                    lambda mod, args, n=layer.layer_number: inputs.__setitem__(n, args[0].detach().double()))
        tokens = torch.randint(0, m.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
        pos = torch.arange(24).unsqueeze(0).expand(2, 24)
        (gpt(tokens, pos, None).float().sum() * 0.0).backward()
        tracker = get_moe_layer_wise_logging_tracker().get("load_balancing_loss", {"values": torch.zeros(4)})
        entry = {"logged": tracker["values"].tolist(), "layers": {}}
        for layer in gpt.decoder.layers:
            router = getattr(layer.mlp, "router", None)
            if router is None:
                continue
            x = inputs[layer.layer_number].reshape(-1, m.hidden_size)
            w = router.weight.detach().double().requires_grad_(True)
            loss = _switch_loss(x, w, m.moe_topk)
            (grad,) = torch.autograd.grad(loss, w)
            entry["layers"][layer.layer_number] = {
                "ours": float(loss), "grad_ours": (coeff * grad).flatten().tolist(),
                "grad_megatron": router.weight.grad.double().flatten().tolist() if router.weight.grad is not None else None}
        report[str(coeff)] = entry
        parallel.teardown_parallel()
    with open(out, "w") as f:
        json.dump(report, f)


@pytest.mark.timeout(600)
def test_qwen3_moe_aux_loss_is_the_switch_loss_scaled_by_the_configured_coefficient(tmp_path):
    import torch

    report = run_single_worker(__file__, tmp_path / "report.json")
    on, off = report[str(COEFF)], report["0.0"]
    assert sorted(on["layers"], key=int) == ["1", "3", "4"]  # layer 2 (0-based 1) is dense: no router
    for n, layer in on["layers"].items():
        # what the trainer logs per layer: the loss divided by the coefficient (Megatron's tracker)
        assert on["logged"][int(n) - 1] == pytest.approx(layer["ours"], rel=1e-5), n
        assert layer["ours"] > 1.0  # E * sum f P >= 1, = 1 only for a perfectly balanced router
    assert on["logged"][1] == 0.0
    # the last MoE layer's router gets its gradient from its own aux loss only (the main loss is 0 x logits)
    last = on["layers"]["4"]
    got, want = torch.tensor(last["grad_megatron"]), torch.tensor(last["grad_ours"])
    assert want.abs().max() > 1e-4 and torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    for layer in off["layers"].values():
        assert layer["grad_megatron"] is None or max(map(abs, layer["grad_megatron"])) == 0.0
    assert not any(off["logged"])


if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
