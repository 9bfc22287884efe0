"""`scalerl-train`: the Hydra entry point (DESIGN.md "Layout": build components from config, run).

    scalerl-train experiment=demo                 # CPU embedded default (`make demo`)
    scalerl-train --cfg job experiment=scalerl    # print the resolved ScaleRL config
    scalerl-train -m experiment=loo_dapo,loo_plan hydra/launcher=submitit_slurm

The config lives in `conf/` at the repository root; `scalerl_mega/config.py` holds its typed schema.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def to_config(cfg: Any):
    """OmegaConf node -> validated TrainConfig dataclass tree."""
    from omegaconf import OmegaConf

    from scalerl_mega.config import validate

    obj = OmegaConf.to_object(cfg)
    validate(obj)
    return obj


def run(cfg: Any) -> dict[str, Any]:
    """Validate `cfg` and run the job (SFT warm start if configured, then RL, then the report)."""
    config = to_config(cfg)
    from scalerl_mega.loop import run_job

    return run_job(config)


def main() -> None:
    """Console script `scalerl-train`."""
    import hydra

    from scalerl_mega.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def _entry(cfg) -> None:
        run(cfg)

    _entry()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
