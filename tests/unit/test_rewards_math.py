"""Math reward: a hand-written table of (completion, gold, expected) cases (issue 5 acceptance)."""

from __future__ import annotations

import threading
import time

import pytest

from scalerl_mega.rewards.math import last_boxed, score_math, strip_thinking
from scalerl_mega.rewards.result import RewardValues

T = "<think>some reasoning</think>"

# (completion, gold, expected_pass)
CASES = [
    # plain integers / fast path
    (T + r"The answer is \boxed{85}", "85", True),
    (T + r"\boxed{85}", "58", False),
    (T + r"\boxed{ 85 }", "85", True),
    (T + r"\boxed{-3}", "-3", True),
    (T + r"\boxed{-3}", "3", False),
    (T + r"\boxed{1,000}", "1000", True),
    (T + r"\boxed{007}", "7", True),
    # fractions / decimals
    (T + r"\boxed{\frac{1}{2}}", "0.5", True),
    (T + r"\boxed{0.5}", r"\frac{1}{2}", True),
    (T + r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", True),
    (T + r"\boxed{6/8}", r"\frac{3}{4}", True),
    (T + r"\boxed{0.75}", "3/4", True),
    (T + r"\boxed{0.76}", "3/4", False),
    (T + r"\boxed{2.50}", "2.5", True),
    (T + r"\boxed{\frac{2}{3}}", r"\frac{3}{2}", False),
    # LaTeX expressions
    (T + r"\boxed{\sqrt{8}}", r"2\sqrt{2}", True),
    (T + r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (T + r"\boxed{\sqrt{2}}", r"\sqrt{3}", False),
    (T + r"\boxed{\pi}", r"\pi", True),
    (T + r"\boxed{2\pi}", r"\pi", False),
    (T + r"\boxed{x^2+2x+1}", r"(x+1)^2", True),
    (T + r"\boxed{x^2+1}", r"(x+1)^2", False),
    (T + r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", True),
    (T + r"\boxed{\frac{\pi}{2}}", r"\pi/2", True),
    (T + r"\boxed{10^{3}}", "1000", True),
    (T + r"\boxed{x=3}", "3", True),
    (T + r"\boxed{50\%}", "50", False),  # math-verify: 50% means 0.5, not 50
    (T + r"\boxed{50\%}", r"50\%", True),
    # sets, tuples, intervals
    (T + r"\boxed{\{1,2,3\}}", r"\{3,2,1\}", True),
    (T + r"\boxed{\{1,2\}}", r"\{1,2,3\}", False),
    (T + r"\boxed{[1,2)}", r"[1,2)", True),
    (T + r"\boxed{(1,2]}", r"[1,2)", False),
    (T + r"\boxed{(-\infty, 3)}", r"(-\infty,3)", True),
    (T + r"\boxed{(1,2)}", r"(1,2)", True),
    # answer extraction: last box wins, nested braces, no box
    (T + r"First \boxed{3}, then corrected: \boxed{4}", "4", True),
    (T + r"First \boxed{4}, then corrected: \boxed{3}", "4", False),
    (T + r"\boxed{\frac{1}{\frac{1}{2}}}", "2", True),
    (T + r"The final answer is $7$.", "7", True),
    (T + "no answer here at all", "7", False),
    # thinking trace handling
    (r"<think>the answer is \boxed{5}</think>the answer is \boxed{6}", "6", True),
    (r"<think>the answer is \boxed{6}</think>\boxed{5}", "6", False),
    (r"<think>I think it is \boxed{6} but I ran out of tokens", "6", False),
    (r"\boxed{6}", "6", False),
    (T + r"\boxed{}", "6", False),
    # adversarial: power tower must time out -> incorrect
    (T + r"\boxed{9^{9^{9^{9}}}}", "5", False),
]


def test_table_has_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("completion,gold,expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_math_table(completion, gold, expected):
    # Legit cases get a generous deadline (CI runs this on 2 loaded cores); the adversarial power tower
    # keeps a short one and must still come back incorrect within it.
    adversarial = "9^{9^{9^{9}}}" in completion
    res = score_math(completion, gold, timeout_s=2.0 if adversarial else 20.0)
    assert res.passed is expected, res
    assert res.reward == (1.0 if expected else -1.0)


def test_power_tower_is_stopped_by_the_deadline():
    t0 = time.monotonic()
    res = score_math(T + r"\boxed{9^{9^{9^{9}}}}", "5", timeout_s=1.0)
    assert (res.passed, res.reason) == (False, "timeout")
    assert time.monotonic() - t0 < 30  # generous: the point is that it returns at all


def test_reasons_and_configurable_rewards():
    vals = RewardValues(correct=1.0, incorrect=0.0)
    assert score_math("<think>unfinished", "1", rewards=vals).reason == "unclosed_think"
    assert score_math("<think>unfinished", "1", rewards=vals).reward == 0.0
    assert score_math(T + r"\boxed{2}", "2", rewards=vals).reward == 1.0
    assert score_math(T + "2", "2", require_boxed=True).reason == "no_boxed"
    # models that do not think: score the full text
    assert score_math(r"\boxed{2}", "2", require_think=False).passed
    with pytest.raises(ValueError, match="correct"):
        RewardValues(correct=0.0, incorrect=0.0)


def test_fast_path_and_math_verify_agree():
    # the same pair decided by both routes
    for comp, gold in [(r"\boxed{12}", "12"), (r"\boxed{12}", "13"), (r"\boxed{2.50}", "2.5")]:
        a = score_math(T + comp, gold, use_fast_path=True)
        b = score_math(T + comp, gold, use_fast_path=False)
        assert a.passed == b.passed
        assert b.reason == "math_verify"


def test_works_from_a_non_main_thread():
    # math-verify's own signal-based timeout raises outside the main thread; ours must not
    out = {}

    def run():
        out["r"] = score_math(T + r"\boxed{\frac{1}{2}}", "0.5", timeout_s=5.0)

    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    assert out["r"].passed and out["r"].reason == "math_verify"


def test_helpers():
    assert strip_thinking("<think>a</think>b</think>c") == "c"
    assert strip_thinking("<think>a") is None
    assert last_boxed(r"\boxed{a{b}c} \boxed{d}") == "d"
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert last_boxed(r"\boxed{unbalanced") is None
