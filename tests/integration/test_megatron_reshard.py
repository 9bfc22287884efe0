"""Distributed-optimizer checkpoints across model-parallel layouts: TP 2 -> TP 1 and
PP 2 -> PP 1 with the distributed optimizer's state (bf16 body, FP32 head, FP32 main weights and Adam
moments), saved in model space (`optim.checkpoint_format=fully_reshardable`), on CPU over gloo.

One 2-process launch trains 2 steps at TP 2 and at PP 2, checkpoints, trains 2 more (the uninterrupted
reference); one 1-process launch loads each checkpoint at TP1 PP1 into a distributed optimizer and trains
the same 2 steps (worker: megatron_worker_precision.py)."""

from __future__ import annotations

import json
from pathlib import Path

import mp_launch
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
WORKER = Path(__file__).with_name("megatron_worker_precision.py")
LAYOUTS = "tp2do,pp2do"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("reshard")
    for nproc, mode in ((2, "save"), (1, "load")):
        args = [mode, "--out", str(out), "--layouts", LAYOUTS, "--no-extras"]
        procs = mp_launch.start(WORKER, nproc, args, logdir=out, log_name=mode)
        mp_launch.wait(procs, logdir=out, log_name=mode, what=str(args), timeout=1500)
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.parametrize("layout,key", [("tp2do", "tp"), ("pp2do", "pp")])
def test_distributed_optimizer_state_reshards_to_one_rank_and_training_continues(runs, layout, key):
    saved, loaded = runs[f"save_{layout}"], runs[f"load_{layout}"]
    assert saved["optimizers"] == loaded["optimizers"] == ["DistributedOptimizer"]
    if key == "tp":
        assert saved["tp"] == 2
    else:  # PP 2: rank 0 is the first of two stages and holds no output layer
        assert saved["tp"] == 1 and saved["head_dtype"] is None
    assert (loaded["tp"], loaded["dp"], loaded["head_dtype"] is not None) == (1, 1, True)
    assert loaded["head_dtype"] == "torch.float32" and saved["body_dtype"] == loaded["body_dtype"] == "torch.bfloat16"
    after, resumed = saved["after"], loaded["resumed"]
    # the same FP32 state continues: equal within bf16 rounding of a different TP/PP split, far from the
    # control that loads the same weights with a fresh optimizer
    assert resumed["loss"] == pytest.approx(after["loss"], rel=2e-3)
    assert resumed["grad_norm"] == pytest.approx(after["grad_norm"], rel=2e-2)
    fresh = loaded["fresh_optimizer"]["loss"][1]
    assert abs(fresh - after["loss"][1]) > 10 * abs(resumed["loss"][1] - after["loss"][1])
    assert abs(fresh - after["loss"][1]) > 0.05


def test_adam_moments_and_main_weights_equal_after_the_reshard(runs):
    """Float64 fingerprints of every parameter's FP32 main weight and Adam moments, over the full
    parameter: at TP 2 (TP shards summed) right after the save, at TP 1 right after the load."""
    saved, loaded = runs["save_tp2do"]["moments"], runs["load_tp2do"]["moments"]
    assert set(saved) == set(loaded) and len(saved) > 5
    for name, (w2, m2, v2) in saved.items():
        assert m2 > 0 and v2 > 0, name  # real moments after 2 steps, not zeros
        assert loaded[name] == pytest.approx([w2, m2, v2], rel=1e-9), name


@pytest.mark.parametrize("layout", ["tp2do", "pp2do"])
def test_dp_reshardable_state_is_refused_under_another_layout_naming_the_key(runs, layout):
    msg = runs[f"load_{layout}"]["refused"]
    assert "dp_reshardable" in msg and "optim.checkpoint_format=fully_reshardable" in msg and "ckpt_" in msg
