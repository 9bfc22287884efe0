"""Reward pool: per-item deadlines, crashing/hanging items, worker replacement, RewardFn dispatch."""

from __future__ import annotations

import os
import time

import pytest

from scalerl_mega.interfaces import RewardFn
from scalerl_mega.rewards.pool import RewardConfig, RewardPool, TaskRewardFn
from scalerl_mega.rewards.result import RewardResult
from scalerl_mega.types import Prompt


def chaos(item):
    """Test scoring function: item is (kind, value)."""
    kind, value = item
    if kind == "ok":
        return RewardResult(passed=value, reward=1.0 if value else -1.0, reason="ok")
    if kind == "hang":
        time.sleep(3600)
    if kind == "crash":
        os._exit(3)
    if kind == "raise":
        raise RuntimeError("boom")
    raise AssertionError(kind)


def short_deadline(item):
    return 1.0


def test_pool_survives_hangs_crashes_and_errors():
    items = [("ok", True), ("hang", None), ("ok", False), ("crash", None), ("raise", None), ("ok", True)]
    with RewardPool(num_workers=2, score_fn=chaos, deadline_fn=short_deadline, init_fn=None) as pool:
        res = pool.map(items)
        assert [r.passed for r in res] == [True, False, False, False, False, True]
        assert res[1].reason == "pool_timeout"
        assert res[3].reason.startswith("worker_died") and "3" in res[3].reason
        assert res[4].reason.startswith("error: RuntimeError at test_rewards_pool.py:") and res[4].reason.endswith(": boom")
        assert pool.replaced == 2
        # still usable afterwards
        assert [r.passed for r in pool.map([("ok", True)] * 5)] == [True] * 5


def test_task_reward_fn_dispatch():
    # deadlines far above any honest run time: this tests dispatch, and a loaded 2-core machine once took over
    # 5 s to run the code item's test (2026-11-28: three training runs beside the suite)
    fn = TaskRewardFn(RewardConfig(num_workers=2, code_time_limit_s=60.0, math_timeout_s=60.0))
    try:
        assert isinstance(fn, RewardFn)
        prompts = [
            Prompt(prompt_id="a", text="Q:1+2=", task="synthetic", gold="3"),
            Prompt(prompt_id="b", text="...", task="math", gold=r"\frac{1}{2}"),
            Prompt(prompt_id="c", text="...", task="code", gold=[{"input": "2\n", "output": "4\n"}]),
            Prompt(prompt_id="d", text="...", task="poetry", gold=""),
        ]
        texts = [
            "<think>1+2+0=3</think>\\boxed{3}",
            "<think>half</think>\\boxed{0.5}",
            "<think>ok</think>```python\nprint(int(input()) * 2)\n```",
            "roses",
        ]
        out = fn(prompts, texts)
        assert [o[1] for o in out] == [True, True, True, False]
        assert [o[0] for o in out] == [1.0, 1.0, 1.0, -1.0]
        assert "unknown_task" in out[3][2]
        with pytest.raises(ValueError, match="2 prompts but 1 texts"):
            fn(prompts[:2], texts[:1])
    finally:
        fn.close()


def test_power_tower_in_the_pool_is_stopped_at_the_item_deadline_and_the_pool_goes_on():
    """Pool workers verify in-process (no fork per item); a verification stuck in C code is stopped by
    the pool killing the worker at the item deadline, and the next items are scored by its replacement."""
    fn = TaskRewardFn(RewardConfig(num_workers=1, math_timeout_s=1.0))
    try:
        p = Prompt(prompt_id="a", text="Q", task="math", gold="5")
        t0 = time.monotonic()
        out = fn([p, p], ["<think>x</think>\\boxed{9^{9^{9^{9}}}}", "<think>x</think>\\boxed{\\frac{10}{2}}"])
        assert out[0] == (-1.0, False, "pool_timeout") and out[1] == (1.0, True, "math_verify")
        assert time.monotonic() - t0 < 120  # generous: the point is that it returns at all
    finally:
        fn.close()


def raise_value_error(item):
    value = float(item)  # the user's `return float(completion)`, a common bug
    return RewardResult(passed=value > 0, reward=value, reason="parsed")


def test_a_raising_score_fn_reports_type_place_and_traceback_and_logs_each_distinct_error_once(caplog):
    """A reward that raises was silent (every sample -1, no line anywhere). The reason names the
    exception and where it was raised; the pool logs the first traceback of each distinct error only."""
    import logging

    from scalerl_mega.rewards.result import error_key

    line = raise_value_error.__code__.co_firstlineno + 1
    with caplog.at_level(logging.ERROR, logger="scalerl_mega.rewards"):
        with RewardPool(num_workers=1, score_fn=raise_value_error, deadline_fn=lambda _: 60.0, init_fn=None) as pool:
            res = pool.map(["1.5x", "abc", "2"])
            again = pool.map(["zz"])
            fine = pool.map(["3"])
    assert res[0].reason == f"error: ValueError at test_rewards_pool.py:{line}: could not convert string to float: '1.5x'"
    assert res[0].reward != res[0].reward and not res[0].passed  # NaN: the RewardFn turns it into `incorrect`
    assert "Traceback (most recent call last)" in res[0].detail and "value = float(item)" in res[0].detail
    assert (res[2].reason, res[2].reward, res[2].detail) == ("parsed", 2.0, "")
    assert error_key(res[1].reason) == error_key(again[0].reason) == f"ValueError at test_rewards_pool.py:{line}"
    logged = [r for r in caplog.records if r.name == "scalerl_mega.rewards"]
    assert len(logged) == 1, [r.getMessage() for r in logged]  # 3 errors of one kind: one traceback
    assert "'1.5x'" in logged[0].getMessage() and "value = float(item)" in logged[0].getMessage()
    assert fine[0].reward == 3.0 and len(logged) == 1


def test_error_key_distinguishes_scoring_failures_from_verdicts():
    from scalerl_mega.rewards.result import error_key

    assert error_key("error: KeyError at my_reward.py:12: 'answer'") == "KeyError at my_reward.py:12"
    assert error_key("worker_died: exitcode -11") == "worker died"
    for verdict in ("pool_timeout", "exact", "math_verify", "test0: wrong_answer (0/3)", "custom", ""):
        assert error_key(verdict) is None
