"""Checks of the run's generators that need no model and no process: the backend `rollout.*` names is installed,
and the engine settings the run would build are valid (the local engines' configs, whose longest request must fit
the model's positions; the model SGLang would serve). Run by `scalerl-train --validate` and at the run's start
alike (train.pre_step_checks), so a missing SGLang is one `config error:` line, not a traceback after the trainer
was built and warm-started."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.build import Task
    from scalerl_mega.config import TrainConfig

SGLANG_INSTALL = ("`make sglang-env` builds SGLang's own environment in .venv-sglang (docs/sglang.md); serve from "
                  "there and attach with rollout.engine_urls=[http://host:port], or pip install sglang here; "
                  "rollout=local runs the embedded engine instead")


def check_backends(cfg: TrainConfig) -> None:
    """`rollout=sglang` without `rollout.engine_urls` launches `python -m sglang.launch_server` with this
    interpreter: SGLang must be importable here. ValueError naming the key and how to install it."""
    if cfg.rollout.name == "sglang" and not cfg.rollout.engine_urls and importlib.util.find_spec("sglang") is None:
        raise ValueError(f"rollout=sglang launches its servers with this Python ({sys.executable}), where SGLang is "
                         f"not installed: {SGLANG_INSTALL}")


def check_engine_settings(cfg: TrainConfig, task: Task) -> None:
    """The engine configs the run builds, built now (they check themselves): every local engine's
    (`build.local_engine_config`: the longest prompt plus the output budget within the model's positions), or the
    model SGLang serves (`build.check_sglang_model`)."""
    from scalerl_mega import build

    if cfg.rollout.name == "sglang":
        build.check_sglang_model(cfg)
        return
    for i in range(int(cfg.rollout.num_engines)):
        build.local_engine_config(cfg, task, index=i)
