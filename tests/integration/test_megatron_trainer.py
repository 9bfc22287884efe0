"""MegatronPolicyTrainer (the PolicyTrainer seam) under real torchrun: TP2+SP, 2 processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("megatron_worker_trainer.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_policy_trainer_logprobs_and_save_load(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(WORKER), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "trainer.json").read_text())
    # forward-only FP32 log-probs give exactly the loss the next training step reports
    assert res["ce_from_logprobs"] == pytest.approx(res["loss_step2"], rel=1e-6)
    # save -> step 3 -> load -> step 3 again: identical (model + optimizer + step restored)
    assert res["step3_again"] == pytest.approx(res["step3"], rel=1e-6)
    assert res["extra"] == {"sampler": {"cursor": 17}}
    assert res["step_after"] == 3
