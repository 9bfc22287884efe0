"""Reading scaling series from run directories, metrics.jsonl files and CSV files.

metrics.jsonl: one JSON object per line. Rows are selected tolerantly: every object that carries the
y key (e.g. "val_pass_rate", written by validation lines such as
`{"kind": "validation", "step": 100, "compute_gpu_hours": 1.2, "compute_device_hours": 0.4,
"val_pass_rate": 0.31}`) with a non-null value is a point; its x key must then be present.
CSV: a header row naming the columns; rows with an empty y cell are skipped.
A jsonl x key `sum:<key>` is cumulative: the sum of `<key>` over every earlier line carrying it (e.g.
`sum:batch/tokens`, the rollout tokens of the steps trained so far on `train` lines) -- a compute axis
that, unlike wall-clock device-hours, does not depend on what else the machine was running. A validation
line with `val_center_step` (window validation, metrics/val_window.py) takes the total after that step instead.
Validation samples per point (`Series.n_samples`, for the binomial noise floor of `scaling.identify`):
`val_prompts` x `val_samples_per_prompt` of each jsonl row when y is `val_pass_rate`, `val/<domain>_samples`
when y is `val/<domain>_pass_rate`, if every row has them; else None (CSV files, other keys).
A run directory is read through its `metrics.jsonl`, else its `metrics.jsonl.xz` or `.gz` (compressed copies),
else its `curve.jsonl.xz` (the curve alone, metrics/curve.py: how the reproduction commits its runs), else its
single `*.csv`, else its single `*.jsonl`. A `.xz` or `.gz` file is read as its content.

Every problem is a ValueError whose message starts with `<file>:<line>:` (or `<file>:`), e.g. NaN values,
non-numeric values, compute that decreases, no matching rows.
"""

from __future__ import annotations

import csv
import gzip
import json
import lzma
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True, kw_only=True)
class Series:
    """One run's (compute, reward) points in file order, with the line numbers they came from."""

    name: str
    source: str
    x_key: str
    y_key: str
    compute: np.ndarray
    reward: np.ndarray
    lines: np.ndarray
    n_samples: np.ndarray | None = None
    """Validation samples behind each point (module docstring), or None when not recorded."""


