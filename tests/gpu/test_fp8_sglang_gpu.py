"""FP8 rollout on a real GPU SGLang server (the GPU kit's `fp8_sync` stage, tools/gpu_check.sh): a tiny Qwen3 (every
projection a multiple of 128 wide, as the block-FP8 kernels need) written as a blockwise FP8 checkpoint
(convert/fp8_io.py) and served with `--quantization fp8`; the weights of another seed are pushed in flight as FP8 +
`weight_scale_inv` (quant/fp8.py, through the project's SGLang engine; flattened buckets, so gloo carries uint8
bytes); the server's log-probs are then compared with the local engine's emulation (transformers with the
dequantized FP8 weights, W8A16 in FP32) and with the unquantized model.

Expected, not yet measured here (no GPU in the sessions that wrote it): SGLang's block kernel also quantizes
activations per 1x128 group (W8A8), so its log-probs differ from the W8A16 emulation by a few 1e-2 per token,
and they are closer to the emulation than to the unquantized weights. Skipped without CUDA or without the SGLang
environment (`SCALERL_SGLANG_PYTHON` or .venv-sglang, as the `sglang` suite)."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu

CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=128, tie_word_embeddings=False, max_position_embeddings=512)


def _model(seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**CONFIG, initializer_range=0.1)).float().eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)  # peakier next-token distributions: log-probs tell weights apart
    return model


def _fp8_of(model):
    """`model`'s tensors as an FP8 push sends them, and a copy of `model` holding their dequantized values."""
    import torch

    from scalerl_mega.quant import fp8

    pushed = list(fp8.quantize_named((n, t.detach().clone()) for n, t in model.state_dict().items()))
    emulated = copy.deepcopy(model)
    emulated.load_state_dict(dict(fp8.dequantize_named(pushed, dtype=torch.float32)))
    return pushed, emulated


def test_fp8_server_takes_fp8_pushes_and_matches_the_emulation(tmp_path):
    from tests.sglang_support.real_server import gpu_engine, require_gpu_sglang

    require_gpu_sglang()
    from scalerl_mega.convert.fp8_io import quantize_hf_dir
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.types import Prompt, SamplingParams
    from tests.sglang_support.oracle import abs_dlogp, collect
    from tests.sglang_support.tiny_model import train_tokenizer

    path = tmp_path / "qwen3_fp8"
    _model(0).save_pretrained(path)
    train_tokenizer(path)
    assert quantize_hf_dir(str(path)) == 2 * 7
    server, engine = gpu_engine(path, spec=LocalModelSpec(arch="qwen3", config=CONFIG, quantization="fp8"),
                                pause_mode="in_place", quantization="fp8")
    try:
        new = _model(1)
        pushed, emulated = _fp8_of(new)
        engine.update_weights(pushed, version=1)
        assert engine.version == 1 and engine.last_sync_stats.bytes < 0.6 * sum(
            t.numel() * 2 for t in new.state_dict().values())  # about half of a bf16 push
        prompt = [1, 44, 45, 46, 47, 48, 49, 50]
        engine.submit(Prompt(prompt_id="fp8", text="", task="synthetic", gold="0", token_ids=prompt),
                      SamplingParams(max_new_tokens=24, temperature=1.0, seed=3), n=4, version=1)
        emu, plain = abs_dlogp(collect(engine, 4), prompt, emulated, new, tokens=24, version=1)
        mean_emu, mean_plain = sum(emu) / len(emu), sum(plain) / len(plain)
        print(f"FP8 SGLang vs W8A16 emulation: mean |dlogp| {mean_emu:.3g}, max {max(emu):.3g}; "
              f"vs unquantized weights: mean {mean_plain:.3g}")
        assert mean_emu < 0.1 and mean_emu < mean_plain
    finally:
        engine.close()
        server.stop()
