"""Code reward: run Deepcoder-style tests against the program in the completion (paper App. A.3).

Tests are `{"input": str, "output": str}` (program reads stdin, its stdout is compared) or
`{"fn_name": str, "args": list, "expected": Any}` (a named function, or a method of a LeetCode-style
`Solution` class, is called). Every run happens in `sandbox.run_python`. The expected values never
enter the sandbox. Reward: +1 if all tests pass, else -1 (configurable); with `partial_credit`
the reward interpolates by the fraction of tests passed (`passed` still means all passed).
"""

from __future__ import annotations

import functools
import json
import math
import re
import secrets
from collections.abc import Callable, Sequence

from scalerl_mega.jsonvalue import normalize_tests
from scalerl_mega.rewards.math import strip_thinking
from scalerl_mega.rewards.result import RewardResult, RewardValues
from scalerl_mega.rewards.sandbox import Isolation, RunResult, SandboxLimits, run_python

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

_FN_HARNESS = r'''
import json, sys
_cfg = json.loads(sys.stdin.read())
_mark = _cfg["mark"]
_out = sys.stdout
_ns = {"__name__": "__solution__"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), _ns)
except BaseException as e:
    _out.write(_mark + json.dumps({"ok": False, "error": "load: " + type(e).__name__}) + "\n")
    raise SystemExit(1)
for _call in _cfg["calls"]:
    _fn = _ns.get(_call["fn_name"])
    if _fn is None and isinstance(_ns.get("Solution"), type):
        _fn = getattr(_ns["Solution"](), _call["fn_name"], None)
    try:
        if _fn is None:
            raise NameError(_call["fn_name"])
        _res = {"ok": True, "value": _fn(*_call["args"])}
        _line = json.dumps(_res)
    except BaseException as e:
        _line = json.dumps({"ok": False, "error": type(e).__name__})
    _out.write(_mark + _line + "\n")
    _out.flush()
'''


def extract_code(completion: str, *, require_think: bool = True) -> str | None:
    """The last fenced code block after the thinking trace, or None."""
    text = strip_thinking(completion)
    if text is None:
        if require_think:
            return None
        text = completion
    blocks = _FENCE_RE.findall(text)
    return blocks[-1] if blocks else None


def _tokens_match(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        fa, fb = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(fa, fb, rel_tol=1e-6, abs_tol=1e-6)


def stdout_matches(got: str, expected: str) -> bool:
    """Line-wise equality ignoring trailing whitespace and trailing blank lines; otherwise
    token-wise equality with a 1e-6 tolerance on numbers."""
    g = [ln.rstrip() for ln in got.strip().splitlines()]
    e = [ln.rstrip() for ln in expected.strip().splitlines()]
    if g == e:
        return True
    gt, et = got.split(), expected.split()
    return len(gt) == len(et) and all(_tokens_match(x, y) for x, y in zip(gt, et))


def values_match(got: object, expected: object) -> bool:
    """JSON-value equality (tuples as lists) with a 1e-6 tolerance on floats."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected or got == expected and type(got) is type(expected)
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return got == expected


def _failure_reason(r: RunResult) -> str:
    if r.timed_out:
        return "timeout"
    if r.output_overflow:
        return "output_limit"
    if r.returncode != 0:
        tail = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"exit_{r.returncode}: {tail[0][:120]}"
    return "wrong_answer"


def _run_stdin_tests(code: str, tests: Sequence[dict], *, run: Callable[..., RunResult], stop_early: bool
                     ) -> tuple[int, str]:
    passed, reason = 0, ""
    for i, t in enumerate(tests):
        r = run({"solution.py": code}, ["solution.py"], stdin=t["input"].encode())
        if r.returncode == 0 and not r.timed_out and not r.output_overflow and stdout_matches(
            r.stdout.decode(errors="replace"), t["output"]
        ):
            passed += 1
        else:
            reason = reason or f"test{i}: {_failure_reason(r)}"
            if stop_early:
                break
    return passed, reason


def _run_fn_tests(code: str, tests: Sequence[dict], *, run: Callable[..., RunResult]) -> tuple[int, str]:
    mark = "@@" + secrets.token_hex(8) + "@@"
    cfg = {"mark": mark, "calls": [{"fn_name": t["fn_name"], "args": t["args"]} for t in tests]}
    r = run({"solution.py": code, "harness.py": _FN_HARNESS}, ["harness.py"], stdin=json.dumps(cfg).encode())
    results = []
    for line in r.stdout.decode(errors="replace").splitlines():
        if line.startswith(mark):
            try:
                results.append(json.loads(line[len(mark):]))
            except json.JSONDecodeError:
                results.append({"ok": False, "error": "bad_json"})
    passed, reason = 0, ""
    for i, t in enumerate(tests):
        res = results[i] if i < len(results) else None
        if res is not None and res.get("ok") and values_match(res.get("value"), t["expected"]):
            passed += 1
        elif not reason:
            if res is None:
                reason = f"test{i}: {_failure_reason(r) if (r.timed_out or r.output_overflow or r.returncode) else 'no_result'}"
            else:
                reason = f"test{i}: {res.get('error', 'wrong_answer')}"
    return passed, reason


def score_code(
    completion: str,
    tests: list[dict] | str,
    *,
    time_limit_s: float = 5.0,
    memory_mb: int = 512,
    rewards: RewardValues = RewardValues(),
    partial_credit: bool = False,
    require_think: bool = True,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    isolation: Isolation | str | None = None,
    scratch_mb: int = 64,
    hide_paths: Sequence[str] = (),
) -> RewardResult:
    """Score the last fenced code block of `completion` on `tests` (limits apply per run).

    `hide_paths` are masked inside the sandbox on top of its deny-by-default view (see `sandbox`)."""
    code = extract_code(completion, require_think=require_think)
    if code is None:
        return rewards.result(False, "unclosed_think" if strip_thinking(completion) is None and require_think
                              else "no_code_block")
    try:
        norm = normalize_tests(tests)
    except ValueError as e:
        return rewards.result(False, f"bad_tests: {e}")
    if not norm:
        return rewards.result(False, "no_tests")
    limits = SandboxLimits(time_limit_s=time_limit_s, memory_mb=memory_mb, max_processes=max_processes,
                           max_output_bytes=max_output_bytes, scratch_mb=scratch_mb)
    iso = None if isolation is None else Isolation(isolation)
    run = functools.partial(run_python, limits=limits, isolation=iso, hide_paths=tuple(hide_paths))
    stdin_tests = [t for t in norm if "input" in t]
    fn_tests = [t for t in norm if "fn_name" in t]
    n_pass, reasons = 0, []
    if stdin_tests:
        p, why = _run_stdin_tests(code, stdin_tests, run=run, stop_early=not partial_credit)
        n_pass += p
        reasons.append(why)
    if fn_tests and (partial_credit or n_pass == len(stdin_tests)):
        p, why = _run_fn_tests(code, fn_tests, run=run)
        n_pass += p
        reasons.append(why)
    frac = n_pass / len(norm)
    all_pass = n_pass == len(norm)
    reason = "all_passed" if all_pass else next(r for r in reasons if r)
    if partial_credit:
        reward = rewards.incorrect + (rewards.correct - rewards.incorrect) * frac
        return RewardResult(passed=all_pass, reward=reward, reason=f"{reason} ({n_pass}/{len(norm)})")
    return rewards.result(all_pass, reason)
