"""models.py pieces that need no process group: spec rewriting, the Llama-4 hook, the FP32 head."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from scalerl_mega.trainer.megatron import models  # noqa: E402
from scalerl_mega.model.config import ModelConfig  # noqa: E402


def _classes(spec, out):
    if isinstance(spec, type):
        out.append(spec)
    elif isinstance(spec, (list, tuple)):
        for s in spec:
            _classes(s, out)
    elif dataclasses.is_dataclass(spec):
        for f in dataclasses.fields(spec):
            _classes(getattr(spec, f.name), out)
    return out


def test_local_spec_norms_replaced_by_sequence_parallel_norm():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from scalerl_mega.trainer.megatron.cpu_compat import SequenceParallelTorchNorm

    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    before = _classes(spec, [])
    assert before.count(WrappedTorchNorm) >= 3  # input, pre-MLP, q and k norms
    new = models.replace_in_spec(spec, WrappedTorchNorm, SequenceParallelTorchNorm)
    after = _classes(new, [])
    assert WrappedTorchNorm not in after
    assert after.count(SequenceParallelTorchNorm) == before.count(WrappedTorchNorm)
    assert _classes(spec, []) == before  # the original spec is not modified


LLAMA4 = "scalerl_mega.trainer.megatron.llama4"


def test_llama4_features_without_llama4_module_raise_not_implemented(monkeypatch):
    monkeypatch.setitem(sys.modules, LLAMA4, None)  # makes the import fail
    monkeypatch.delattr(sys.modules["scalerl_mega.trainer.megatron"], "llama4", raising=False)
    cfg = ModelConfig(arch="llama4", no_rope_freq=4).validate()
    with pytest.raises(NotImplementedError, match="no_rope_freq=4"):
        models.layer_spec(cfg, None, use_te=False)


def test_llama4_features_use_llama4_layer_spec(monkeypatch):
    calls = []
    fake = types.ModuleType(LLAMA4)
    fake.llama4_layer_spec = lambda cfg, use_te: calls.append((cfg, use_te)) or "SPEC"
    monkeypatch.setitem(sys.modules, LLAMA4, fake)
    monkeypatch.setattr(sys.modules["scalerl_mega.trainer.megatron"], "llama4", fake, raising=False)
    cfg = ModelConfig(arch="llama4", attention_chunk_size=8192, qk_l2_norm=True).validate()
    assert models.layer_spec(cfg, None, use_te=False) == "SPEC"
    assert calls == [(cfg, False)]


def test_fp32_lm_head_computes_logits_in_fp32():
    torch.manual_seed(0)
    model = types.SimpleNamespace(output_layer=torch.nn.Linear(16, 8, bias=False).to(torch.bfloat16))
    w64 = model.output_layer.weight.double()
    x = torch.randn(4, 16).to(torch.bfloat16)
    bf16_logits = model.output_layer(x)
    models.ensure_fp32_lm_head(model)
    models.ensure_fp32_lm_head(model)  # idempotent: one hook
    logits = model.output_layer(x)
    assert model.output_layer.weight.dtype == torch.float32 and logits.dtype == torch.float32
    ref = x.double() @ w64.T
    err32 = (logits.double() - ref).abs().max().item()
    err16 = (bf16_logits.double() - ref).abs().max().item()
    assert err32 < 1e-5 < err16
    assert len(model.output_layer._forward_pre_hooks) == 1


def test_qwen3_moe_transformer_config():
    """Qwen3-MoE in Megatron's terms: per-head q/k norm, kv_channels independent of hidden / heads, RoPE base
    1e6 (build_model), softmax top-2 over the top-k logits (renormalised), the dense layer as a 0 in the
    moe_layer_freq list, the configured aux-loss coefficient, and no shared expert."""
    from scalerl_mega.model.config import ParallelConfig, load_model_preset

    m = load_model_preset("tiny_qwen3_moe")
    t = models.transformer_config(m, ParallelConfig())
    assert (t.qk_layernorm, t.kv_channels, t.num_attention_heads, t.hidden_size) == (True, 32, 4, 64)
    assert (t.moe_layer_freq, t.num_moe_experts, t.moe_router_topk, t.moe_ffn_hidden_size) == ([1, 0, 1, 1], 4, 2, 32)
    assert (t.moe_router_score_function, t.moe_router_pre_softmax, t.moe_aux_loss_coeff) == ("softmax", False, 0.001)
    assert t.moe_shared_expert_intermediate_size is None and t.moe_router_load_balancing_type == "aux_loss"
    every = models.transformer_config(dataclasses.replace(m, moe_dense_layers=[]), ParallelConfig())
    assert every.moe_layer_freq == 1


def test_tied_head_under_the_fp32_hook_runs_the_log_softmax_in_fp32():
    """Tied embeddings with bf16 params (Qwen3-0.6B, Llama-3.2-1B): the head's weight is the bf16 embedding,
    the hook upcasts it, and the log-softmax must run on those FP32 logits, not on a bf16 copy of them."""
    emb = torch.nn.Parameter(torch.randn(8, 16).to(torch.bfloat16))
    gpt = types.SimpleNamespace(post_process=True, share_embeddings_and_output_weights=True,
                                output_layer=types.SimpleNamespace(weight=None),
                                shared_embedding_or_output_weight=lambda: emb)
    assert models.head_dtype(gpt) == torch.bfloat16  # bf16_head: the shared weight's dtype
    gpt.output_layer._scalerl_fp32 = True  # what ensure_fp32_lm_head marks
    assert models.head_dtype(gpt) == torch.float32
