"""`metrics.loggers=[wandb, mlflow]`: every metrics record is mirrored, W&B offline and MLflow local."""

from __future__ import annotations

import glob
import re

import pytest


def test_wandb_offline_and_mlflow_local_receive_the_records(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from scalerl_mega.config import MetricsConfig, TrainConfig
    from scalerl_mega.metrics.loggers import build_loggers
    from scalerl_mega.metrics.writer import MetricsWriter

    cfg = TrainConfig(output_dir=str(tmp_path), run_name="t", metrics=MetricsConfig(loggers=["wandb", "mlflow"]))
    loggers = build_loggers(cfg)
    with MetricsWriter(tmp_path, loggers=loggers) as w:
        w.write("train", 1, {"loss": 0.5, "filtered": True})
        w.write("train", 2, {"loss": 0.25})
        w.write("validation", 2, {"val_pass_rate": 0.75})
    # MLflow: a local file store under the run dir, read back through its own client
    ml = loggers[1]
    client = mlflow.MlflowClient(tracking_uri=ml.tracking_uri)
    hist = client.get_metric_history(ml.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.5), (2, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(ml.run_id, "validation/val_pass_rate")] == [(2, 0.75)]
    assert client.get_metric_history(ml.run_id, "train/filtered") == []  # booleans are not metrics
    assert client.get_run(ml.run_id).data.params["loss.name"] == "cispo"
    # W&B offline: the run file holds the history items (key, JSON value) in step order
    data = open(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))[0], "rb").read()
    values = [v.decode() for v in re.findall(rb"train/loss\x82\x01.([0-9.]+)", data)]
    assert values and set(values) == {"0.5", "0.25"} and values.index("0.5") < values.index("0.25")
    assert b"validation/val_pass_rate" in data and b"train/filtered" not in data


@pytest.mark.parametrize("loggers, match", [(["tensorboardx"], r"metrics.loggers: 'tensorboardx' is not one of")])
def test_unknown_logger_is_a_config_error(loggers, match):
    from scalerl_mega.config import MetricsConfig
    from scalerl_mega.metrics.loggers import check_loggers

    with pytest.raises(ValueError, match=match):
        check_loggers(MetricsConfig(loggers=loggers))
