"""HF -> Megatron -> HF file conversion: bit-exact round trips, loadable output, clear errors."""

from __future__ import annotations

import json
import os

import pytest
import torch

from scalerl_mega.convert.pipeline import convert_hf_to_megatron
from scalerl_mega.convert.to_hf import convert_megatron_to_hf
from scalerl_mega.convert.st_io import SafetensorsDir
from scalerl_mega.convert.tiny import save_tiny_hf


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for arch in ("llama", "llama4"):
        out[arch] = str(root / arch)
        save_tiny_hf(arch, out[arch], max_shard_size="200KB")
    out["llama_tied"] = str(root / "llama_tied")
    save_tiny_hf("llama", out["llama_tied"], tie=True)
    out["llama4_conditional"] = str(root / "llama4_conditional")  # Meta's multimodal layout
    save_tiny_hf("llama4", out["llama4_conditional"], conditional=True, max_shard_size="200KB")
    return out


def _all(d):
    s = SafetensorsDir(d)
    return {n: s.get(n) for n in s.names()}


@pytest.mark.parametrize(
    "arch,layout",
    [("llama", {}), ("llama", {"tp": 2, "pp": 2}), ("llama_tied", {"tp": 2}), ("llama4", {}), ("llama4", {"tp": 2, "ep": 2}),
     ("llama4", {"pp": 2, "ep": 4}), ("llama4_conditional", {}), ("llama4_conditional", {"tp": 2, "pp": 2, "ep": 2})],
)
def test_round_trip_bit_exact(hf_dirs, tmp_path, arch, layout):
    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    convert_hf_to_megatron(hf_dir=hf_dirs[arch], out=mc, **layout)
    summary = convert_megatron_to_hf(ckpt=mc, out=back)
    src, dst = _all(hf_dirs[arch]), _all(back)
    assert sorted(src) == sorted(dst)
    for n in src:
        assert src[n].dtype == dst[n].dtype and torch.equal(src[n], dst[n]), n
    assert summary.tensors == len(src)


def test_output_loads_with_from_pretrained_and_gives_same_logits(hf_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    convert_hf_to_megatron(hf_dir=hf_dirs["llama4"], out=mc, tp=2, ep=2)
    convert_megatron_to_hf(ckpt=mc, out=back, max_shard_bytes=100_000)
    assert os.path.isfile(os.path.join(back, "model.safetensors.index.json"))
    a = AutoModelForCausalLM.from_pretrained(hf_dirs["llama4"], local_files_only=True)
    b = AutoModelForCausalLM.from_pretrained(back, local_files_only=True)
    ids = torch.randint(0, 100, (1, 10))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def _logits(model_dir, cls_name, ids):
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(model_dir, local_files_only=True).eval()
    # text only, a conditional model's forward is its language_model's; transformers 5.24.0's
    # Llama4ForConditionalGeneration.forward fails building its output without images (AttributeError)
    model = getattr(model, "language_model", model)
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_layouts_convert_into_each_other(hf_dirs, tmp_path):
    """conditional -> causal keeps the text model (same tensors, same logits) and warns that SGLang
    would skip the experts; causal -> conditional puts it under `language_model.`."""
    mc = str(tmp_path / "mc")
    summary = convert_hf_to_megatron(hf_dir=hf_dirs["llama4_conditional"], out=mc, tp=2)
    assert summary.layout == "conditional" and "non-text tensors" in summary.skipped[0]
    assert "vision_model" in summary.skipped[0] and "multi_modal_projector" in summary.skipped[0]
    causal = str(tmp_path / "causal")
    out = convert_megatron_to_hf(ckpt=mc, out=causal, layout="causal")
    assert any("skips the 8 fused expert tensors" in w and "--layout conditional" in w for w in out.warnings)
    src, got = _all(hf_dirs["llama4_conditional"]), _all(causal)
    text = {n[len("language_model."):]: t for n, t in src.items() if n.startswith("language_model.")}
    assert sorted(got) == sorted(text) and all(torch.equal(got[n], text[n]) for n in text)
    ids = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(0))
    want = _logits(hf_dirs["llama4_conditional"], "Llama4ForConditionalGeneration", ids)
    assert torch.equal(_logits(causal, "Llama4ForCausalLM", ids), want)

    mc2, cond = str(tmp_path / "mc2"), str(tmp_path / "cond")
    convert_hf_to_megatron(hf_dir=causal, out=mc2, ep=2)
    out = convert_megatron_to_hf(ckpt=mc2, out=cond, layout="conditional")
    assert any("without vision weights" in w for w in out.warnings)
    got = _all(cond)
    assert sorted(got) == sorted(f"language_model.{n}" for n in text)
    assert os.path.isfile(os.path.join(cond, "model.safetensors.index.json"))  # SGLang looks for vision weights there
    assert torch.equal(_logits(cond, "Llama4ForConditionalGeneration", ids), want)


