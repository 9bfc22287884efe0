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


def _grad_report(tmp_path, hf: str, layouts: list[str]) -> dict:
    import os
    import subprocess
    import sys

    from tests.integration.test_convert_megatron import ROOT

    out = str(tmp_path / "grads.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           os.path.join(ROOT, "tests", "integration", "gdn_grad_worker.py"), "--hf-dir", hf, "--out", out,
           "--layouts", *layouts]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(open(out).read())


@pytest.mark.compat
@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_gdn_gradients_match_transformers_tp1_tp2(tmp_path, arch):
    """One backward of sum(logits * W): every GDN tensor's gradient (the TP2 shards gathered) equals transformers'
    within 5e-5 of that tensor's largest gradient (the replicated gated-norm weight included, whose per-rank
    gradients are summed over TP; Qwen3-Next: TP2 with sequence parallelism), the decay parameters A_log and dt_bias
    within 1e-3: their gradients sum many cancelling terms, and transformers' own FP32 gradient of them differs from
    its FP64 one by 8.6e-5 of the largest on this model (measured once; the other tensors: up to 1.2e-5)."""
    save_tiny_hf(arch, str(tmp_path / "hf"))
    report = _grad_report(tmp_path, str(tmp_path / "hf"), ["tp1", "tp2"])
    assert report["tensors"] == 12  # 6 kinds x 2 GDN layers
    for layout in ("tp1", "tp2"):
        assert set(report[layout]) == {"in_proj.weight", "conv1d.weight", "A_log", "dt_bias", "out_norm.weight",
                                       "out_proj.weight"}
        decay = ("A_log", "dt_bias")
        assert max(v for k, v in report[layout].items() if k not in decay) < 5e-5, (layout, report[layout])
        assert max(report[layout][k] for k in decay) < 1e-3, (layout, report[layout])


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_trainer_loads_a_multimodal_qwen3_5_moe_checkpoint_directly(tmp_path):
    """`init_from_hf` at a published-layout (multimodal) Qwen3.5-MoE checkpoint: the trainer's model, loaded from
    `model.language_model.*`, gives the multimodal model's text logits within 1e-5 (FP32)."""
    import os
    import subprocess
    import sys

    from tests.integration.test_convert_megatron import ROOT

    hf = str(tmp_path / "hf")
    save_tiny_hf("qwen3_5_moe", hf, conditional=True)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")  # one process: init_parallel picks a free port
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "integration", "gdn_vl_worker.py"), hf,
                           "Qwen3_5MoeForConditionalGeneration"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    diff, ref = map(float, next(line for line in proc.stdout.splitlines() if line.startswith("diff ")).split()[1:])
    assert diff <= 1e-5 and ref > 1.0, (diff, ref)
