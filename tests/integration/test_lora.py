"""LoRA on the Megatron trainer (`peft=lora`, trainer/megatron/lora.py), FP32 on CPU (tests/integration/lora_worker.py):

- the trainable parameters are exactly the adapters, as many as r (in + out) summed over the adapted linears
  (counted by hand below), and they are all DDP's gradient buffers and the optimizer holds;
- with B = 0 the log-probs equal the `peft=none` model's bit for bit; two steps change every B and no base weight;
- the PEFT export loaded by HF transformers + `peft.PeftModel.from_pretrained` gives the trainer's log-probs
  within 1e-5;
- an adapter-only checkpoint resumes exactly (save, step, load, step: the same loss and log-probs) and loads under
  TP2 with sequence parallelism (resharded); `tools/convert_megatron_to_hf.py --peft-out` writes the adapter the
  trainer exported, bit for bit, and `--merge-lora` an HF checkpoint with the trainer's log-probs within 1e-5;
- TP2 + sequence parallelism (Llama) and EP2 (Qwen3-MoE, expert adapters) train the same adapters as one rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mp_launch import run_single_worker

WORKER = Path(__file__).with_name("lora_worker.py")
REPO = Path(__file__).resolve().parents[2]
R = 4

# tiny_qwen3 (conf/model/tiny_qwen3.yaml): hidden 64, 4 query heads, 2 kv heads, head_dim 32, ffn 128, 2 layers.
# Per layer, r (in + out): qkv 4 (64 + (4 + 2 * 2) * 32) = 1280; o 4 (4 * 32 + 64) = 768; fc1 4 (64 + 2 * 128) = 1280;
# fc2 4 (128 + 64) = 768: 4096 per layer, 8192 for two.
QWEN3_TRAINABLE = 8192
# tiny_dense (Llama): hidden 64, 4 heads of 16, 2 kv heads, ffn 128, 2 layers: qkv 4 (64 + 8 * 16) = 768;
# o 4 (64 + 64) = 512; fc1 1280; fc2 768: 3328 per layer.
LLAMA_TRAINABLE = 6656
# tiny_qwen3_moe: 4 layers as tiny_qwen3's attention (1280 + 768 each), layer 1 dense (fc1 1280 + fc2 768), layers
# 0, 2, 3 with 4 experts of width 32: fc1 4 (64 + 64) = 512, fc2 4 (32 + 64) = 384 per expert.
MOE_TRAINABLE = 4 * (1280 + 768) + (1280 + 768) + 3 * 4 * (512 + 384)


def _one_rank(out: Path, model: str, *extra: str) -> dict:
    return run_single_worker(str(WORKER), out / "one.json", args=("--model", model, *extra))


def _torchrun(out: Path, model: str, *extra: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={port}", str(WORKER), "--worker", str(out / "two.json"), "--model", model, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "two.json").read_text())


def _check_one_rank(res: dict, trainable: int) -> None:
    assert res["trainable"] == trainable
    assert res["trainable_names_all_lora"]
    assert res["ddp_buffer_numel"] == trainable  # no gradient buffer for the base
    assert res["optimizer_param_numel"] == trainable  # no optimizer state for the base
    assert res["base_equal_to_peft_none"] and res["step0_bitwise"]
    assert res["frozen_unchanged_after_steps"] and res["every_B_nonzero"]
    assert res["resume_loss"][0] == res["resume_loss"][1] and res["resume_logp_equal"]
    assert res["peft_bytes"] == res["exported_bytes"]


def _same_adapters(one: Path, two: Path, *, atol: float) -> None:
    import torch

    a, b = torch.load(one), torch.load(two)
    assert sorted(a["named"]) == sorted(b["named"])
    worst = max(float((a["named"][k] - b["named"][k]).abs().max()) for k in a["named"])
    assert worst <= atol, worst
    rows = b["logp"].abs().sum(1) > 0  # a data-parallel rank returns the rows it executed
    diff = ((a["logp"] - b["logp"]).abs() * a["mask"])[rows]
    assert rows.any() and float(diff.max()) <= 1e-5, float(diff.max())


def test_qwen3_lora_one_rank_frozen_base_peft_export_and_resume(tmp_path):
    res = _one_rank(tmp_path, "tiny_qwen3", "--hf-check")
    _check_one_rank(res, QWEN3_TRAINABLE)
    assert res["adapter_moved_logp_max"] > 0.05  # the adapters changed the model's log-probs
    assert res["hf_vs_megatron_max_abs"] <= 1e-5
    cfg = res["adapter_config"]
    assert (cfg["peft_type"], cfg["task_type"], cfg["r"], cfg["lora_alpha"], cfg["use_rslora"], cfg["use_dora"]) == (
        "LORA", "CAUSAL_LM", R, 8.0, False, False)
    assert cfg["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    # the PEFT export: B rows once, A once per HF projection (q/k/v share one, gate/up another), FP32
    per_layer = R * (64 * 3 + 256) + R * (128 + 64) + R * (64 * 2 + 256) + R * (128 + 64)
    assert res["peft_bytes"] == 2 * per_layer * 4
    _convert_and_check(tmp_path)


def _convert_and_check(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from lora_worker import _batch
    from scalerl_mega.model.peft_files import read_peft_adapter

    cmd = [sys.executable, "tools/convert_megatron_to_hf.py", "--ckpt", str(tmp_path / "lora_ckpt_1rank"),
           "--peft-out", str(tmp_path / "peft"), "--merge-lora", "--out", str(tmp_path / "merged")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = torch.load(tmp_path / "one.pt")
    config, tensors = read_peft_adapter(tmp_path / "peft")
    assert config["r"] == R and sorted(tensors) == sorted(one["named"])
    assert all(torch.equal(tensors[k], one["named"][k]) for k in tensors)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
    probe = _batch(9, merged.config.vocab_size)  # the worker's probe batch
    with torch.no_grad():
        logits = merged(input_ids=probe.input_ids_BT, position_ids=probe.position_ids_BT).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, probe.targets_BT.unsqueeze(-1)).squeeze(-1)
    assert float(((logp - one["logp"]).abs() * one["mask"]).max()) <= 1e-5


@pytest.mark.slow
def test_llama_lora_tp2_sequence_parallel_matches_one_rank_and_resumes_its_checkpoint(tmp_path):
    one = _one_rank(tmp_path, "tiny_dense", "--hf-check")
    _check_one_rank(one, LLAMA_TRAINABLE)
    assert one["hf_vs_megatron_max_abs"] <= 1e-5
    two = _torchrun(tmp_path, "tiny_dense", "--tp", "2", "--sp", "--resume-from", str(tmp_path / "lora_ckpt_1rank"))
    assert two["resume_loss"][0] == two["resume_loss"][1] and two["resume_logp_equal"]
    _same_adapters(tmp_path / "one.pt", tmp_path / "two.pt", atol=5e-5)
    import torch

    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert float(((a["logp"] - b["logp_resumed"]).abs() * a["mask"]).max()) <= 1e-5


@pytest.mark.slow
def test_qwen3_moe_expert_lora_ep2_matches_one_rank(tmp_path):
    one = _one_rank(tmp_path, "tiny_qwen3_moe", "--base", str(tmp_path / "base.pt"))
    _check_one_rank(one, MOE_TRAINABLE)
    two = _torchrun(tmp_path, "tiny_qwen3_moe", "--ep", "2", "--base", str(tmp_path / "base.pt"))
    # DP 2: the distributed optimizer (its load keeps a step per parameter: test_megatron_ep_resume.py)
    assert two["resume_loss"][0] == two["resume_loss"][1] and two["resume_logp_equal"]
    assert two["resume_grad_norm"][0] == two["resume_grad_norm"][1]
    _same_adapters(tmp_path / "one.pt", tmp_path / "two.pt", atol=2e-4)
