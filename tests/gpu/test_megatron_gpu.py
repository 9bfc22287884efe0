"""bf16 Megatron training step at TP1 over NCCL (world size 1, local spec), the on-device bf16 weight
export, and a checkpoint save -> load -> next step round trip with Megatron's GPU optimizer
(TransformerEngine's FusedAdam where TE is installed), on one GPU. Skipped without CUDA
(tests/conftest.py); run with `make test-gpu`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("megatron_bf16_worker.py")
RESUME_REL_TOL = 2e-6
"""Resumed vs uninterrupted loss, relative: the same kernels on the same inputs and weights give the
same float32 loss up to reduction-order noise (a couple of ulps); a lost Adam state moves it ~1e-3."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(mode: str, out: Path, name: str) -> dict:
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    proc = subprocess.run([sys.executable, str(WORKER), "--out", str(out), "--mode", mode], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    return _run("step", tmp_path_factory.mktemp("megatron_bf16"), "result.json")


@pytest.fixture(scope="module")
def resume(tmp_path_factory) -> dict:
    return _run("resume", tmp_path_factory.mktemp("megatron_resume"), "resume.json")


def test_bf16_training_step_over_nccl(result):
    assert result["backend"] == "nccl" and result["world_size"] == 1
    assert result["device"].startswith("cuda")
    assert result["param_devices"] == ["cuda"]
    assert result["body_dtypes"] == ["torch.bfloat16"], result["body_dtypes"]
    losses = result["loss"]
    # random init (std 0.02): logits near 0, so the first cross-entropy is close to ln(V) = ln 256
    assert abs(losses[0] - result["ln_vocab"]) < 0.1, losses
    # three Adam steps on the same batch at lr 5e-3 lower it; every figure finite
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(0 < g < float("inf") for g in result["grad_norm"]), result["grad_norm"]


def test_weight_export_stays_on_device_as_bf16(result):
    assert result["export_count"] > 0
    assert result["export_devices"] == ["cuda"], result["export_devices"]
    # the generator dtype for every tensor, head included (SGLang rounds a pushed head to its dtype on load)
    assert result["export_dtypes"] == ["torch.bfloat16"] and result["head_dtype"] == "torch.bfloat16"
    assert result["embed_shape"] == [256, 64]
    assert result["embed_equal"], "exported embedding differs from the live bf16 parameter"


def test_save_load_then_the_next_steps_match_the_uninterrupted_run(resume):
    """Loading used to put a per-parameter 'step' into TE FusedAdam's state (KeyError)."""
    if resume["te_installed"]:
        assert any(n.startswith("transformer_engine.") for n in resume["inner_optimizers"]), resume
    ref, got, fresh = resume["ref"], resume["resumed"], resume["fresh_optimizer"]
    for r, g in zip(ref, got):
        assert abs(g - r) <= RESUME_REL_TOL * abs(r), (ref, got)
    # control: the same weights with a fresh Adam state (zero moments, step 1) take a different second step
    assert abs(fresh[0] - ref[0]) <= RESUME_REL_TOL * abs(ref[0]), (ref, fresh)
    assert abs(fresh[1] - ref[1]) > 10 * RESUME_REL_TOL * abs(ref[1]), (ref, fresh)