def test_conditional_export_names_load_in_sglang_mllama4(hf_dirs, tmp_path):
    """Every text tensor of a conditional export lands on a distinct SGLang 0.5.23 parameter of the
    mllama4 loader (per its name rules), covering the whole text model; the causal layout loses the experts."""
    from scalerl_mega.convert.hf_layout import sglang_llama4_target

    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    convert_hf_to_megatron(hf_dir=hf_dirs["llama4_conditional"], out=mc)
    convert_megatron_to_hf(ckpt=mc, out=back)
    names = [n for n in _all(back) if n.startswith("language_model.")]
    targets = {sglang_llama4_target(n, kind="conditional") for n in names}
    assert None not in targets
    layers = 4
    want = {f"language_model.model.layers.{i}.{p}" for i in range(layers) for p in (
        "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
        "feed_forward.router.weight", "feed_forward.experts.w13_weight", "feed_forward.experts.w2_weight",
        "feed_forward.shared_expert.gate_up_proj.weight", "feed_forward.shared_expert.down_proj.weight")}
    want |= {"language_model.model.embed_tokens.weight", "language_model.model.norm.weight", "language_model.lm_head.weight"}
    assert targets == want
    causal = [n[len("language_model."):] for n in names]
    lost = sorted(n for n in causal if sglang_llama4_target(n, kind="causal") is None)
    assert lost == sorted(f"model.layers.{i}.feed_forward.experts.{p}" for i in range(layers) for p in ("down_proj", "gate_up_proj"))


def _rewrite(src_dir, dst_dir, edit):
    """Copy an HF checkpoint as a single safetensors file after ``edit(dict)``."""
    from safetensors.torch import save_file

    os.makedirs(dst_dir)
    tensors = _all(src_dir)
    edit(tensors)
    save_file(tensors, os.path.join(dst_dir, "model.safetensors"))
    with open(os.path.join(src_dir, "config.json")) as f, open(os.path.join(dst_dir, "config.json"), "w") as g:
        g.write(f.read())


def _nothing_written(out):
    return not os.path.exists(out) and not os.path.exists(out + ".partial")


def test_removed_tensor_is_named_and_nothing_written(hf_dirs, tmp_path):
    bad, out = str(tmp_path / "bad"), str(tmp_path / "out")
    name = "model.layers.1.feed_forward.experts.down_proj"
    _rewrite(hf_dirs["llama4"], bad, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=f"'{name}' is missing"):
        convert_hf_to_megatron(hf_dir=bad, out=out, tp=2, ep=2)
    assert _nothing_written(out)


def test_reshaped_tensor_names_both_shapes(hf_dirs, tmp_path):
    bad, out = str(tmp_path / "bad"), str(tmp_path / "out")
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite(hf_dirs["llama"], bad, lambda t: t.__setitem__(name, t[name][:16]))
    with pytest.raises(ValueError) as e:
        convert_hf_to_megatron(hf_dir=bad, out=out)
    assert name in str(e.value) and "(16, 64)" in str(e.value) and "(32, 64)" in str(e.value)
    assert _nothing_written(out)


def test_extra_tensor_and_arch_mismatch(hf_dirs, tmp_path):
    bad = str(tmp_path / "bad")
    _rewrite(hf_dirs["llama"], bad, lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        convert_hf_to_megatron(hf_dir=bad, out=str(tmp_path / "o1"))
    with pytest.raises(ValueError, match="'llama4' was requested"):
        convert_hf_to_megatron(hf_dir=hf_dirs["llama"], out=str(tmp_path / "o2"), expect_arch="llama4")
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by tp=4"):
        convert_hf_to_megatron(hf_dir=hf_dirs["llama"], out=str(tmp_path / "o3"), tp=4)
    assert _nothing_written(str(tmp_path / "o1")) and _nothing_written(str(tmp_path / "o3"))


def test_megatron_checkpoint_missing_tensor_is_named(hf_dirs, tmp_path):
    from safetensors.torch import save_file

    mc, out = str(tmp_path / "mc"), str(tmp_path / "back")
    convert_hf_to_megatron(hf_dir=hf_dirs["llama4"], out=mc, ep=2)
    rank_file = os.path.join(mc, "mp_rank_00_000_001", "model.safetensors")
    tensors = _all(os.path.dirname(rank_file))
    name = "decoder.layers.2.mlp.experts.linear_fc1.weight3"
    tensors.pop(name)
    save_file(tensors, rank_file)
    with pytest.raises(ValueError, match=f"'{name}' is missing"):
        convert_megatron_to_hf(ckpt=mc, out=out)
    assert _nothing_written(out)
    meta = json.load(open(os.path.join(mc, "megatron_convert.json")))
    assert meta["ep"] == 2 and meta["arch"] == "llama4"


def test_cli_round_trip(hf_dirs, tmp_path, capsys):
    import importlib.util

    def load(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "..", "..", "tools", f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    assert load("convert_hf_to_megatron").main(["--hf-dir", hf_dirs["llama"], "--out", mc, "--tp", "2", "--no-progress"]) == 0
    assert load("convert_megatron_to_hf").main(["--ckpt", mc, "--out", back, "--no-progress"]) == 0
    assert "sha256(all tensors)" in capsys.readouterr().out
    # Llama-4: the text-only layout warns (SGLang), --layout conditional writes Meta's layout
    mc4, causal, cond = str(tmp_path / "mc4"), str(tmp_path / "causal"), str(tmp_path / "cond")
    assert load("convert_hf_to_megatron").main(["--hf-dir", hf_dirs["llama4"], "--out", mc4, "--no-progress"]) == 0
    assert load("convert_megatron_to_hf").main(["--ckpt", mc4, "--out", causal, "--no-progress"]) == 0
    assert "warning: text-only Llama4ForCausalLM layout" in capsys.readouterr().err
    assert load("convert_megatron_to_hf").main(["--ckpt", mc4, "--out", cond, "--layout", "conditional", "--no-progress"]) == 0
    assert json.load(open(os.path.join(cond, "config.json")))["architectures"] == ["Llama4ForConditionalGeneration"]
    assert load("convert_hf_to_megatron").main(["--hf-dir", hf_dirs["llama"], "--out", mc]) == 2  # exists
