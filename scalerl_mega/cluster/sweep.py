"""The project's Hydra multirun sweepers: point folders named by their overrides, and skip-if-done.

`ScalerlSweeper` (the default, conf/hydra/sweeper/scalerl.yaml) is Hydra's basic sweeper that names each point's
folder by its overrides (`point_subdir`: `loss=dapo,seed=1`, safe characters only, unique per point) unless the
command line sets `hydra.sweep.subdir`, and refuses, before any point runs, a sweep whose points would share a
folder (`hydra.sweep.subdir=${run_name}` on `-m loss=cispo,dapo`: both runs are named by the experiment).

A point is *done* when its output directory holds the `summary.json` that `scalerl-train` writes
at the end of a run and the summary's `steps` reached the point's `train.steps` (`point_done`).

`SkipDoneSweeper` is Hydra's basic sweeper with one change: before a batch of points is handed to
the launcher (e.g. `hydra/launcher=scalerl_slurm`), the done ones are dropped (logged as skipped),
so re-running a sweep submits only unfinished points (which resume from their checkpoints with
`resume=auto`). Point directories must be stable across invocations: a fixed `hydra.sweep.dir` (the
default has a timestamp); the default subdir (the point's overrides) is.

Selected with `hydra/sweeper=skip_done` (conf/hydra/sweeper/skip_done.yaml). Hydra instantiates
sweepers only from classes defined in the `hydra_plugins` namespace package, so the config names
`hydra_plugins.scalerl_skip_done.SkipDoneSweeper`, a subclass of this one (the plugin package ships
next to `scalerl_mega`; it is also found when Python runs from the repository root).

Skipped points keep their job numbers (`hydra.job.num`): the unfinished points are launched in
runs of consecutive indices, so a subdir such as `${hydra.job.num}` names the same point in every
invocation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

if TYPE_CHECKING:  # pragma: no cover
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.utils import JobReturn
    from hydra.plugins.launcher import Launcher
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig

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


SUBDIR_MAX = 100
"""Characters of a point folder's name kept from its overrides (a longer one is cut and gets the hash)."""


def point_subdir(overrides: Sequence[str]) -> str:
    """A sweep point's folder name: its overrides joined by `,` (`loss=dapo,seed=1`), every character other than
    letters, digits and `._,=+-` made `_`; a name that had to be changed or cut ends in 8 hex digits of the
    overrides' SHA-1, so two points (whose overrides differ) never share one."""
    raw = ",".join(overrides)
    safe = re.sub(r"[^A-Za-z0-9._,=+-]", "_", raw)[:SUBDIR_MAX] or "no_overrides"
    return safe if safe == raw else f"{safe}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


class _NamedPointsLauncher:
    """Wraps the configured launcher: gives each point `hydra.sweep.subdir=<point_subdir>` of its overrides less
    the excluded keys (unless the command line set a subdir) and refuses the batch, before launching any of it,
    when two points get one folder."""

    def __init__(self, inner: Launcher, *, config_loader: ConfigLoader, config: DictConfig) -> None:
        from omegaconf import OmegaConf

        self.inner = inner
        self.config_loader = config_loader
        self.config = config
        self.exclude = sorted(config.hydra.job.config.override_dirname.exclude_keys)
        """Keys left out of the names (`hydra.job.config.override_dirname.exclude_keys`: train.steps, resume)."""
        given = OmegaConf.to_container(config.hydra.overrides.hydra, resolve=False)  # as typed: ${run_name}
        self.user_subdir = next((o.split("=", 1)[1] for o in given if o.startswith("hydra.sweep.subdir=")), None)

    def _named(self, overrides: Sequence[str], *, common: set[str]) -> list[str]:
        """`overrides` and the subdir named by them: first those that differ between the points (`seed=1`),
        then those all points share, less the excluded keys."""
        if self.user_subdir is not None:
            return list(overrides)
        kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in self.exclude]
        ordered = [o for o in kept if o not in common] + [o for o in kept if o in common]
        return [*overrides, f"hydra.sweep.subdir='{point_subdir(ordered)}'"]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from omegaconf import open_dict

        common = set.intersection(*(set(ov) for ov in job_overrides)) if len(job_overrides) > 1 else set()
        named = [self._named(ov, common=common) for ov in job_overrides]
        folders: dict[Path, list[str]] = {}
        for i, ov in enumerate(named):
            cfg = self.config_loader.load_sweep_config(self.config, ov)
            with open_dict(cfg):
                cfg.hydra.job.num = initial_job_idx + i
            folders.setdefault(point_output_dir(cfg), []).append(" ".join(job_overrides[i]))
        shared = [(d, pts) for d, pts in folders.items() if len(pts) > 1]
        if shared:
            d, pts = shared[0]
            why = (f"hydra.sweep.subdir={self.user_subdir} gives" if self.user_subdir is not None else
                   f"the points differ only in keys left out of folder names ({', '.join(self.exclude)}: "
                   "hydra.job.config.override_dirname.exclude_keys), which gives")
            fix = ("drop hydra.sweep.subdir (the default names each point's folder by its overrides) or make it "
                   "differ per point (e.g. ${hydra.job.num})" if self.user_subdir is not None else
                   "sweep them in separate multiruns or set hydra.sweep.subdir='${hydra.job.num}'")
            raise SweepFolderClash(f"{why} {len(pts)} points of this sweep one folder, {d} ({'; '.join(pts)}), "
                                   f"so they would overwrite each other's run: {fix}; nothing was launched")
        return self.inner.launch(named, initial_job_idx=initial_job_idx)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class SweepFolderClash(ValueError):
    """Two points of a sweep would get one folder (raised before any point is launched; the plugin entry,
    hydra_plugins/scalerl_skip_done, reports it as a one-line `config error:` with exit status 2)."""


class ScalerlSweeper(BasicSweeper):
    """Hydra's basic sweeper (grid over the command line's sweep values), each point in a folder named by its
    overrides; a sweep whose points would share a folder is refused before any point runs."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = _NamedPointsLauncher(self._wrap(self.launcher, hydra_context=hydra_context, config=config),
                                             config_loader=hydra_context.config_loader, config=config)

    def _wrap(self, launcher: Launcher, *, hydra_context: HydraContext, config: DictConfig) -> Launcher:
        return launcher


class SkipDoneSweeper(ScalerlSweeper):
    """`ScalerlSweeper` minus the points whose run finished."""

    def _wrap(self, launcher: Launcher, *, hydra_context: HydraContext, config: DictConfig) -> Launcher:
        return _SkipDoneLauncher(launcher, config_loader=hydra_context.config_loader, config=config)
