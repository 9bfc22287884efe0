"""The `reward` Hydra group reaches the RewardFn; custom `_target_` rewards run in the worker pool."""

from __future__ import annotations

import time

import pytest

from scalerl_mega.types import Prompt


def hangs(completion, gold):
    """A custom reward that never returns (the pool's deadline must kill it)."""
    time.sleep(3600)


def raises(completion, gold):
    raise RuntimeError("boom")


def _prompt(gold: str, task: str = "math") -> Prompt:
    return Prompt(prompt_id=f"p{gold}", text="q", task=task, gold=gold)


def _reward_fn(*overrides):
    from test_hf_model_config import _compose

    from scalerl_mega.build import build_reward_fn
    from scalerl_mega.compose import prepare

    return build_reward_fn(prepare(_compose("experiment=demo", *overrides)))


def test_require_think_and_workers_come_from_the_group():
    strict = _reward_fn()
    loose = _reward_fn("reward.require_think=false", "reward.num_workers=2", "reward.correct=2.0")
    try:
        text = "the answer is \\boxed{7}"  # no </think>
        assert strict([_prompt("7")], [text])[0][:2] == (-1.0, False)
        assert loose([_prompt("7")], [text])[0][:2] == (2.0, True)
        assert len(strict._pool._workers) == 1 and len(loose._pool._workers) == 2
        assert loose.config.require_think is False
    finally:
        strict.close()
        loose.close()


def test_custom_example_reward_in_pool():
    fn = _reward_fn("reward=custom_example", "reward.custom.length_penalty=1.0")
    try:
        out = fn([_prompt("8"), _prompt("8"), _prompt("8")], ["so 3 + 5 = 8", "I think 9", "no number"])
    finally:
        fn.close()
    # reward = +-1 - 1.0 * len/100, passed when the last number equals gold
    assert [o[1] for o in out] == [True, False, False]
    assert out[0][0] == pytest.approx(1.0 - 12 / 100) and out[1][0] == pytest.approx(-1.0 - 9 / 100)
    assert out[2][0] == pytest.approx(-1.0 - 9 / 100) and out[0][2] == "custom"


def test_custom_reward_deadline_and_errors_score_incorrect():
    from scalerl_mega.rewards.custom import CustomRewardFn, RewardSettings

    fn = CustomRewardFn(RewardSettings(custom={"_target_": f"{__name__}.hangs"}, item_timeout_s=1.0, incorrect=-3.0))
    try:
        assert fn([_prompt("1")], ["x"]) == [(-3.0, False, "pool_timeout")]
        assert fn._pool.replaced == 1
    finally:
        fn.close()
    fn = CustomRewardFn(RewardSettings(custom={"_target_": f"{__name__}.raises"}))
    try:
        reward, passed, reason = fn([_prompt("1")], ["x"])[0]
        assert (reward, passed) == (-1.0, False) and reason.startswith("error: RuntimeError at test_reward_group.py:")
        assert reason.endswith(": boom")
    finally:
        fn.close()


@pytest.mark.parametrize("override, match", [
    ("reward.custom={_target_: no.such.module.fn}", r"reward.custom._target_='no.such.module.fn': cannot import"),
    ("reward.custom={foo: 1}", r"reward.custom=.*must be a mapping with _target_"),
    ("reward.num_workers=0", r"reward.num_workers must be >= 1, got 0"),
    ("reward.item_timeout_s=0", r"reward.item_timeout_s=0.0 must be > 0"),
    ("reward.stop_error_rate=0", r"reward.stop_error_rate=0.0 must be in \(0, 1\] \(or null: never stop\)"),
    ("reward.stop_error_rate=1.5", r"reward.stop_error_rate=1.5 must be in \(0, 1\]"),
])
def test_reward_errors_at_compose_time(override, match):
    from test_hf_model_config import _compose

    from scalerl_mega.compose import prepare

    with pytest.raises(ValueError, match=match):
        prepare(_compose("experiment=demo", override))


def test_custom_reward_module_not_importable_names_pythonpath():
    """A module of the user's own that the run cannot import gets the PYTHONPATH hint; a missing
    attribute of an importable module does not."""
    from scalerl_mega.rewards.custom import resolve_target

    with pytest.raises(ValueError) as e:
        resolve_target("my_scoring_pkg_59.score")
    assert str(e.value) == (
        "reward.custom._target_='my_scoring_pkg_59.score': cannot import it (No module named 'my_scoring_pkg_59'); "
        "a module of your own must be importable where the run starts: put the directory holding my_scoring_pkg_59/ "
        "or my_scoring_pkg_59.py on PYTHONPATH (PYTHONPATH=/path/to/dir scalerl-train ...) or pip install it")
    with pytest.raises(ValueError) as e:
        resolve_target("scalerl_mega.rewards.examples.no_such_fn")
    assert "PYTHONPATH" not in str(e.value)
