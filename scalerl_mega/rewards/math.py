"""Math answer reward (paper Sec. 2 "Training Regimen", App. A.3).

Pipeline for one completion:
1. Strip the thinking trace: the answer is the text after the last `</think>`. A completion without
   `</think>` was truncated (or never closed its thoughts) and is incorrect.
2. Extract the final answer: the content of the last `\\boxed{...}` (or `\\fbox{...}`); without a box,
   math-verify's own extraction runs on the answer text unless `require_boxed`.
3. Fast path: normalized string equality, or two plain integers/decimals compared exactly, decides
   without sympy. Two different plain integers are decided incorrect; everything else that is not
   an exact match goes to math-verify.
4. math-verify (`parse` + `verify`) in a forked child with a hard deadline (see `deadline.py`), so
   adversarial input such as power towers is scored incorrect within `timeout_s`. Percentages are
   handed to math-verify in the plain `N%` form it can decide (`percent_form`). Inside a `RewardPool`
   worker (`isolate=False`) it runs in the worker itself under the same memory cap: the pool kills the
   worker at the item's hard deadline, so the per-call fork (~20-100x the verification) is not needed.

Steps 1-3 run in the caller's process and are linear-time string work (`last_boxed` is one pass);
anything that may be super-linear (sympy, math-verify's regexes) runs only under the deadline of step 4.
A gold that is not a non-empty string is incorrect ("bad_gold"); the data loader rejects such rows.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

from scalerl_mega.rewards.deadline import call_capped, call_in_child
from scalerl_mega.rewards.result import RewardResult, RewardValues

THINK_CLOSE = "</think>"
_INT_RE = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")
_DEC_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)")
_MAX_ANSWER_CHARS = 2000


def strip_thinking(completion: str) -> str | None:
    """The text after the last `</think>`, or None if the trace was never closed."""
    idx = completion.rfind(THINK_CLOSE)
    if idx < 0:
        return None
    return completion[idx + len(THINK_CLOSE) :]


_BOX_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
"""One token per box opener or brace: `last_boxed` is a single pass over these."""


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, or None.

    "Last" is the closed box that starts last (a later unclosed box is skipped). One pass over the
    brace tokens with a stack of open braces (box openers marked), so it is linear in `len(text)`
    however many `\\boxed{` are left unclosed.
    """
    stack: list[int] = []  # content start of a box opener, or -1 for a plain brace
    best: tuple[int, int] | None = None
    for m in _BOX_TOKEN_RE.finditer(text):
        tok = m.group()
        if tok == "}":
            if stack:
                start = stack.pop()
                if start >= 0 and (best is None or start > best[0]):
                    best = (start, m.start())
        else:
            stack.append(m.end() if tok != "{" else -1)
    return None if best is None else text[best[0] : best[1]]


def normalize_answer(s: str) -> str:
    """Light, meaning-preserving normalization used only for the exact-match fast path."""
    s = s.strip().strip("$").strip()
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\displaystyle"):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def _plain_number(s: str) -> Fraction | None:
    if _INT_RE.fullmatch(s):
        return Fraction(int(s.replace(",", "")))
    if _DEC_RE.fullmatch(s):
        return Fraction(s)
    return None


def fast_path(answer: str, gold: str) -> bool | None:
    """Decide without sympy when the decision is certain; None means "ask math-verify"."""
    a, g = normalize_answer(answer), normalize_answer(gold)
    if not a:
        return False
    if a == g:
        return True
    na, ng = _plain_number(a), _plain_number(g)
    if na is not None and ng is not None:
        if na == ng:
            return True
        if _INT_RE.fullmatch(a) and _INT_RE.fullmatch(g):
            return False  # two different integers: no equivalence math-verify could find
    return None


_PCT_RE = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\\?percent)")


def percent_form(s: str) -> str | None:
    """`"N%"` when `s` is a plain number with a percent sign (`50\\%`, `50%`, `50\\text{\\%}`,
    `50 percent`), else None. math-verify only understands percentages in this plain form (its
    extractor turns `N%` into `N * 1/100`, and its grader then accepts both `N` and `N/100`); inside
    `\\boxed{}` its LaTeX parser drops the number, so both sides are rewritten before parsing."""
    m = _PCT_RE.fullmatch(normalize_answer(s))
    return None if m is None else f"{m.group(1)}%"


