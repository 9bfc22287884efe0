"""Skip-if-done for Hydra multirun sweeps.

A point is *done* when its output directory holds the `summary.json` that `scalerl-train` writes
at the end of a run and the summary's `steps` reached the point's `train.steps` (`point_done`).

`SkipDoneSweeper` is Hydra's basic sweeper with one change: before a batch of points is handed to
the launcher (e.g. `hydra/launcher=scalerl_slurm`), the done ones are dropped (logged as skipped),
so re-running a sweep submits only unfinished points (which resume from their checkpoints with
`resume=auto`). Point directories must be stable across invocations: a fixed `hydra.sweep.dir` (the
default has a timestamp) and e.g. `hydra.sweep.subdir=${run_name}`.

Selected with `hydra/sweeper=skip_done` (conf/hydra/sweeper/skip_done.yaml). Hydra instantiates
sweepers only from classes defined in the `hydra_plugins` namespace package, so the config names
`hydra_plugins.scalerl_skip_done.SkipDoneSweeper`, a subclass of this one (the plugin package ships
next to `scalerl_mega`; it is also found when Python runs from the repository root).

Skipped points keep their job numbers (`hydra.job.num`): the unfinished points are launched in
runs of consecutive indices, so a subdir such as `${hydra.job.num}` names the same point in every
invocation.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

log = logging.getLogger("scalerl_mega.cluster.sweep")


def point_done(output_dir: str | Path, *, steps: int) -> bool:
    """True when `output_dir/summary.json` records a run that reached `steps` RL steps."""
    path = Path(output_dir) / "summary.json"
    if not path.is_file():
        return False
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        return False  # a torn write: run it again
    return int(summary.get("steps", -1)) >= int(steps)


def point_output_dir(sweep_cfg: Any) -> Path:
    """The output directory a launcher gives a composed sweep point (hydra.sweep.dir/subdir)."""
    return Path(str(sweep_cfg.hydra.sweep.dir)) / str(sweep_cfg.hydra.sweep.subdir)


class _SkipDoneLauncher:
    """Wraps the configured launcher: launches only the points that are not done."""

    def __init__(self, inner: Any, *, config_loader: Any, config: Any) -> None:
        self.inner = inner
        self.config_loader = config_loader
        self.config = config
        self.skipped: list[tuple[list[str], Path]] = []

    def _is_done(self, overrides: Sequence[str], idx: int) -> Path | None:
        from omegaconf import open_dict

        cfg = self.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.num = idx
        out = point_output_dir(cfg)
        return out if point_done(out, steps=int(cfg.train.steps)) else None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        """Launch the unfinished points; each run of consecutive ones is one inner launch starting
        at its own job index, so every point keeps the `hydra.job.num` (and directory) it has
        when nothing is skipped."""
        runs: list[tuple[int, list[list[str]]]] = []  # (first job index, points)
        for i, ov in enumerate(job_overrides):
            idx = initial_job_idx + i
            done_dir = self._is_done(ov, idx)
            if done_dir is not None:
                self.skipped.append((list(ov), done_dir))
                log.info("skip %s: finished (%s/summary.json)", " ".join(ov), done_dir)
            elif runs and runs[-1][0] + len(runs[-1][1]) == idx:
                runs[-1][1].append(list(ov))
            else:
                runs.append((idx, [list(ov)]))
        results: list[Any] = []
        for first, points in runs:
            results.extend(self.inner.launch(points, initial_job_idx=first))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SkipDoneSweeper(BasicSweeper):
    """Hydra's basic sweeper (grid over the command line's sweep values) minus finished points."""

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = _SkipDoneLauncher(self.launcher, config_loader=hydra_context.config_loader, config=config)
