"""Compose-time preparation of a `scalerl-train` config: everything that can be checked or derived
before a process group, model or engine exists (called by `train.to_config`, and so by `--validate`).

    model     model=hf -> the checkpoint's shapes; an explicit preset is checked against init_from_hf
    data      column keys / template, and that every data file exists (data/columns.py)
    reward    the reward group, incl. that a custom `_target_` imports and is callable
    metrics   optional trackers (metrics.loggers) are known and installed
"""

from __future__ import annotations

from typing import Any


def prepare(config: Any) -> Any:
    """`config` (a TrainConfig) with `model=hf` resolved; ValueError naming the key on any problem."""
    from scalerl_mega.data.columns import check_data_files, check_data_keys
    from scalerl_mega.model.hf_import import resolve_model
    from scalerl_mega.metrics.loggers import check_loggers
    from scalerl_mega.rewards.custom import check_reward_settings

    resolve_model(config)
    check_data_keys(config.data)
    if config.data.name != "synthetic" and not getattr(config, "dry_run", False):
        check_data_files(config.data)  # a dry run builds the layout only: no data is read
    check_reward_settings(config.reward)
    check_loggers(config.metrics)
    return config
