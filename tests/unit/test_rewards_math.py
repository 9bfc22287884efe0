"""Math reward: a hand-written table of (completion, gold, expected) cases."""

from __future__ import annotations

import threading
import time

import pytest

import scalerl_mega.rewards.math as math_reward
from scalerl_mega.rewards.math import decide_without_verifier, last_boxed, percent_form, score_math, strip_thinking
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
    # percentages as math-verify decides them (grader: N% == N for integers, N% == N/100)
    (T + r"\boxed{50\%}", "50", True),
    (T + r"\boxed{50\%}", r"50\%", True),
    (T + r"\boxed{50}", r"50\%", True),
    (T + r"\boxed{0.5}", r"50\%", True),
    (T + r"\boxed{\frac{1}{2}}", "50%", True),
    (T + r"\boxed{49}", r"50\%", False),
    (T + r"\boxed{0.125}", r"12.5\%", True),
    (T + r"\boxed{12.5}", r"12.5\%", True),
    (T + r"\boxed{12.4}", r"12.5\%", False),
    (T + r"\boxed{50 percent}", r"50\%", True),
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
    # (20 s was once too short for a legit case's child on an oversubscribed machine, 2026-11-28)
    res = score_math(completion, gold, timeout_s=2.0 if adversarial else 120.0)
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
    assert last_boxed(r"\boxed{x} \boxed{unclosed {") == "x"  # a later unclosed box is skipped
    assert last_boxed(r"\boxed{1} } \fbox{2}") == "2"  # a stray closing brace is ignored
    assert last_boxed(r"{\boxed{1}") == "1"
    assert last_boxed(r"\boxed{\boxed{1}}") == "1"  # the inner box starts last
    assert last_boxed(r"\boxed{a} \boxed{b{") == "a"


def _reference_last_boxed(text: str) -> str | None:
    """The quadratic definition: try each opener from the last; return the first that closes."""
    import re

    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth = 1
        for i in range(m.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[m.end():i]
    return None


def test_last_boxed_matches_the_reference_on_random_brace_soup():
    import random

    rng = random.Random(0)
    alphabet = ["{", "}", "\\boxed{", "\\fbox {", "a", "1", " "]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert last_boxed(text) == _reference_last_boxed(text), text


class _CountingRe:
    """Wraps the token regex and counts the tokens `last_boxed` consumes."""

    def __init__(self, inner):
        self.inner, self.n = inner, 0

    def finditer(self, text):
        for m in self.inner.finditer(text):
            self.n += 1
            yield m


def test_last_boxed_is_one_pass_on_80kb_of_unclosed_boxes(monkeypatch):
    text = T + "\\boxed{" * (80_000 // 7) + "\\boxed{42}"
    counter = _CountingRe(math_reward._BOX_TOKEN_RE)
    monkeypatch.setattr(math_reward, "_BOX_TOKEN_RE", counter)
    assert last_boxed(text) == "42"
    # one token per opener and per closing brace: the whole text is visited exactly once
    assert counter.n == text.count("\\boxed{") + text.count("}")
    res = decide_without_verifier(text, "42")  # the in-process path of the pool
    assert res is not None and res.passed and res.reason == "fast_path"


def test_unclosed_boxes_decide_on_the_last_closed_box():
    text = T + "\\boxed{7} then " + "\\boxed{" * 12_000
    assert last_boxed(text) == "7"
    assert score_math(text, "7").passed


def test_percent_form():
    assert percent_form(r"50\%") == "50%" and percent_form("12.5 %") == "12.5%"
    assert percent_form(r"50\text{\%}") == "50%" and percent_form("7 percent") == "7%"
    assert percent_form("50") is None and percent_form(r"x\%") is None


@pytest.mark.parametrize("gold", [None, 42, 0.5, ["1"], "", "   "])
def test_non_string_gold_never_matches(gold):
    for comp in [T + r"\boxed{None}", T + r"\boxed{42}", T + r"\boxed{0.5}", T + r"\boxed{['1']}", T + r"\boxed{}"]:
        res = score_math(comp, gold)
        assert not res.passed and res.reason.startswith("bad_gold"), (comp, gold, res)


@pytest.mark.parametrize("completion,gold,expected", [c for c in CASES if "9^{9^{9^{9}}}" not in c[0]],
                         ids=[f"case{i}" for i, c in enumerate(CASES) if "9^{9^{9^{9}}}" not in c[0]])
def test_in_process_verification_decides_like_the_forked_one(completion, gold, expected):
    """`isolate=False` (what pool workers run) gives the table's verdicts without a fork."""
    res = score_math(completion, gold, timeout_s=20.0, isolate=False)
    assert res.passed is expected, res


def test_call_capped_turns_a_runaway_allocation_into_an_error_and_restores_the_limit():
    import resource

    from scalerl_mega.rewards.deadline import call_capped

    before = resource.getrlimit(resource.RLIMIT_AS)
    status, msg = call_capped(lambda: bytearray(512 * 2**20), extra_memory_mb=64)
    assert status == "error" and msg.startswith("MemoryError"), (status, msg)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert call_capped(lambda: len(bytearray(128 * 2**20)), extra_memory_mb=1024) == ("ok", 128 * 2**20)
