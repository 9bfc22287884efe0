"""Blockwise FP8 (scalerl_mega/quant/fp8.py): hand-worked blocks, the error bound of e4m3 rounding, bit-exact
re-quantization, the names that are quantized, and the scale convention against transformers' own FP8 loader."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl_mega.quant import fp8
from scalerl_mega.quant.checkpoint import checkpoint_fp8_block, fp8_quantization_config


def test_hand_worked_blocks():
    """2x2 blocks of a 3x3 weight: block (0,0) amax 3 -> scale 3/448, 1.0 -> 149.33 -> e4m3 144 (spacing 16 in
    [128, 256)) -> 144 * 3/448; block (1,0) amax 7 -> scale 7/448 = 1/64 (exact), 7 -> 448; zero blocks: scale 1."""
    w = torch.tensor([[1.0, -2.0, 0.0], [0.5, 3.0, 0.0], [7.0, 0.0, 0.0]])
    q, s = fp8.quantize_blockwise(w, block=(2, 2))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (3, 3)
    assert s.dtype == torch.float32 and s.shape == (2, 2)
    assert s[0, 1].item() == 1.0 and s[1, 1].item() == 1.0 and s[1, 0].item() == 1 / 64
    assert s[0, 0].item() == pytest.approx(3 / 448, rel=2.4e-7)
    assert q.float()[2, 0].item() == 448.0 and q.float()[1, 1].item() == 448.0
    assert q.float()[0, 0].item() == 144.0  # 448/3 = 149.33 rounds to 144 (next e4m3 value: 160)
    d = fp8.dequantize_blockwise(q, s, block=(2, 2))
    assert d[2, 0].item() == 7.0
    assert d[0, 0].item() == pytest.approx(144 * 3 / 448, rel=1e-6)


def _e4m3_grid() -> torch.Tensor:
    """Every finite non-negative float8_e4m3fn value, from the 256 bit patterns (an independent table)."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])


@pytest.mark.parametrize("shape", [(256, 384), (200, 130), (1, 5)])
def test_round_trip_is_nearest_e4m3_on_the_block_scale(shape):
    """Each dequantized value is the e4m3 grid point nearest to w / scale (a float64 search over the 126
    finite magnitudes), times the scale; the scale is amax/448 of its 128x128 block to one float32 ulp."""
    torch.manual_seed(0)
    w = torch.randn(shape) * torch.logspace(-3, 1, shape[1])[None, :]
    q, s = fp8.quantize_blockwise(w)
    assert s.shape == fp8.scale_shape(shape)
    grid = _e4m3_grid()
    full_s = s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[: shape[0], : shape[1]]
    x = (w.double() / full_s).abs()
    nearest = grid[(x[..., None] - grid).abs().argmin(-1)]
    assert torch.equal(q.double().abs(), nearest)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            amax = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max().item()
            assert s[i, j].item() == pytest.approx(amax / 448, rel=2.4e-7)
    err = (fp8.dequantize_blockwise(q, s).double() - w.double()).abs()
    assert (err <= torch.maximum(w.double().abs() / 16, full_s / 1024) * (1 + 1e-6)).all()
    assert err.max() > 0  # FP8 does round


def test_requantization_is_bit_exact():
    torch.manual_seed(1)
    for scale in (1e-4, 0.02, 3.0, 1e3):
        w = torch.randn(300, 260) * scale
        q, s = fp8.quantize_blockwise(w)
        q2, s2 = fp8.quantize_blockwise(fp8.dequantize_blockwise(q, s))
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


