"""The SGLang backend's LoRA pieces without a server (rollout/sglang/adapters.py, launch flags, request bodies):
per-sample adapter holding and unloading, the payload SGLang unpickles, the linears of a manifest. The real server
is tests/sglang/test_real_lora.py."""

from __future__ import annotations

import base64
import pickle

import pytest
import torch

from scalerl_mega.rollout.sglang import generate_body, launch_command
from scalerl_mega.rollout.sglang.adapters import ServedAdapters, manifest_linears, tensors_payload
from scalerl_mega.rollout.sglang.launch import LoraServing, SGLangServerConfig
from scalerl_mega.weight_sync import TensorSpec, WeightManifest


def test_a_replaced_adapter_is_unloaded_when_its_last_sample_ends():
    served = ServedAdapters()
    assert served.acquire() is None  # before any adapter: the base model
    assert served.switch("policy-v1", 1) is None
    a, b = served.acquire(), served.acquire()
    assert a == b == ("policy-v1", 1)
    assert served.switch("policy-v2", 2) is None  # two samples still hold v1
    assert served.acquire() == ("policy-v2", 2)
    assert served.release("policy-v1") is None
    assert served.release("policy-v1") == "policy-v1"  # the last holder: unload now
    assert served.release("policy-v2") is None  # current: kept
    assert served.switch("policy-v3", 3) == "policy-v2"  # nobody holds v2: unload at once


def test_lora_launch_flags_and_request_field():
    cfg = SGLangServerConfig(model_path="/m", lora=LoraServing(max_rank=16, target_modules=("q_proj", "v_proj"),
                                                               backend="torch_native"))
    cmd = launch_command(cfg)
    i = cmd.index("--enable-lora")
    assert cmd[i:i + 8] == ["--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "q_proj", "v_proj",
                            "--lora-backend", "torch_native"]
    assert "--enable-lora" not in launch_command(SGLangServerConfig(model_path="/m"))
    with pytest.raises(ValueError, match="backend='cuda'"):
        LoraServing(max_rank=8, target_modules=("q_proj",), backend="cuda")
    body = generate_body(input_ids=[1], sampling_params={}, rid="r", return_routed_experts=False, lora_path="policy-v3")
    assert body["lora_path"] == "policy-v3"
    assert "lora_path" not in generate_body(input_ids=[1], sampling_params={}, rid="r", return_routed_experts=False)


def test_payload_carries_the_tensor_bytes_and_manifest_linears():
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    back = pickle.loads(base64.b64decode(tensors_payload([("x.lora_A.weight", a[:, 1:])])))
    assert torch.equal(back["x.lora_A.weight"], a[:, 1:]) and back["x.lora_A.weight"].is_contiguous()
    m = WeightManifest([TensorSpec("m.q_proj.weight", (8, 4), "float32"), TensorSpec("m.norm.weight", (4,), "float32"),
                        TensorSpec("m.q_proj.bias", (8,), "float32")], source="test")
    assert manifest_linears(m) == {"m.q_proj": (8, 4)}
