"""The Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) through the converter and the trainer's Megatron
model on 2 gloo processes: logits equal transformers' FP32 logits within 1e-5 at TP1 / TP2 / EP2 (megatron's torch
GDN path against transformers' torch fallbacks), and the export gives every HF tensor back bit for bit. Each launch
costs about a minute of CPU (the torch chunked delta rule), so they run in the compatibility leg."""

from __future__ import annotations

import json

import pytest

from scalerl_mega.convert.pipeline import convert_hf_to_megatron
from scalerl_mega.convert.tiny import save_tiny_hf

from tests.integration.test_convert_megatron import _check, _launch


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_next_logits_and_export_tp1_tp2_ep2(tmp_path):
    """Fused per-key-head in_proj_qkvz / in_proj_ba, `layer_types` given; converted at TP2 x EP2, loaded at TP1
    (the sections re-split), TP2 (with sequence parallelism) and EP2."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("qwen3_next", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2, ep=2)
    layouts = ["tp1", "tp2", "ep2"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp1", "tp2", "ep2"))


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_5_dense_logits_tp1_tp2_with_layer_types_derived(tmp_path):
    """Split in_proj_qkv / z / b / a; config.json without `layer_types`, so the pattern comes from
    `full_attention_interval` (2: GDN, full, GDN) on both sides; TP2 straight from the HF checkpoint."""
    hf, ckpt = tmp_path / "hf", str(tmp_path / "mc")
    save_tiny_hf("qwen3_5", str(hf))
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg.pop("layer_types") == ["linear_attention", "full_attention", "linear_attention"]
    (hf / "config.json").write_text(json.dumps({**cfg, "full_attention_interval": 2}))
    convert_hf_to_megatron(hf_dir=str(hf), out=ckpt, tp=2)
    layouts = ["tp1", "tp2_hf"]
    _check(_launch(tmp_path, str(hf), ckpt, layouts), str(hf), layouts, full_export_layouts=("tp1", "tp2_hf"))


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_5_moe_logits_and_export_tp2_ep2(tmp_path):
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("qwen3_5_moe", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2, ep=2)
    layouts = ["tp2", "ep2"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp2", "ep2"))
