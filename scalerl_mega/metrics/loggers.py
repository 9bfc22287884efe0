"""Optional experiment trackers next to metrics.jsonl / TensorBoard: `metrics.loggers=[wandb,mlflow]`.

Each logger mirrors the numeric fields of every metrics record as `<kind>/<key>` at its step.
- wandb: `wandb.init(project=metrics.wandb_project, mode=metrics.wandb_mode, dir=<run dir>)`;
  the default mode is `offline` (runs sync later with `wandb sync`), `online` needs an account.
- mlflow: tracking URI `metrics.mlflow_tracking_uri`, default a local file store `<run dir>/mlruns`.
Both packages are optional (pip install wandb / mlflow-skinny); naming one that is not installed is
a compose-time config error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import MetricsConfig, TrainConfig

PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
WANDB_MODES = ("offline", "online", "disabled")


def check_loggers(metrics: MetricsConfig) -> None:
    """ValueError naming `metrics.loggers` for an unknown name or a missing package."""
    for name in list(getattr(metrics, "loggers", []) or []):
        if name not in PACKAGES:
            raise ValueError(f"metrics.loggers: {name!r} is not one of {sorted(PACKAGES)}")
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ValueError(f"metrics.loggers: {name!r} needs the {PACKAGES[name]} package, which is not installed")
    mode = getattr(metrics, "wandb_mode", "offline")
    if mode not in WANDB_MODES:
        raise ValueError(f"metrics.wandb_mode={mode!r} is not one of {list(WANDB_MODES)}")


def _scalars(record: dict[str, Any], kind: str) -> dict[str, float]:
    return {f"{kind}/{k}": float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


class WandbLogger:
    def __init__(self, *, run_dir: Path, run_name: str, project: str, mode: str, config: dict) -> None:
        import wandb

        self._run = wandb.init(project=project, name=run_name, mode=mode, dir=str(run_dir), config=config,
                               reinit="create_new")

    def log(self, kind: str, step: int, record: dict[str, Any]) -> None:
        self._run.log(_scalars(record, kind), step=int(step))

    def close(self) -> None:
        self._run.finish()


class MlflowLogger:
    def __init__(self, *, run_dir: Path, run_name: str, tracking_uri: str, config: dict) -> None:
        import os

        import mlflow

        if not tracking_uri:  # MLflow 3 keeps its local file store behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        exp = self._client.get_experiment_by_name(run_name)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(run_name)
        self.run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in config.items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self._client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, kind: str, step: int, record: dict[str, Any]) -> None:
        for k, v in _scalars(record, kind).items():
            self._client.log_metric(self.run_id, k.replace("@", "_at_"), v, step=int(step))

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def build_loggers(cfg: TrainConfig) -> list:
    """The trackers named in `cfg.metrics.loggers` for run dir `cfg.output_dir` (empty by default)."""
    names = list(getattr(cfg.metrics, "loggers", []) or [])
    if not names:
        return []
    from scalerl_mega.config import flat_config

    check_loggers(cfg.metrics)
    run_dir, config = Path(cfg.output_dir), flat_config(cfg)
    out: list = []
    for name in names:
        if name == "wandb":
            out.append(WandbLogger(run_dir=run_dir, run_name=str(cfg.run_name), project=cfg.metrics.wandb_project,
                                   mode=cfg.metrics.wandb_mode, config=config))
        else:
            out.append(MlflowLogger(run_dir=run_dir, run_name=str(cfg.run_name),
                                    tracking_uri=cfg.metrics.mlflow_tracking_uri, config=config))
    return out
