"""Hydra plugin entries for the default `hydra/sweeper=scalerl` and `hydra/sweeper=skip_done`
(conf/hydra/sweeper/).

Hydra instantiates sweepers only from classes defined in the `hydra_plugins` namespace package
(it keys plugins by `<defining module>.<class name>`), so this module defines subclasses of
`scalerl_mega.cluster.sweep`'s sweepers; the behaviour lives there. `hydra_plugins` is a
namespace package shared with other plugins (hydra-submitit-launcher): no `hydra_plugins/__init__.py`.
"""

from __future__ import annotations

from scalerl_mega.cluster.sweep import ScalerlSweeper as _ScalerlSweeper
from scalerl_mega.cluster.sweep import SkipDoneSweeper as _SkipDoneSweeper

__all__ = ["ScalerlSweeper", "SkipDoneSweeper"]


class _OneLineErrors:
    """A sweep refused before any point runs (`SweepFolderClash`) is the one-line `config error:`, exit status 2,
    of every other configuration error (scalerl_mega/run_dir.py), not Hydra's report."""

    def sweep(self, arguments: list[str]) -> object:
        from scalerl_mega.cluster.sweep import SweepFolderClash
        from scalerl_mega.run_dir import config_error_exit

        try:
            return super().sweep(arguments)
        except SweepFolderClash as exc:
            config_error_exit(exc)


class ScalerlSweeper(_OneLineErrors, _ScalerlSweeper):
    """Hydra's basic sweeper, each point's folder named by its overrides (see scalerl_mega/cluster/sweep.py)."""


class SkipDoneSweeper(_OneLineErrors, _SkipDoneSweeper):
    """Hydra's basic sweeper minus the points whose run finished (see scalerl_mega/cluster/sweep.py)."""
