"""Strict JSON values for dataset rows: finite numbers, valid Unicode, bounded nesting.

Python's `json` accepts `NaN` / `Infinity`, turns `1e400` into `inf`, raises a bare ValueError on
integers over 4300 digits and RecursionError on very deep nesting, and lets lone surrogates
(`"\\ud800"`) through into `str` values that later fail to encode. `loads_strict` and `check_value`
turn each of these into a `BadValue` with a short reason and a `kind` for per-reason counts.

`normalize_tests` turns a code row's test specs (the Deepcoder / LiveCodeBench / PrimeIntellect / TACO
forms) into the two forms the code reward runs (`rewards.code`): the data loader checks rows with it and the
reward normalises with it, so it lives here, below both.
"""

from __future__ import annotations

import json
import math
from typing import Any

JSON = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
"""A decoded JSON value (what `json.loads` returns): the type of HTTP bodies and dataset rows before their checks."""

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


def loads_strict(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> JSON:
    """`json.loads` that raises BadValue (kinds: bad_json, bad_number, too_deep, bad_unicode)."""
    try:
        value = json.loads(text, parse_constant=_bad_constant, parse_float=_finite_float, parse_int=_int)
    except RecursionError:
        raise BadValue("too_deep", f"nesting deeper than {max_depth}") from None
    except json.JSONDecodeError as e:
        where = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno} column {e.colno}"
        raise BadValue("bad_json", f"bad JSON ({e.msg} at {where})") from None
    check_value(value, max_depth=max_depth)
    return value


def check_value(value: object, *, max_depth: int = MAX_DEPTH) -> None:
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


# ------------------------------------------------------------------------------------ code test cases


def normalize_tests(raw: object, *, fn_name: str | None = None) -> list[dict[str, Any]]:
    """Normalize test specs into the two forms above.

    Accepts this module's forms and the Deepcoder variants (`tests` is a JSON string there):
    a list of `{"input", "output", "testtype": "stdin"|"functional", "metadata": {"func_name"}}`
    (LiveCodeBench; functional inputs are newline-separated JSON arguments, outputs JSON), a list of
    `{"input", "output", "type": "stdin_stdout"}` (PrimeIntellect), or a TACO dict
    `{"inputs": [...], "outputs": [...], "fn_name"?: str}`. Raises ValueError on anything else.
    """
    if isinstance(raw, str):
        try:
            raw = loads_strict(raw)
        except BadValue as e:
            raise ValueError(f"tests: not valid JSON ({e})" if e.kind == "bad_json" else f"tests: {e}") from None
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:
        return _normalize_taco(raw, fn_name=fn_name)
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ValueError(f"tests: expected a list or dict, got {type(raw).__name__}")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise ValueError(f"tests[{i}]: expected a dict, got {type(t).__name__}")
        if "fn_name" in t:
            if not isinstance(t.get("args", []), list):
                raise ValueError(f"tests[{i}]: args must be a list, got {type(t['args']).__name__}")
            out.append({"fn_name": str(t["fn_name"]), "args": list(t.get("args", [])),
                        "expected": _not_null(t.get("expected"), f"tests[{i}].expected")})
        elif t.get("testtype") == "functional":
            meta = t.get("metadata") or {}
            if isinstance(meta, str):
                meta = json.loads(meta) if meta.strip() else {}
            name = meta.get("func_name") or fn_name
            if not name:
                raise ValueError(f"tests[{i}]: functional test without func_name")
            inp, outp = _as_text(t.get("input"), f"tests[{i}].input"), _as_text(t.get("output"), f"tests[{i}].output")
            try:
                args = [loads_strict(line) for line in inp.split("\n") if line.strip()]
                expected = loads_strict(outp)
            except BadValue as e:
                raise ValueError(f"tests[{i}]: functional input/output: {e}") from None
            out.append({"fn_name": name, "args": args, "expected": _not_null(expected, f"tests[{i}].output")})
        elif "input" in t and "output" in t:
            out.append({"input": _as_text(t["input"], f"tests[{i}].input"),
                        "output": _as_text(t["output"], f"tests[{i}].output")})
        else:
            raise ValueError(f"tests[{i}]: needs input/output or fn_name/args/expected, got keys {sorted(t)}")
    return out


def _normalize_taco(raw: dict, *, fn_name: str | None) -> list[dict[str, Any]]:
    """TACO `{"inputs": [...], "outputs": [...], "fn_name"?}`. With a function name every input is the
    list of call arguments and every output the return value, usually wrapped in a one-element list;
    without one, inputs/outputs are stdin/stdout texts (or lists of lines)."""
    name = raw.get("fn_name") or fn_name
    ins, outs = raw["inputs"], raw["outputs"]
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise ValueError(f"tests: TACO inputs/outputs must be lists, got {type(ins).__name__}/{type(outs).__name__}")
    if len(ins) != len(outs):
        raise ValueError(f"tests: {len(ins)} inputs but {len(outs)} outputs")
    if not name:
        return [{"input": _as_text(i, f"tests.inputs[{k}]"), "output": _as_text(o, f"tests.outputs[{k}]")}
                for k, (i, o) in enumerate(zip(ins, outs))]
    out = []
    for k, (i, o) in enumerate(zip(ins, outs)):
        if not isinstance(i, list):
            # a bare string would otherwise become one argument per character
            raise ValueError(f"tests.inputs[{k}]: TACO call arguments must be a list, got {type(i).__name__}")
        expected = o[0] if isinstance(o, list) and len(o) == 1 else o
        out.append({"fn_name": str(name), "args": list(i), "expected": _not_null(expected, f"tests.outputs[{k}]")})
    return out


def _not_null(x: object, where: str) -> object:
    if x is None:
        raise ValueError(f"{where}: null expected output")
    return x


def _as_text(x: object, where: str = "tests") -> str:
    """stdin/stdout text: a string, a number, or a list of those (lines). Anything else (null, dicts,
    booleans) would turn into a wrong test via `str()`, so it is an error."""
    if isinstance(x, str):
        return x
    items = x if isinstance(x, list) else [x]
    for v in items:
        if v is None or isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ValueError(f"{where}: expected text (or a list of lines), got {type(v).__name__}"
                             + (" (null output)" if v is None else ""))
    return "\n".join(map(str, items))
