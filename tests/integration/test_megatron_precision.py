"""Megatron mixed precision, distributed optimizer, dist-checkpoint resharding and activation recompute
on CPU (gloo), with the trainer's own wrapping (trainer/megatron/wrap.py).

One 2-process launch trains bf16 models 2 steps at DP 2 (FP32 head: distributed optimizer) and at
TP 2 (bf16 head: non-distributed mixed-precision optimizer), checkpoints them and trains 2 more
steps; one 1-process launch then loads each checkpoint at TP1 DP1 (resharding model and optimizer
state) and trains the same 2 steps, and runs the recompute comparison. Shared by all tests here.
"""

from __future__ import annotations

import json
from pathlib import Path

import mp_launch
import pytest

WORKER = Path(__file__).with_name("megatron_worker_precision.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("precision")
    for nproc, args in ((2, ["save", "--out", str(out)]), (1, ["load", "--out", str(out)])):
        procs = mp_launch.start(WORKER, nproc, args, logdir=out, log_name=args[0])
        mp_launch.wait(procs, logdir=out, log_name=args[0], what=str(args), timeout=600)
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_bf16_params_fp32_main_params_and_grads(runs):
    """Megatron's way: Float16Module, bf16 body, FP32 gradient buffers, FP32 head only with fp32_head."""
    for name in ("save_dp2", "save_tp2", "load_dp2", "load_tp2"):
        res = runs[name]
        assert res["wrapper"] == "Float16Module" and res["body_dtype"] == "torch.bfloat16", name
        assert res["grad_dtypes"] == ["torch.float32"], name  # grad_reduce_in_fp32 (default)
    assert runs["save_dp2"]["head_dtype"] == "torch.float32"  # fp32_head survives the bf16 wrap
    assert runs["save_tp2"]["head_dtype"] == "torch.bfloat16"  # bf16_head is really bf16
    # distributed optimizer by default at DP 2; the non-distributed FP32-main-param optimizer at DP 1
    assert runs["save_dp2"]["optimizers"] == ["DistributedOptimizer"] and runs["save_dp2"]["dp"] == 2
    assert runs["save_tp2"]["optimizers"] == ["Float16OptimizerWithFloat16Params"] and runs["save_tp2"]["tp"] == 2
    loss = runs["save_dp2"]["before"]["loss"] + runs["save_dp2"]["after"]["loss"]
    assert all(a > b for a, b in zip(loss, loss[1:])), loss  # bf16 training learns


def test_distributed_optimizer_checkpoint_reshards_dp2_to_dp1(runs):
    after, resumed = runs["save_dp2"]["after"], runs["load_dp2"]["resumed"]
    assert runs["load_dp2"]["dp"] == 1
    assert resumed["loss"] == pytest.approx(after["loss"], rel=1e-6)
    assert resumed["grad_norm"] == pytest.approx(after["grad_norm"], rel=1e-6)
    # control: the same weights with a fresh optimizer diverge at the second step
    assert abs(runs["load_dp2"]["fresh_optimizer"]["loss"][1] - after["loss"][1]) > 0.1


def test_overlap_options_run_on_gloo_with_the_same_losses(runs):
    res, ref = runs["overlap_dp2"], runs["save_dp2"]
    assert res["overlap"] == [True, True]
    assert res["loss"] == pytest.approx(ref["before"]["loss"] + ref["after"]["loss"], rel=1e-6)


def test_checkpoint_reshards_tp2_to_tp1_and_training_continues(runs):
    after, resumed = runs["save_tp2"]["after"], runs["load_tp2"]["resumed"]
    assert runs["load_tp2"]["tp"] == 1
    # bf16 at TP1 vs TP2 rounds differently: equal within bf16 tolerance, far from the fresh control
    assert resumed["loss"] == pytest.approx(after["loss"], rel=2e-3)
    assert abs(runs["load_tp2"]["fresh_optimizer"]["loss"][1] - after["loss"][1]) > 0.1


def test_recompute_same_loss_and_grads(runs):
    res = runs["recompute"]
    none, sel, full = res["none"], res["selective"], res["full"]
    assert (none["recompute_granularity"], sel["recompute_granularity"], full["recompute_granularity"]) == (
        None, "selective", "full")
    for other in (sel, full):
        assert other["loss"] == pytest.approx(none["loss"], rel=1e-7)
        assert other["grad_sq"] == pytest.approx(none["grad_sq"], rel=1e-7)
        assert other["grad"] == pytest.approx(none["grad"], rel=1e-6, abs=1e-9)
    # the recompute really ran: 4 micro-batches x 2 layers forward once without, and again in backward
    assert none["core_attention"] == none["layer"] == 8
    assert sel["core_attention"] == 16 and sel["layer"] == 8  # core attention recomputed
    assert full["layer"] == 16 and full["core_attention"] == 16  # whole layers recomputed
