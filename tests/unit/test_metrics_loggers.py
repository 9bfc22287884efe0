"""`metrics.loggers=[wandb, mlflow]`: every metrics record is mirrored, W&B offline and MLflow local."""

from __future__ import annotations

import glob
import os
import struct
import zlib

import pytest


def test_wandb_offline_and_mlflow_local_receive_the_records(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
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
    # run.finish() can return before W&B's service has finished writing the run file: read right away, we saw
    # a chunk failing its checksum or no history at all (~1 in 5 reads). teardown() waits for the service,
    # as a process's exit does in W&B's atexit hook (a spawned trainer-like process kept all 199 of 199 steps).
    wandb.teardown()
    # MLflow: a local file store under the run dir, read back through its own client
    ml = loggers[1]
    client = mlflow.MlflowClient(tracking_uri=ml.tracking_uri)
    hist = client.get_metric_history(ml.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.5), (2, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(ml.run_id, "validation/val_pass_rate")] == [(2, 0.75)]
    assert client.get_metric_history(ml.run_id, "train/filtered") == []  # booleans are not metrics
    assert client.get_run(ml.run_id).data.params["loss.name"] == "cispo"
    # W&B offline: the run file's history records, decoded with W&B's own protobuf schema
    history = _wandb_history(tmp_path)
    # one history row per step (W&B merges the step's records); booleans are not metrics
    assert history == [(1, {"train/loss": "0.5"}), (2, {"train/loss": "0.25", "validation/val_pass_rate": "0.75"})]


_EXITING_RUN = """
import multiprocessing as mp, sys
from scalerl_mega.config import MetricsConfig, TrainConfig
from scalerl_mega.metrics.loggers import build_loggers
from scalerl_mega.metrics.writer import MetricsWriter

if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=print)  # a trainer has engine/reward processes
    child.start()
    cfg = TrainConfig(output_dir=sys.argv[1], run_name="t", metrics=MetricsConfig(loggers=["wandb"]))
    with MetricsWriter(sys.argv[1], loggers=build_loggers(cfg)) as w:
        for step in range(1, 51):
            w.write("train", step, {"loss": 1.0 / step})
    child.join()
"""


def test_wandb_run_file_is_complete_when_the_process_exits(tmp_path):
    """What `wandb sync` later uploads: every step, in order, once the training process has exited."""
    pytest.importorskip("wandb")
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(_EXITING_RUN)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": repo}
    subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, check=True, timeout=300,
                   capture_output=True)
    history = _wandb_history(tmp_path)
    assert [step for step, _ in history] == list(range(1, 51))
    assert all(float(items["train/loss"]) == 1.0 / step for step, items in history)


def _wandb_history(run_dir) -> list[tuple[int, dict[str, str]]]:
    """(step, {metric: JSON value}) per history record of the one W&B offline run under `run_dir`, W&B's own
    `_runtime`/`_timestamp`/`_step` left out."""
    path = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))[0]
    history = []
    for r in _wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            history.append((r.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
    return history


def _wandb_records(path):
    """The records of a W&B offline run file: a LevelDB-style log (7-byte file header ':W&B' + magic 0xBEE1 +
    version 0, then 32 KiB blocks of chunks with a 7-byte header crc32/length/type, FULL=1 FIRST=2 MIDDLE=3
    LAST=4, checksum crc32(type + data)), each record a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind == 0:  # zero padding
            continue
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"bad chunk checksum at byte {pos - 7 - n} of {path}"
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


@pytest.mark.parametrize("loggers, match", [(["tensorboardx"], r"metrics.loggers: 'tensorboardx' is not one of")])
def test_unknown_logger_is_a_config_error(loggers, match):
    from scalerl_mega.config import MetricsConfig
    from scalerl_mega.metrics.loggers import check_loggers

    with pytest.raises(ValueError, match=match):
        check_loggers(MetricsConfig(loggers=loggers))