def test_which_tensors_are_fp8():
    lin = ["model.layers.3.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
           "model.layers.1.mlp.experts.7.gate_proj.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
           "model.layers.2.self_attn.kv_b_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight",
           "language_model.model.layers.0.feed_forward.shared_expert.down_proj.weight"]
    kept = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.mlp.gate.weight",
            "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_norm.weight",
            "model.layers.2.self_attn.kv_a_layernorm.weight", "model.layers.0.feed_forward.router.weight",
            "model.layers.0.mlp.gate.e_score_correction_bias"]
    assert all(fp8.is_fp8_weight(n, (8, 8)) for n in lin)
    assert not any(fp8.is_fp8_weight(n, (8, 8)) for n in kept)
    assert not fp8.is_fp8_weight("model.layers.0.feed_forward.experts.gate_up_proj", (4, 8, 16))  # fused 3-D
    out = list(fp8.quantize_named([("model.norm.weight", torch.ones(4)), (lin[0], torch.randn(130, 4))]))
    assert [(n, t.dtype, tuple(t.shape)) for n, t in out] == [
        ("model.norm.weight", torch.float32, (4,)), (lin[0], torch.float8_e4m3fn, (130, 4)),
        (lin[0] + "_scale_inv", torch.float32, (2, 1))]
    assert fp8.quantized_shapes(lin[0], (130, 4)) == [(lin[0], (130, 4), "float8_e4m3fn"),
                                                      (lin[0] + "_scale_inv", (2, 1), "float32")]
    back = fp8.dequantize_named(reversed(out))  # a scale may arrive before its weight
    assert [n for n, _ in back] == [lin[0], "model.norm.weight"] and back[0][1].dtype == torch.float32


def test_dequantize_named_names_a_missing_scale_or_weight():
    q, s = fp8.quantize_blockwise(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"'a.weight' came without its scale 'a.weight_scale_inv'"):
        fp8.dequantize_named([("a.weight", q)])
    with pytest.raises(ValueError, match=r"scale 'b.weight_scale_inv' came without"):
        fp8.dequantize_named([("b.weight_scale_inv", s)])


def test_bytes_per_param():
    assert fp8.bytes_per_param("none", dtype_bytes=2) == 2.0
    assert fp8.bytes_per_param("fp8") == 1 + 4 / 16384
    with pytest.raises(ValueError, match="quantization='int4'"):
        fp8.bytes_per_param("int4")


def test_checkpoint_quantization_config():
    assert checkpoint_fp8_block({"model_type": "qwen3"}, where="c") is None
    assert checkpoint_fp8_block({"quantization_config": fp8_quantization_config()}, where="c") == (128, 128)
    with pytest.raises(ValueError, match=r"c: quantization_config.quant_method='gptq' is not supported"):
        checkpoint_fp8_block({"quantization_config": {"quant_method": "gptq", "bits": 4}}, where="c")
    with pytest.raises(ValueError, match=r"weight_block_size=None: per-tensor FP8"):
        checkpoint_fp8_block({"quantization_config": {"quant_method": "fp8"}}, where="c")
    with pytest.raises(ValueError, match=r"compressed-tensors"):
        checkpoint_fp8_block({"text_config": {"quantization_config": {"quant_method": "compressed-tensors"}}}, where="c")


def test_scale_convention_matches_transformers_fp8_loader(tmp_path):
    """An independent implementation: transformers 5.23 loads our FP8 checkpoint (fine-grained FP8 path, which
    dequantizes on a machine without a GPU) into exactly our dequantized weights, every tensor."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from safetensors.torch import save_file

    cfg = transformers.Qwen3Config(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64, vocab_size=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).float()
    q = dict(fp8.quantize_named((k, v.detach().clone()) for k, v in model.state_dict().items()))
    assert sum(t.dtype == torch.float8_e4m3fn for t in q.values()) == 2 * 7
    save_file({k: v.contiguous() for k, v in q.items()}, str(tmp_path / "model.safetensors"))
    config = {**cfg.to_dict(), "architectures": ["Qwen3ForCausalLM"], "quantization_config": fp8_quantization_config()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).state_dict()
    ours = dict(fp8.dequantize_named(q.items()))
    assert set(loaded) == set(ours)
    for name, t in ours.items():
        assert torch.equal(loaded[name].float(), t), name
    w = model.state_dict()["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(ours["model.layers.0.mlp.down_proj.weight"], w)  # the check sees quantized values
