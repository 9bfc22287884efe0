"""A reward function that raises was silent (every sample scored -1, every group dropped, the run
"succeeded" without a trained step). Scoring failures are counted in each step's metrics, per distinct error,
and the run stops with one line when a step's (or a validation's) samples all fail (`reward.stop_error_rate`).
The scripted engine (tests/support/scripted_loop.py) forces the interleaving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl_mega.inflight import RewardErrorStop
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.types import Prompt
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine

REPO = Path(__file__).resolve().parents[2]
B, G, STEPS = 2, 2, 3
KEY = "ValueError at my_reward.py:3"


def _cfg(tmp_path, *overrides):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", f"output_dir={tmp_path}", f"train.prompts_per_step={B}",
                    f"train.generations_per_prompt={G}", f"train.steps={STEPS}", "train.val_every=0",
                    "train.save_every=0", "metrics.tensorboard=false", "filter=none", *overrides], preflight=False)


def _run(tmp_path, reward_fn, *overrides, caplog=None):
    cfg = _cfg(tmp_path, *overrides)
    engine = ScriptedEngine()
    trainer = RecordingTrainer(engine)
    comps = LoopComponents(engine=engine, trainer=trainer, reward_fn=reward_fn, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2], stop_token_ids=[7])
    run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()], engine.log


def second_sample_raises(prompts, texts):
    """Sample 0 passes; sample 1's reward raised (the reason the pool gives it, rewards.result.error_result)."""
    return [(1.0, True, "exact") if t.startswith("\x01") else
            (-1.0, False, f"error: {KEY}: could not convert string to float: {t!r}") for t in texts]


def every_sample_raises(prompts, texts):
    return [(-1.0, False, f"error: {KEY}: could not convert string to float: {t!r}") for t in texts]


def test_errors_are_counted_per_step_and_per_distinct_error(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="scalerl_mega.loop"):
        rows, _ = _run(tmp_path, second_sample_raises)
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == STEPS
    for r in train:  # B groups x G samples, one of each group's two raised
        assert r["reward/errors"] == B and r["reward/error_rate"] == 0.5 and r["reward/timeouts"] == 0
        assert r["reward/errors_by_kind"] == {KEY: B}
    progress = [m.getMessage() for m in caplog.records if "step " in m.getMessage() and "reward errors" in m.getMessage()]
    assert len(progress) == STEPS and f"reward errors {B}/{B * G}" in progress[0]


def test_a_step_whose_samples_all_fail_stops_the_run_with_one_line(tmp_path):
    with pytest.raises(RewardErrorStop) as exc:
        _run(tmp_path, every_sample_raises)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"reward error: all {B * G} samples of step 1 failed to score, e.g. {KEY}: could not")
    assert "reward.stop_error_rate=null" in msg
    assert isinstance(exc.value, SystemExit)  # exits non-zero with the message, no traceback


def test_the_step_zero_validation_stops_first(tmp_path):
    with pytest.raises(RewardErrorStop, match=r"all 4 samples of a validation \(held-out prompts\) failed"):
        _run(tmp_path, every_sample_raises, "train.val_every=1", "data.val_samples=4")


def test_stop_error_rate_null_trains_on_and_a_lower_rate_stops_earlier(tmp_path):
    rows, log = _run(tmp_path / "null", every_sample_raises, "reward.stop_error_rate=null")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["reward/errors"] for r in train] == [B * G] * STEPS and [r["reward/error_rate"] for r in train] == [1.0] * 3
    with pytest.raises(RewardErrorStop, match=rf"{B} of {B * G} samples of step 1 .*stop_error_rate=0.5\)"):
        _run(tmp_path / "half", second_sample_raises, "reward.stop_error_rate=0.5")