def _math_verify(answer_text: str, gold: str, boxed: bool) -> bool:
    """Runs in the child process: math-verify's own signal timeouts are disabled (we kill instead)."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    pct = percent_form(gold)
    gold_parsed = parse(pct, parsing_timeout=None) if pct else parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    if not gold_parsed:
        gold_parsed = parse(gold, parsing_timeout=None)
    pct = percent_form(answer_text) if boxed else None
    pred = pct or (f"\\boxed{{{answer_text}}}" if boxed else answer_text)
    pred_parsed = parse(pred, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


@functools.cache
def _warm_up() -> None:
    """Import math-verify and fill its lazy caches (LaTeX grammar, sympy) once per process, so that
    each forked child starts warm: ~15 ms per verification instead of ~130 ms."""
    _math_verify("\\frac{1}{2}+x^2", "0.5", True)


def _prepare(completion: str, gold: str, *, rewards: RewardValues, require_think: bool, require_boxed: bool,
             use_fast_path: bool) -> tuple[RewardResult | None, str, bool]:
    """Steps 1-3: (decided result or None, answer candidate, whether it came from a box)."""
    if not isinstance(gold, str) or not gold.strip():
        # the data loader rejects these at load time; never let `str(None)` match `\\boxed{None}`
        return rewards.result(False, f"bad_gold: {type(gold).__name__}"), "", False
    if require_think:
        answer_text = strip_thinking(completion)
        if answer_text is None:
            return rewards.result(False, "unclosed_think"), "", False
    else:
        stripped = strip_thinking(completion)
        answer_text = completion if stripped is None else stripped
    boxed = last_boxed(answer_text)
    if boxed is None and require_boxed:
        return rewards.result(False, "no_boxed"), "", False
    candidate = boxed if boxed is not None else answer_text
    if len(candidate) > _MAX_ANSWER_CHARS:
        return rewards.result(False, "answer_too_long"), "", False
    if not candidate.strip():
        return rewards.result(False, "empty_answer"), "", False
    if use_fast_path and boxed is not None:
        decided = fast_path(candidate, gold)
        if decided is not None:
            return rewards.result(decided, "fast_path"), candidate, True
    return None, candidate, boxed is not None


def decide_without_verifier(
    completion: str,
    gold: str,
    *,
    rewards: RewardValues = RewardValues(),
    require_think: bool = True,
    require_boxed: bool = False,
) -> RewardResult | None:
    """The result of `score_math` when it is decided without math-verify (string work only, safe to
    run in the caller's process), else None."""
    decided, _, _ = _prepare(completion, gold, rewards=rewards, require_think=require_think,
                             require_boxed=require_boxed, use_fast_path=True)
    return decided


def score_math(
    completion: str,
    gold: str,
    *,
    timeout_s: float = 5.0,
    rewards: RewardValues = RewardValues(),
    require_think: bool = True,
    require_boxed: bool = False,
    use_fast_path: bool = True,
    isolate: bool = True,
) -> RewardResult:
    """Score a math completion against the gold answer (paper App. A.3; rewards default to +/-1).

    `require_think=False` scores completions with no `</think>` on their full text (for models that
    do not think); `require_boxed=True` makes an answer without `\\boxed{}` incorrect.
    `isolate=False` runs math-verify in this process without a deadline (`timeout_s` unused): only for
    callers that are killed at a hard deadline themselves (`RewardPool` workers).
    """
    decided, candidate, boxed = _prepare(completion, gold, rewards=rewards, require_think=require_think,
                                         require_boxed=require_boxed, use_fast_path=use_fast_path)
    if decided is not None:
        return decided
    _warm_up()
    if isolate:
        status, value = call_in_child(_math_verify, candidate, gold, boxed, timeout_s=timeout_s)
    else:
        status, value = call_capped(_math_verify, candidate, gold, boxed)
    if status == "ok":
        return rewards.result(bool(value), "math_verify")
    if status == "timeout":
        return rewards.result(False, "timeout")
    return rewards.result(False, f"verifier_{status}: {value}")
