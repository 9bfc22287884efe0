"""metrics.jsonl (one JSON object per step and per validation) and TensorBoard events.

Each line has `kind` ("train", "validation", "sft", "forecast", ...), `step` and the compute fields
(`compute_gpu_hours`, `compute_device_hours`); the scaling toolkit reads the validation lines.
On resume, lines written after the checkpoint's step are dropped so that no step appears twice.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _clean(value: object) -> Any:
    """JSON-safe value: NaN/inf become None, numpy/torch scalars become Python numbers."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def truncate_after(path: Path, step: int) -> int:
    """Drop lines whose `step` is > `step` (resume); returns how many lines were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill -9
            dropped += 1
            continue
        if isinstance(rec.get("step"), int) and rec["step"] > step:
            dropped += 1
            continue
        kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return dropped


class MetricsWriter:
    """Appends records to `<run_dir>/metrics.jsonl`; mirrors scalars to TensorBoard if enabled."""

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool = False, resume_step: int | None = None,
                 loggers: list | None = None):
        self.run_dir = Path(run_dir)
        self._loggers = list(loggers or [])
        """Extra trackers (metrics/loggers.py): `.log(kind, step, record)` per record, `.close()`."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None:
            truncate_after(self.path, resume_step)
        elif self.path.exists():
            self.path.unlink()
        self._fh = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def write(self, kind: str, step: int, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one line: {"kind": kind, "step": step, **record}; returns what was written."""
        rec = {"kind": kind, "step": int(step), **_clean(dict(record))}
        self._fh.write(json.dumps(rec, sort_keys=False) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in rec.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self._tb.add_scalar(f"{kind}/{key}", value, int(step))
            self._tb.flush()
        for logger in self._loggers:
            logger.log(kind, int(step), rec)
        return rec

    def close(self) -> None:
        self._fh.close()
        for logger in self._loggers:
            logger.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike, *, kind: str | None = None) -> list[dict[str, Any]]:
    """Read metrics.jsonl or its compressed copy `metrics.jsonl.xz` / `.gz` (optionally one kind)."""
    from scalerl_mega.scaling.io import open_text

    with open_text(Path(path)) as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            if kind is None or rec.get("kind") == kind:
                out.append(rec)
    return out
