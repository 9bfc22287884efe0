"""Where the Hydra config tree (`conf/`) is: the repository's `conf/` in a checkout or editable install,
else the copy a wheel ships as `scalerl_mega/conf/` (setup.py packages it)."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    """The directory holding `train.yaml` and the config groups."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no conf/train.yaml next to {here} (checkout) or inside it (installed wheel)")
