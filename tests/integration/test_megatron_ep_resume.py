"""save -> step -> load -> step at EP 2 with the distributed optimizer (tiny_qwen3_moe, full training, 2 gloo
ranks: dense parameters data-parallel over 2, experts over 1, two chained distributed optimizers): the step after
the load is bitwise the step after the save -- every FP32 main weight shard, Adam moment and per-parameter step
of both chained optimizers, and the logits -- whether the checkpoint is loaded back into the trained optimizer or
into a never-stepped one (worker: ep_resume_worker.py).

Megatron's distributed-optimizer load put one 'step' tensor shared by all parameters into torch Adam's state,
so the next step advanced it once per parameter (bias correction with t = 3, 4, ... instead of 2); the load
restores a step per parameter (`optimizer_state.restore_adam_step`)."""

from __future__ import annotations

import json
from pathlib import Path

import mp_launch
import pytest

pytestmark = [pytest.mark.compat, pytest.mark.timeout(900)]  # ~45 s of 2-rank Megatron: the compatibility leg
WORKER = Path(__file__).with_name("ep_resume_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep_resume")
    procs = mp_launch.start(WORKER, 2, ["--out", str(out)], logdir=out, log_name="ep_resume")
    mp_launch.wait(procs, logdir=out, log_name="ep_resume", what="ep_resume_worker", timeout=800)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_layout_is_ep2_dp2_with_two_chained_distributed_optimizers(ranks):
    for res in ranks:
        assert (res["ep"], res["dp"]) == (2, 2)
        assert res["subs"] == ["DistributedOptimizer", "DistributedOptimizer"]


def test_load_restores_the_saved_state_bitwise(ranks):
    for res in ranks:
        assert res["load_in_place_vs_save"] == {}  # the in-memory step 2 (and its moments) replaced by step 1's
        assert res["load_fresh_vs_save"] == {}
        assert res["second_step_vs_save"] > 0  # the comparison can fail: the second step changed the state


def test_step_after_load_in_place_is_bitwise_the_step_after_save(ranks):
    for res in ranks:
        assert res["in_place_metrics"] == res["ref_metrics"]
        assert res["in_place_vs_ref"] == {}
        assert res["in_place_logits_equal"]
        # Adam's t after two steps is 2 for every parameter, each with its own counter
        assert res["ref_steps"] == res["in_place_steps"] == [2.0]
        assert res["distinct_steps_in_place"] == res["params_per_sub"]


def test_step_after_load_into_a_fresh_optimizer_is_bitwise_the_step_after_save(ranks):
    for res in ranks:
        assert res["fresh_metrics"] == res["ref_metrics"]
        assert res["fresh_vs_ref"] == {}
        assert res["fresh_logits_equal"]
