"""HF model -> converter -> Megatron-Core model (trainer's build_model) on 2 gloo processes:
logits equal HF ``transformers`` logits, and export_hf_weights returns the HF checkpoint exactly.
One torchrun launch per architecture runs all its layouts (startup costs ~10 s per launch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scalerl_mega.convert.pipeline import convert_hf_to_megatron
from scalerl_mega.convert.tiny import save_tiny_hf

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _launch(tmp_path, hf, ckpt, layouts):
    out = str(tmp_path / "report.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           os.path.join(ROOT, "tests", "integration", "convert_worker.py"),
           "--hf-dir", hf, "--ckpt", ckpt, "--out", out, "--layouts", *layouts]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out) as f:
        return json.load(f)


def _check(report, hf_dir, layouts, *, full_export_layouts):
    from scalerl_mega.convert import tables
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.pipeline import load_hf_config

    order = tables.hf_names(dims_from_hf_config(load_hf_config(hf_dir)))
    for layout in layouts:
        ranks = report[layout]["ranks"]
        diffs = [r["logits_max_abs_diff"] for r in ranks if "logits_max_abs_diff" in r]
        assert diffs and max(diffs) <= 1e-5, (layout, diffs)
        assert max(r.get("logits_ref_abs_max", 0.0) for r in ranks) > 1.0  # logits are large enough for the check to bite
        exported = [n for r in ranks for n in r["export_order"]]
        assert all(not r["export_mismatch"] for r in ranks), (layout, [r["export_mismatch"] for r in ranks])
        assert sorted(exported) == sorted(order), layout  # every tensor exactly once over the stages
        if layout in full_export_layouts:  # one emitting rank, table order
            emitting = [r for r in ranks if r["export_order"]]
            assert len(emitting) == 1 and emitting[0]["export_order"] == order


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(900)
def test_llama4_logits_and_export_tp1_tp2_ep2_pp2(tmp_path):
    """Tiny Llama4ForCausalLM (chunk 8 over 44 tokens, Scout RoPE scaling past its original
    context, temperature tuning, QK norm, MoE); tp2 runs with sequence parallelism."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("llama4", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2, ep=2)  # load layouts differ from the checkpoint's
    layouts = ["tp1", "tp2", "ep2", "pp2_hf"]  # pp2_hf: load_hf_checkpoint directly
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp2", "ep2"))


@pytest.mark.slow  # ~60 s; the Llama-4 test covers the same loader/export paths in the default suite
@pytest.mark.timeout(900)
def test_llama_dense_logits_and_export_tp1_tp2_pp2(tmp_path):
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("llama", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, pp=2)
    layouts = ["tp1", "tp2", "pp2"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp2",))


@pytest.mark.slow  # ~40 s; the layouts are those of the test above, from Meta's multimodal checkpoint layout
@pytest.mark.timeout(900)
def test_llama4_conditional_checkpoint_logits_tp2_ep2_pp2(tmp_path):
    """Llama4ForConditionalGeneration checkpoint (text under `language_model.`, vision tower skipped):
    converted (tp2, ep2) and loaded directly (pp2_hf); logits equal the HF multimodal model's."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("llama4", hf, conditional=True)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2, ep=2)
    layouts = ["tp2", "ep2", "pp2_hf"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp2", "ep2"))


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(900)
def test_qwen3_tied_logits_and_export_tp1_tp2_pp2(tmp_path):
    """Tiny Qwen3ForCausalLM with tied embeddings (q/k norms, head_dim 32 != hidden / heads, RoPE base 1e6):
    logits <= 1e-5 from HF's at TP2 and at PP2, where the last stage's copy of the embedding is made equal
    to the first stage's by Megatron's embedding group (loaded from the converted and from the HF checkpoint)."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("qwen3", hf, tie=True)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2)
    layouts = ["tp1", "tp2", "pp2", "pp2_hf"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp1", "tp2"))


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(900)
def test_qwen3_moe_logits_and_export_tp2_ep2_pp2(tmp_path):
    """Tiny Qwen3MoeForCausalLM (4 experts top-2 renormalised, layer 1 dense through mlp_only_layers): TP2
    (with sequence parallelism), EP2 and PP2 straight from the HF checkpoint; each expert exported once."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("qwen3_moe", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, ep=2)
    layouts = ["tp2", "ep2", "pp2_hf"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp2", "ep2"))


@pytest.mark.slow  # ~25 s; the all-expert softmax (no renormalisation), Megatron's moe_router_pre_softmax=True
@pytest.mark.timeout(900)
def test_qwen3_moe_without_norm_topk_prob_logits_tp1_ep2(tmp_path):
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("qwen3_moe", hf, norm_topk_prob=False)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt)
    layouts = ["tp1", "ep2"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp1", "ep2"))


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(900)
def test_deepseek_v3_logits_and_export_tp1_tp2_ep2_pp2(tmp_path):
    """Tiny DeepseekV3ForCausalLM (MLA with q/kv LoRA ranks and decoupled RoPE dims, YaRN past its original
    context, a dense first layer, sigmoid group-limited routing on bias-corrected scores, shared experts,
    routed_scaling_factor): logits <= 1e-5 from HF's at one rank, TP2 (+SP), EP2 and PP2 (converted at TP2/EP2,
    loaded at other layouts; pp2_hf straight from the HF checkpoint); the score-correction bias exported back."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("deepseek_v3", hf)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2, ep=2)
    layouts = ["tp1", "tp2", "ep2", "pp2_hf"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp1", "tp2", "ep2"))


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(900)
def test_deepseek_v3_without_q_lora_logits_tp1_tp2(tmp_path):
    """Moonlight / DeepSeek-V2-Lite shape (`q_lora_rank` null: the query projected straight from the hidden
    states, no q norm): logits <= 1e-5 from HF's at one rank and TP2. megatron-core 0.19 would otherwise build a
    second RMSNorm into the query projection or refuse the layer (`mla.mla_without_q_lora`)."""
    hf, ckpt = str(tmp_path / "hf"), str(tmp_path / "mc")
    save_tiny_hf("deepseek_v3", hf, q_lora_rank=None)
    convert_hf_to_megatron(hf_dir=hf, out=ckpt, tp=2)
    layouts = ["tp1", "tp2"]
    _check(_launch(tmp_path, hf, ckpt, layouts), hf, layouts, full_export_layouts=("tp1", "tp2"))
