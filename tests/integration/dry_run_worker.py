"""Child process of tests/integration/test_dry_run.py: compose each named override list with Hydra,
dry-run it (scalerl_mega/dry_run.py; builds shared through one cache) and write the results.

    python dry_run_worker.py CASES.json OUT.json
CASES.json: {"name": [override, ...], ...}; OUT.json: {"name": dry_run payload | {"error": message}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs, validate

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=["output_dir=/tmp/scalerl-dry-run", *overrides])
    obj = OmegaConf.to_object(cfg)
    validate(obj)
    return obj


def main() -> None:
    import logging

    from scalerl_mega.dry_run import LayoutError, dry_run

    logging.getLogger("megatron").setLevel(logging.ERROR)
    cases = json.loads(Path(sys.argv[1]).read_text())
    cache: dict = {}
    out = {}
    for name, overrides in cases.items():
        try:
            out[name] = dry_run(compose(overrides), cache=cache)
        except LayoutError as exc:
            out[name] = {"error": str(exc)}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