def _number(v, *, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"{where}: {key} = {v!r} is not a number")
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{where}: {key} = {v!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{where}: {key} is {x} (NaN/inf values cannot be fitted)")
    return x


METRICS_NAMES = ("metrics.jsonl", "metrics.jsonl.xz", "metrics.jsonl.gz", "curve.jsonl.xz")
"""A run directory's metrics file, in order of preference. `curve.jsonl.xz` is a run's curve alone
(metrics/curve.py: the validation lines and the cumulative compute of the training lines), which every series
read here gives as the full file would."""


_DECOMPRESSORS = {".xz": lzma.open, ".gz": gzip.open}
"""Compressed files read as their content, by suffix."""


def _is_csv(path: Path) -> bool:
    """`path` names a CSV file, compressed or not."""
    name = path.name.lower()
    suffix = next((z for z in _DECOMPRESSORS if name.endswith(z)), "")
    return name.removesuffix(suffix).endswith(".csv")


def open_text(path: Path, *, newline: str | None = None):
    """`path` opened for reading as UTF-8 text (`newline` as for `open`; "" for CSV); a `.xz` or `.gz` file is
    decompressed on the fly."""
    opener = next((f for z, f in _DECOMPRESSORS.items() if path.name.endswith(z)), None)
    if opener is not None:
        return opener(path, "rt", encoding="utf-8", newline=newline)
    return path.open(encoding="utf-8", newline=newline)


def run_metrics_file(run_dir: Path) -> Path | None:
    """The run directory's metrics file (`METRICS_NAMES`), None when it has none."""
    return next((run_dir / n for n in METRICS_NAMES if (run_dir / n).is_file()), None)


def _resolve(path: Path) -> Path:
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if path.is_file():
        return path
    m = run_metrics_file(path)
    if m is not None:
        return m
    for pattern in ("*.csv", "*.jsonl"):
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ValueError(f"{path}: no metrics.jsonl and several {pattern} files ({names}); name one")
    raise ValueError(f"{path}: directory has no metrics.jsonl, *.csv or *.jsonl file")


CUMULATIVE_PREFIX = "sum:"
CENTER_KEY = "val_center_step"
"""A validation line spread over a window of steps (`train.val_mode=window`) is drawn at its centre step: its
compute fields are the centre's, and a cumulative x is the total after that step's line, not after the line
before the validation line."""


N_SAMPLES_KEYS = ("val_prompts", "val_samples_per_prompt")
"""Validation-line keys whose product is the number of samples behind `val_pass_rate` (validation.validate)."""


def samples_keys(y: str) -> tuple[str, ...] | None:
    """The keys whose product counts the samples behind reward key `y` (module docstring), or None."""
    if y == "val_pass_rate":
        return N_SAMPLES_KEYS
    if y.startswith("val/") and y.endswith("_pass_rate"):
        return (y[: -len("_pass_rate")] + "_samples",)
    return None


def _read_jsonl(path: Path, *, x: str, y: str, counts: list | None = None
                ) -> tuple[list[float], list[float], list[int], set[str]]:
    xs, ys, lines, keys = [], [], [], set()
    count_keys = samples_keys(y)
    summed = x[len(CUMULATIVE_PREFIX):] if x.startswith(CUMULATIVE_PREFIX) else None
    total, seen = 0.0, False
    total_at: dict[int, float] = {}  # cumulative total after each step's line
    with open_text(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            raw = raw.strip()
            if not raw:
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            keys.update(obj)
            if summed is not None and obj.get(summed) is not None:
                total += _number(obj[summed], where=where, key=summed)
                seen = True
                if isinstance(obj.get("step"), int):
                    total_at[obj["step"]] = total
            if obj.get(y) is None:
                continue
            if summed is not None:
                xs.append(_window_center(obj, total_at, where=where) if CENTER_KEY in obj else total)
            elif obj.get(x) is None:
                raise ValueError(f"{where}: row has {y!r} but no {x!r}")
            else:
                xs.append(_number(obj[x], where=where, key=x))
            ys.append(_number(obj[y], where=where, key=y))
            lines.append(lineno)
            if counts is not None:
                vals = [obj.get(k) for k in count_keys]
                counts.append(math.prod(float(v) for v in vals) if all(isinstance(v, (int, float)) and
                                                                       not isinstance(v, bool) for v in vals)
                              else math.nan)
    if summed is not None and not seen:
        raise ValueError(f"{path}: no line carries {summed!r} (for --x {x})")
    return xs, ys, lines, keys


def _window_center(obj: dict, total_at: dict[int, float], *, where: str) -> float:
    """A window validation's cumulative x: the total after the train line of its centre step (`CENTER_KEY`)."""
    c = _number(obj[CENTER_KEY], where=where, key=CENTER_KEY)
    if c != int(c) or int(c) not in total_at:
        raise ValueError(f"{where}: {CENTER_KEY} = {c:g} names no earlier step line carrying the summed key")
    return total_at[int(c)]


def _read_csv(path: Path, *, x: str, y: str) -> tuple[list[float], list[float], list[int], set[str]]:
    xs, ys, lines = [], [], []
    with open_text(path, newline="") as fh:
        reader = csv.DictReader(fh)
        cols = set(reader.fieldnames or ())
        missing = [k for k in (x, y) if k not in cols]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; columns are {sorted(cols)}")
        for row in reader:
            lineno = reader.line_num
            where = f"{path}:{lineno}"
            yv = (row.get(y) or "").strip()
            if yv == "":
                continue
            xv = (row.get(x) or "").strip()
            if xv == "":
                raise ValueError(f"{where}: row has {y!r} but an empty {x!r}")
            xs.append(_number(xv, where=where, key=x))
            ys.append(_number(yv, where=where, key=y))
            lines.append(lineno)
    return xs, ys, lines, cols


def read_series(path: str | Path, *, x: str = "compute_gpu_hours", y: str = "val_pass_rate",
                name: str | None = None) -> Series:
    """Read one run (directory, .jsonl or .csv). Checks: at least one row, compute non-decreasing."""
    p = _resolve(Path(path))
    counts: list[float] = []
    if _is_csv(p):
        if x.startswith(CUMULATIVE_PREFIX):
            raise ValueError(f"{p}: x = {x!r}: cumulative keys ({CUMULATIVE_PREFIX}<key>) need a metrics.jsonl")
        xs, ys, lines, keys = _read_csv(p, x=x, y=y)
    else:
        xs, ys, lines, keys = _read_jsonl(p, x=x, y=y, counts=counts if samples_keys(y) else None)
    ns = np.asarray(counts, dtype=np.float64) if counts else None
    if ns is not None and not (np.all(np.isfinite(ns)) and np.all(ns >= 1)):
        ns = None
    if not xs:
        raise ValueError(f"{p}: no rows with {y!r} (keys seen: {sorted(keys)[:20]})")
    for k in range(1, len(xs)):
        if xs[k] < xs[k - 1]:
            raise ValueError(
                f"{p}:{lines[k]}: {x} decreases ({xs[k]:g} after {xs[k - 1]:g} at line {lines[k - 1]}); "
                "the scaling fit needs points in compute order"
            )
    if xs[0] < 0:
        raise ValueError(f"{p}:{lines[0]}: {x} = {xs[0]:g} is negative")
    label = name or run_label(path)
    return Series(name=label, source=str(p), x_key=x, y_key=y, compute=np.asarray(xs, dtype=np.float64),
                  reward=np.asarray(ys, dtype=np.float64), lines=np.asarray(lines, dtype=np.int64), n_samples=ns)


RUN_CONFIG = "run_config.yaml"
"""The resolved config a run writes into its directory (run_dir.py): its `run_name:` and `seed:` lines name the run."""


def run_label(path: str | Path) -> str:
    """A run's name for tables and legends: `<run_name>/seed<seed>` from the run's `run_config.yaml` when it has
    one; else `<parent>/<dir>` for a directory named seed<N> (two runs' `seed0` folders differ by their parent);
    else the directory's name, or the file's stem for a file that is not a run's metrics file."""
    p = Path(path)
    d = p if p.is_dir() else p.parent if p.name in METRICS_NAMES else None
    if d is None:
        return p.stem
    cfg = d / RUN_CONFIG
    if cfg.is_file():
        found = dict(re.findall(r"^(run_name|seed): *['\"]?([^'\"\n#]*?)['\"]? *$", cfg.read_text(encoding="utf-8"),
                                flags=re.M))
        if found.get("run_name") and found.get("seed", "").isdigit():
            return f"{found['run_name']}/seed{found['seed']}"
    d = d.resolve()
    return f"{d.parent.name}/{d.name}" if re.fullmatch(r"seed\d+", d.name) else d.name


def domain_keys(path: str | Path) -> list[str]:
    """The per-domain validation keys (`val/<domain>_pass_rate`, validation.validate) present in a run's
    metrics.jsonl (directory or file), sorted; [] for CSV files or single-domain runs without them."""
    p = _resolve(Path(path))
    if _is_csv(p):
        return []
    found: set[str] = set()
    with open_text(p) as fh:
        for raw in fh:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                continue  # read_series reports bad lines with their line numbers
            if isinstance(obj, dict):
                found.update(k for k in obj if k.startswith("val/") and k.endswith("_pass_rate"))
    return sorted(found)


GPU_X, DEVICE_X = "compute_gpu_hours", "compute_device_hours"
"""The two compute axes every validation line carries (metrics/compute.py)."""


def auto_x(paths, *, y: str = "val_pass_rate") -> tuple[str, str]:
    """(x key, a line saying why) for runs read with `--x auto`: GPU-hours where any run logged some, else
    device-hours (a CPU run's GPU-hours are all 0). A run that cannot be read with GPU-hours for another reason
    than lacking them decides for GPU-hours, so that reading it reports the problem."""
    for p in paths:
        try:
            s = read_series(p, x=GPU_X, y=y)
        except ValueError as e:
            if f"but no {GPU_X!r}" in str(e) or "missing column" in str(e):
                continue  # this run logged no GPU-hours at all
            return GPU_X, f"x axis: {GPU_X} (--x auto)"
        if float(s.compute.max()) > 0:
            return GPU_X, f"x axis: {GPU_X} (--x auto: {s.name} logged GPU-hours)"
    return DEVICE_X, f"x axis: {DEVICE_X} (--x auto: no run logged GPU-hours, e.g. CPU runs)"


PASS_RATE_RANGE = (0.0, 1.0)
"""The range of a pass rate: Eq. 1's asymptote, its band and the binomial noise model all live in it."""


def check_range(s: Series, y_range: tuple[float, float] | None = None) -> None:
    """ValueError naming the file, line and value of the first reward outside `y_range` (default: a pass rate's
    [0, 1]); a metric with another range (e.g. a mean reward in [-1, 1]) is declared with `scalerl-fit --y-range`."""
    lo, hi = PASS_RATE_RANGE if y_range is None else y_range
    bad = np.flatnonzero((s.reward < lo) | (s.reward > hi))
    if bad.size:
        k = int(bad[0])
        declare = ("a pass rate is in [0, 1]; declare another metric's range with --y-range LO HI" if y_range is None
                   else "outside the range declared with --y-range")
        raise ValueError(f"{s.source}:{int(s.lines[k])}: {s.y_key} = {s.reward[k]:g} is outside [{lo:g}, {hi:g}] "
                         f"({declare}; {bad.size} of {s.reward.size} points outside)")


def to_unit_range(s: Series, y_range: tuple[float, float]) -> Series:
    """`s` with its rewards mapped affinely from `y_range` onto [0, 1], the scale Eq. 1, its band and its grids
    work on; the binomial sample counts are dropped (they describe a pass rate, not another metric). A pass rate's
own range returns `s` unchanged."""
    lo, hi = y_range
    if (lo, hi) == PASS_RATE_RANGE:
        return s
    return replace(s, reward=(s.reward - lo) / (hi - lo), n_samples=None)
