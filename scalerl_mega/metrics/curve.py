"""A run's scaling curve as a small, shareable file, and byte-reproducible xz copies of metrics files.

A run's `metrics.jsonl` holds one line per training step (a 6,400-step CPU run: 21 MB, 3.8 MB xz); its scaling
curve needs far less. `reduce_records` keeps every validation line verbatim and replaces each span of training
lines between two boundaries by one line carrying the span's SUM of the keys that cumulative compute axes read
(`SUMMED`: `scaling.io`'s `sum:samples`, `sum:batch/tokens`) and the LAST value of a few state keys (`KEPT`), with
the step of the span's last line. Boundaries: every validation line, every validation's `val_center_step` (window
validation reads the total after that step), and the end of the file. So every series `scaling.io.read_series`
reads from the reduced file equals the full file's (the sums are of integer counts: exact in float64), the last
training step is kept, and a 6,400-step run's curve is ~20-40 KB xz. `forecast` lines (refits of the same points)
and other kinds are dropped.

`write_curve` writes `<run>/curve.jsonl.xz` (`CURVE_NAME`); `scaling.io` reads a run directory through it when the
run has no metrics file (`METRICS_NAMES`), so `scalerl-fit` and the analyses take a curve where they take a run.
`compress_metrics_file` is the full file's xz copy. Both are deterministic (xz preset 9e, no timestamp) and rewrite
nothing when the destination already holds the same content.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CURVE_NAME = "curve.jsonl.xz"
SUMMED = ("samples", "batch/tokens")
"""Training-line keys summed over each reduced span (the cumulative compute axes of `scaling.io`)."""
KEPT = ("weight_version", "curriculum/curriculum/epoch", "curriculum/curriculum/active_prompts")
"""Training-line keys whose last value in each span is kept (the run's state at the boundary)."""
CURVE_KINDS = ("validation",)
"""Line kinds kept verbatim."""


def reduce_records(records: Iterable[dict[str, Any]], *, summed: tuple[str, ...] = SUMMED,
                   kept: tuple[str, ...] = KEPT, drop_fields: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The curve of a run's metrics records in file order (module docstring); `drop_fields` are left out of the
    kept validation lines."""
    records = list(records)
    centers = {int(r["val_center_step"]) for r in records
               if r.get("kind") in CURVE_KINDS and isinstance(r.get("val_center_step"), (int, float))}
    out: list[dict[str, Any]] = []
    span: dict[str, Any] | None = None

    def flush() -> None:
        nonlocal span
        if span is not None:
            out.append(span)
            span = None

    for r in records:
        kind = r.get("kind")
        if kind == "train":
            if span is None:
                span = {"kind": "train", "step": r.get("step")}
            span["step"] = r.get("step")
            for k in summed:
                if r.get(k) is not None:
                    span[k] = span.get(k, 0.0) + float(r[k])
            span.update({k: r[k] for k in kept if k in r})
            if r.get("step") in centers:
                flush()
        elif kind in CURVE_KINDS:
            flush()
            out.append({k: v for k, v in r.items() if k not in drop_fields})
    flush()
    return out


def _serialise(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def write_xz(dest: Path, raw: bytes) -> bool:
    """Write `raw` xz-compressed to `dest` (preset 9 extreme, no timestamp, round trip checked) unless `dest`
    already holds exactly that content; True when written."""
    if dest.is_file():
        try:
            if lzma.decompress(dest.read_bytes()) == raw:
                return False
        except lzma.LZMAError:
            pass  # a damaged earlier copy: rewritten below
    data = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    if lzma.decompress(data) != raw:
        raise RuntimeError(f"{dest}: xz round trip changed the content")
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return True


def write_curve(metrics: Path, dest: Path, *, drop_fields: tuple[str, ...] = ()) -> Path:
    """`reduce_records` of the metrics file `metrics` (plain or compressed) written to `dest` (a directory gets
    `CURVE_NAME`); returns the path written (or left as it was)."""
    from scalerl_mega.metrics.writer import read_metrics

    path = dest / CURVE_NAME if dest.is_dir() else dest
    write_xz(path, _serialise(reduce_records(read_metrics(metrics), drop_fields=drop_fields)))
    return path


def compress_metrics_file(src: Path, dest: Path, *, drop_fields: tuple[str, ...] = ()) -> None:
    """Write `src` (a metrics.jsonl) less the keys in `drop_fields` (lines re-serialised, floats by `repr`: values
    read back equal) to `dest` (its `.xz` name), xz preset 9 extreme (`write_xz`)."""
    raw = src.read_bytes()
    if drop_fields:
        raw = _serialise({k: v for k, v in json.loads(line).items() if k not in drop_fields}
                         for line in raw.decode().splitlines() if line.strip())
    write_xz(dest, raw)
