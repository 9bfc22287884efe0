"""`metrics.max_logprob_mismatch` (metrics/alarms.py `MismatchGuard`) in the RL loop: a step whose
`train/onpolicy_abs_log_ratio_max` exceeds the threshold warns (warn), or ends the run before that step
can be checkpointed (stop: SystemExit with the message; assert: AssertionError, which also fires at the
end of a run that never had an on-policy token to check). The loop runs with the scripted engine of
test_loop_phases.py and a trainer whose metrics are scripted per step."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from test_loop_phases import STEPS, Sampler, ScriptedEngine, _cfg, reward  # same directory (pytest rootdir import)

from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.alarms import LogprobMismatchStop, LogprobMismatchWarning, MismatchGuard
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.types import Prompt

MAX_BY_STEP = [0.01, 3.0, 2.0, 0.02]  # steps 1..4: one excursion above 0.5 (steps 2 and 3)


class ScriptedTrainer:
    """Returns each step's on-policy mismatch from `maxima` (None: no on-policy token); records saves."""

    def __init__(self, maxima):
        self.maxima, self.step, self.saved_steps = list(maxima), 0, []

    def train_step(self, batch):
        value = self.maxima[self.step]
        self.step += 1
        if value is None:
            return {"loss": 0.0}
        return {"loss": 0.0, "onpolicy_abs_log_ratio_max": value, "onpolicy_abs_log_ratio_mean": value / 4,
                "onpolicy_tokens": 8.0}

    def export_hf_weights(self, *, dtype=None):
        return iter(())

    def save(self, path, *, step=None, extra_state=None):
        assert step == extra_state["loop"]["step"]  # the checkpoint is named by the loop's step
        self.saved_steps.append(step)

    def load(self, path):
        raise AssertionError("no checkpoint expected")


def _run(tmp_path, trainer, *overrides):
    cfg = _cfg(tmp_path, "train.save_every=1", "train.val_every=0", *overrides)
    comps = LoopComponents(engine=ScriptedEngine(), trainer=trainer, reward_fn=reward, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2],
                           stop_token_ids=[7])
    return run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))


def _train_records(tmp_path):
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "train"]


def test_stop_mode_ends_the_run_before_checkpointing_the_offending_step(tmp_path):
    trainer = ScriptedTrainer(MAX_BY_STEP)
    with pytest.raises(LogprobMismatchStop) as exc:
        _run(tmp_path, trainer, "metrics.max_logprob_mismatch=0.5")
    msg = str(exc.value)
    assert "step 2" in msg and "train/onpolicy_abs_log_ratio_max=3 exceeds metrics.max_logprob_mismatch=0.5" in msg
    assert isinstance(exc.value, SystemExit) and exc.value.code == msg  # uncaught: exit status 1, msg on stderr
    assert trainer.saved_steps == [1]  # the newest checkpoint predates the offending step
    recs = _train_records(tmp_path)
    assert [r["step"] for r in recs] == [1, 2]  # the offending step's metrics are logged
    assert recs[1]["train/onpolicy_abs_log_ratio_max"] == 3.0


def test_assert_mode_raises_at_the_offending_step_and_when_nothing_was_checked(tmp_path):
    trainer = ScriptedTrainer(MAX_BY_STEP)
    with pytest.raises(AssertionError, match=r"step 2: .*exceeds metrics\.max_logprob_mismatch=0\.5"):
        _run(tmp_path / "a", trainer, "metrics.max_logprob_mismatch=0.5", "metrics.mismatch_mode=assert")
    assert trainer.saved_steps == [1]
    # a CI run whose check never saw an on-policy token fails at its end instead of passing vacuously
    trainer = ScriptedTrainer([None] * STEPS)
    with pytest.raises(AssertionError, match=r"checked no step"):
        _run(tmp_path / "b", trainer, "metrics.max_logprob_mismatch=0.5", "metrics.mismatch_mode=assert")
    assert trainer.saved_steps == [1, 2, 3, 4]


def test_warn_mode_warns_once_per_excursion_and_off_never_checks(tmp_path):
    trainer = ScriptedTrainer(MAX_BY_STEP)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = _run(tmp_path / "a", trainer, "metrics.max_logprob_mismatch=0.5", "metrics.mismatch_mode=warn")
    fired = [w for w in caught if issubclass(w.category, LogprobMismatchWarning)]
    assert state.step == STEPS and len(fired) == 1 and "step 2" in str(fired[0].message)
    state = _run(tmp_path / "b", ScriptedTrainer([9.0] * STEPS))  # threshold None (default): no check
    assert state.step == STEPS


def test_guard_unit_rules():
    guard = MismatchGuard(1.0, "warn")
    assert not guard.check(step=1, metrics={"train/loss": 0.0})  # no on-policy token: nothing checked
    assert guard.checked_steps == 0
    with pytest.warns(LogprobMismatchWarning):
        assert guard.check(step=2, metrics={"train/onpolicy_abs_log_ratio_max": float("nan")})  # NaN fires
    assert not guard.check(step=3, metrics={"train/onpolicy_abs_log_ratio_max": 1.0})  # at the threshold: ok
    with pytest.raises(ValueError, match=r"metrics\.mismatch_mode='halt'"):
        MismatchGuard(1.0, "halt")
    with pytest.raises(ValueError, match=r"metrics\.max_logprob_mismatch=-1"):
        MismatchGuard(-1, "stop")


def test_uncaught_stop_exits_nonzero_with_the_message():
    code = "from scalerl_mega.metrics.alarms import LogprobMismatchStop; raise LogprobMismatchStop('mismatch 3 > 0.5')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "mismatch 3 > 0.5" in proc.stderr
