"""Hydra plugin entry for `hydra/sweeper=skip_done` (conf/hydra/sweeper/skip_done.yaml).

Hydra instantiates sweepers only from classes defined in the `hydra_plugins` namespace package
(it keys plugins by `<defining module>.<class name>`), so this module defines a subclass of
`scalerl_mega.cluster.sweep.SkipDoneSweeper`; the behaviour lives there. `hydra_plugins` is a
namespace package shared with other plugins (hydra-submitit-launcher): no `hydra_plugins/__init__.py`.
"""

from __future__ import annotations

from scalerl_mega.cluster.sweep import SkipDoneSweeper as _SkipDoneSweeper

__all__ = ["SkipDoneSweeper"]


class SkipDoneSweeper(_SkipDoneSweeper):
    """Hydra's basic sweeper minus the points whose run finished (see scalerl_mega/cluster/sweep.py)."""
