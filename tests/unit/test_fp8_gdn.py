"""FP8 weight sync of the Gated DeltaNet hybrids (quant/fp8.py): a GDN layer's input projections travel in blockwise
FP8 as SGLang serves them from the published FP8 checkpoints (Qwen3-Next's `in_proj_qkvz`, Qwen3.5's `in_proj_qkv`
and `in_proj_z`, and `out_proj`), while the beta/decay projections (`in_proj_ba`; `in_proj_b`, `in_proj_a`) and
conv1d keep the model's dtype. A push of the tiny presets into an FP8 local engine lands the dequantized FP8 values;
the engine's log-probs equal a full forward of the dequantized model and stay within the FP8 tolerance of
tests/gpu/test_fp8_sglang_gpu.py of the unquantized one. An FP8 checkpoint written here lists the b/a projections in
`modules_to_not_convert` (what SGLang's `Fp8Config` reads to build them unquantized; no GPU here to serve it)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from scalerl_mega.quant import fp8

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-5
"""Engine log-probs against a full forward of the same weights (tests/unit/test_engine_gdn.py)."""
FP8_MEAN_DLOGP = 0.1
"""Mean |log-prob difference| per token allowed for an FP8 generator (tests/gpu/test_fp8_sglang_gpu.py)."""
QUANTIZED = {"qwen3_next": ("in_proj_qkvz", "out_proj"), "qwen3_5_moe": ("in_proj_qkv", "in_proj_z", "out_proj")}
KEPT = {"qwen3_next": ("in_proj_ba", "conv1d"), "qwen3_5_moe": ("in_proj_b", "in_proj_a", "conv1d")}


def _spec(name: str, **kw):
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.hybrid import linear_layers
    from scalerl_mega.rollout.local_spec import LocalModelSpec

    cfg = load_model_preset(name)
    arch, kwargs = hf_config_from_model(cfg)
    return LocalModelSpec(arch=arch, config=kwargs, **kw), linear_layers(cfg)


def _trained(name: str):
    """An unquantized model of seed 1 (the trainer's weights) and its tensors under their checkpoint names."""
    from scalerl_mega.rollout.hf_params import checkpoint_target
    from scalerl_mega.rollout.local_spec import build_model, model_manifest

    spec, _ = _spec(name, init_seed=1)
    model = build_model(spec)
    with torch.no_grad():  # sharpen the random model so that tokens depend on the weights
        model.get_output_embeddings().weight.mul_(8.0)
    params = dict(model.named_parameters())
    return model, [(n, checkpoint_target(params, n).detach().clone()) for n in model_manifest(spec).specs]


def _logprobs(model, prompt: list[int], output: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].double(), dim=-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


@pytest.mark.parametrize("name", ["tiny_qwen3_next", "tiny_qwen3_5_moe"])
def test_fp8_push_quantizes_the_gdn_input_projections(name):
    from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
    from scalerl_mega.rollout.hf_params import checkpoint_target
    from scalerl_mega.rollout.local_spec import build_model, model_manifest
    from scalerl_mega.types import SamplingParams
    from scalerl_mega.weight_sync import spec_of

    spec, gdn_layers = _spec(name, quantization="fp8")
    trained, named = _trained(name)
    pushed = list(fp8.quantize_named(named))
    got = dict(pushed)
    for i in gdn_layers:
        base = f"model.layers.{i}.linear_attn."
        for proj in QUANTIZED[spec.arch]:
            w = base + proj + ".weight"
            rows, cols = got[w].shape
            assert got[w].dtype == torch.float8_e4m3fn, w
            assert got[w + "_scale_inv"].dtype == torch.float32
            assert got[w + "_scale_inv"].shape == (math.ceil(rows / 128), math.ceil(cols / 128))
        for proj in KEPT[spec.arch]:
            assert got[base + proj + ".weight"].dtype == torch.float32 and base + proj + ".weight_scale_inv" not in got
    model_manifest(spec).check([spec_of(n, t) for n, t in pushed], version=1)  # the FP8 engine's manifest agrees

    core = GenerationCore(build_model(spec), config=CoreConfig(max_batch=2, max_seq_len=24))
    core.load_weights([(n, t) for n, _, t in core.check_weights(pushed)])
    core.set_version(1)
    emulated = build_model(spec.__class__(arch=spec.arch, config=spec.config, init_seed=1))  # FP32 reference
    params = dict(emulated.named_parameters())
    with torch.no_grad():
        for n, t in fp8.dequantize_named(pushed):
            checkpoint_target(params, n).copy_(t)
    qkv = f"model.layers.{gdn_layers[0]}.linear_attn.{QUANTIZED[spec.arch][0]}.weight"
    engine_w = dict(core.model.named_parameters())[qkv]
    assert torch.equal(engine_w, params[qkv]) and not torch.equal(engine_w, dict(named)[qkv])  # FP8 values landed
    for i, prompt in enumerate([[3, 17, 40, 8, 9], [5, 9, 2]]):
        core.add(GenRequest(rid=str(i), prompt_id=str(i), sample_index=0, prompt_ids=prompt, seed=100 + i,
                            sampling=SamplingParams(max_new_tokens=12, temperature=1.0)))
    diffs = []
    for c in core.run_until_done():
        assert c.weight_versions == [1] * 12
        emu = _logprobs(emulated, c.prompt_ids, c.output_ids)
        assert max(abs(a - b) for a, b in zip(emu, c.gen_logprobs)) < TOL
        diffs += [abs(a - b) for a, b in zip(_logprobs(trained, c.prompt_ids, c.output_ids), c.gen_logprobs)]
    assert 0 < sum(diffs) / len(diffs) < FP8_MEAN_DLOGP


@pytest.mark.parametrize("name", ["tiny_qwen3_next", "tiny_qwen3_5_moe"])
def test_fp8_checkpoint_lists_the_gdn_gate_projections_unconverted(name, tmp_path):
    """`quantize_hf_dir` writes the b/a projections of every GDN layer into `modules_to_not_convert` (SGLang's
    `Fp8Config` then builds them unquantized, as the weights it is pushed); transformers' fine-grained FP8 loader
    (an independent implementation, dequantizing on CPU) reads the checkpoint back as exactly our dequantized
    weights, the unconverted projections as stored."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from scalerl_mega.convert.fp8_io import quantize_hf_dir

    spec, gdn_layers = _spec(name)
    trained, named = _trained(name)
    trained.save_pretrained(tmp_path)
    quantize_hf_dir(str(tmp_path))
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    kept = [p for p in KEPT[spec.arch] if p != "conv1d"]
    assert qc["modules_to_not_convert"] == sorted(f"model.layers.{i}.linear_attn.{p}" for i in gdn_layers for p in kept)
    from scalerl_mega.rollout.hf_params import checkpoint_target

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    params = dict(loaded.named_parameters())
    ours = dict(fp8.dequantize_named(fp8.quantize_named(named)))
    for n, t in ours.items():
        assert torch.equal(checkpoint_target(params, n).float(), t), n
