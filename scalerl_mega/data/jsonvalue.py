"""Strict JSON values for dataset rows: finite numbers, valid Unicode, bounded nesting.

Python's `json` accepts `NaN` / `Infinity`, turns `1e400` into `inf`, raises a bare ValueError on
integers over 4300 digits and RecursionError on very deep nesting, and lets lone surrogates
(`"\\ud800"`) through into `str` values that later fail to encode. `loads_strict` and `check_value`
turn each of these into a `BadValue` with a short reason and a `kind` for per-reason counts.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of lists/dicts accepted in a row (tests of real datasets nest < 10 deep)."""


class BadValue(ValueError):
    """A value that cannot be loaded faithfully; `kind` is a short machine-readable reason."""

    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind


def _bad_constant(name: str) -> float:
    raise BadValue("bad_number", f"non-finite number {name}")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise BadValue("bad_number", f"number {text[:40]} is out of range")
    return v


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # over sys.get_int_max_str_digits()
        raise BadValue("bad_number", f"integer with {len(text)} digits is too large") from None


def loads_strict(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` that raises BadValue (kinds: bad_json, bad_number, too_deep, bad_unicode)."""
    try:
        value = json.loads(text, parse_constant=_bad_constant, parse_float=_finite_float, parse_int=_int)
    except RecursionError:
        raise BadValue("too_deep", f"nesting deeper than {max_depth}") from None
    except json.JSONDecodeError as e:
        raise BadValue("bad_json", f"bad JSON ({e.msg} at column {e.colno})") from None
    check_value(value, max_depth=max_depth)
    return value


def check_value(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise BadValue if `value` (nested lists/dicts/tuples) holds a non-finite float, a string with
    lone surrogates, or nests deeper than `max_depth`. Iterative: safe on any depth."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadValue("bad_unicode", f"invalid Unicode ({e.reason}: {v[e.start:e.end]!r})") from None
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise BadValue("bad_number", f"non-finite number {v}")
        elif isinstance(v, (list, tuple, dict)):
            if depth >= max_depth:
                raise BadValue("too_deep", f"nesting deeper than {max_depth}")
            children = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
            stack.extend((c, depth + 1) for c in children)
