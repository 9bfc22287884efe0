"""`model=hf` derives the trainer's model from config.json; an explicit preset is checked against it.

Configs below are the published `config.json` values of the named checkpoints (shapes only).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M-Instruct
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "vocab_size": 49152,
}
LLAMA32_1B = {  # meta-llama/Llama-3.2-1B
    "model_type": "llama", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "vocab_size": 128256,
}
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B, rms_norm_eps as float32 rounds 1e-5 (common in real files)
    "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rms_norm_eps": 9.999999747378752e-06, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "vocab_size": 128256,
}


def _ckpt(tmp_path: Path, cfg: dict, name: str = "ckpt") -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["output_dir=/tmp/scalerl-test", *overrides])
    return OmegaConf.to_object(cfg)


def test_model_hf_takes_smollm2_shapes_from_config_json(tmp_path):
    from scalerl_mega.model.hf_import import resolve_model

    c = resolve_model(_compose("experiment=scalerl", f"init_from_hf={_ckpt(tmp_path, SMOLLM2_135M)}", "model=hf"))
    m = c.model
    assert (m.arch, m.vocab_size, m.hidden_size, m.ffn_hidden_size, m.num_layers) == ("llama", 49152, 576, 1536, 30)
    assert (m.num_attention_heads, m.num_query_groups, m.kv_channels) == (9, 3, 64)
    assert (m.rope_theta, m.rope_scaling, m.norm_eps, m.tie_embeddings) == (100000.0, False, 1e-5, True)
    assert m.max_position_embeddings == 8192 and m.no_rope_freq == 0 and not m.is_moe
    assert m.fp32_lm_head is True  # kept from the precision group (fp32_head)
    # 135M parameters: embedding 49152*576 (tied) + 30 layers + final norm, counted independently
    layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576
    assert m.num_params()["total"] == 49152 * 576 + 30 * layer + 576 == 134_515_008


def test_llama32_rope_scaling_and_tied_embeddings(tmp_path):
    from scalerl_mega.model.hf_import import model_from_hf_dir

    m = model_from_hf_dir(_ckpt(tmp_path, LLAMA32_1B))
    assert m.rope_scaling is True and m.rope_scaling_factor == 32.0 and m.tie_embeddings is True
    assert (m.hidden_size, m.num_layers, m.kv_channels, m.rope_theta) == (2048, 16, 64, 500000.0)


def test_preset_matching_checkpoint_passes_with_float32_rounded_eps(tmp_path):
    from scalerl_mega.model.hf_import import model_mismatches
    from scalerl_mega.model.config import load_model_preset

    assert model_mismatches(load_model_preset("llama3_8b"), LLAMA31_8B) == []
    # a real relative difference is still caught
    assert model_mismatches(load_model_preset("llama3_8b"), dict(LLAMA31_8B, rms_norm_eps=1e-6)) == [
        "rms_norm_eps=1e-06 in config.json but model.norm_eps gives 1e-05"]


def test_dense_checkpoint_no_rope_layers_is_not_a_mismatch(tmp_path):
    """A real transformers-written dense Llama checkpoint matches the preset it was made from."""
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.hf_import import check_model_matches_hf
    from scalerl_mega.rollout.local import LocalModelSpec, build_model
    from scalerl_mega.model.config import load_model_preset

    preset = load_model_preset("tiny_dense")
    arch, kw = hf_config_from_model(preset)
    build_model(LocalModelSpec(arch=arch, config=kw)).save_pretrained(tmp_path / "hf")
    check_model_matches_hf(preset, tmp_path / "hf")  # raised "no_rope_layers=() ... (0, 0)" before


def test_explicit_preset_lists_every_mismatch_before_building(tmp_path):
    """experiment=scalerl (the 8B preset) on SmolLM2: one error listing all differing fields,
    raised at compose time (no model is built, so no 'built only on GPU' error)."""
    from scalerl_mega.model.hf_import import resolve_model

    c = _compose("experiment=scalerl", f"init_from_hf={_ckpt(tmp_path, SMOLLM2_135M)}")
    with pytest.raises(ValueError) as e:
        resolve_model(c)
    msg = str(e.value)
    for piece in ("hidden_size=576 in config.json but model.hidden_size gives 4096",
                  "num_layers=30", "num_heads=9", "num_kv_heads=3", "ffn_hidden_size=1536", "vocab_size=49152",
                  "tie_word_embeddings=True", "rope_theta=100000.0", "rope_scaling_factor=None",
                  "max_position_embeddings=8192", "model=hf"):
        assert piece in msg, piece
    assert "(14 field(s))" in msg and "head_dim=64 in config.json but model.head_dim gives 128" in msg
    assert "rope_high_freq_factor=None in config.json but model.rope_high_freq_factor gives 4.0" in msg


def test_llama4_text_and_multimodal_wrapper(tmp_path):
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.hf_import import model_from_hf_dir, model_mismatches
    from scalerl_mega.model.config import load_model_preset

    scout = load_model_preset("scout_17b16e")
    _, kw = hf_config_from_model(scout)
    text = {"model_type": "llama4_text", "hidden_act": "silu", **kw}
    assert model_mismatches(scout, text) == []
    m = model_from_hf_dir(_ckpt(tmp_path, text, "text"))
    mm = model_from_hf_dir(_ckpt(tmp_path, {"model_type": "llama4", "text_config": text}, "mm"))
    assert m == mm
    assert (m.arch, m.num_experts, m.no_rope_freq, m.attention_chunk_size, m.rope_scaling_factor) == (
        "llama4", 16, 4, 8192, 16.0)
    assert model_mismatches(dataclasses.replace(m, fp32_lm_head=False, init_method_std=0.5), text) == []


def test_model_hf_without_checkpoint_names_the_key():
    from scalerl_mega.model.hf_import import resolve_model

    with pytest.raises(ValueError, match=r"model=hf needs init_from_hf"):
        resolve_model(_compose("experiment=demo", "model=hf"))


def test_smollm2_cpu_experiment_validates(tmp_path):
    """docs/extending.md's real-model command composes and passes every compose-time check."""
    from scalerl_mega.config import validate
    from scalerl_mega.compose import prepare

    data = tmp_path / "problems.jsonl"  # as many distinct problems as the docs' command writes (every row is read)
    data.write_text("".join(f'{{"problem": "{i} + 1?", "answer": "{i + 1}"}}\n' for i in range(2000)))
    ckpt = _ckpt(tmp_path, SMOLLM2_135M)
    c = prepare(_compose("experiment=smollm2_cpu", f"init_from_hf={ckpt}",
                         f"data.train_files=[{data}]"))
    validate(c)
    assert (c.model.name, c.model.hidden_size, c.data.name, c.rollout.name, c.reward.require_think) == (
        "hf", 576, "polaris", "local", False)
    tool = prepare(_compose("experiment=smollm2_python_tool", f"init_from_hf={ckpt}",
                            f"data.train_files=[{data}]"))
    validate(tool)  # the multi-turn SmolLM2 example (docs/extending.md): the sandboxed Python tool as env=custom
    assert (tool.model.hidden_size, tool.env.name, tool.env.max_turns, tool.data.use_chat_template) == (
        576, "custom", 3, False)
    assert tool.env.custom["_target_"] == "scalerl_mega.episodes.examples.PythonTool"


UNUSABLE = {  # config.json contents a user could point init_from_hf at, and what the error says about them
    "qwen": ({"model_type": "qwen2", "hidden_size": 8}, "model_type='qwen2' is not supported"),
    "no_hidden": ({"model_type": "llama"}, "config key 'hidden_size' is missing"),
    "json_list": ([1, 2], "config.json holds a JSON list, not an object"),
    "mm_without_text": ({"model_type": "llama4", "text_config": "x"}, "model_type='llama4' (multimodal) without a "
                                                                       "text_config object"),
    "bias": ({"model_type": "llama", "attention_bias": True}, "attention_bias=True is not supported"),
}


@pytest.mark.parametrize("model", ["hf", "llama3_8b"])
@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_unusable_config_json_is_one_line_naming_init_from_hf(tmp_path, capsys, case, model):
    """An unusable config.json under an explicit preset said only `config.json: ...`
    (and a JSON list raised AttributeError); now `scalerl-train` exits 2 with one line naming the key."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from scalerl_mega.config import register_configs
    from scalerl_mega.run_dir import EXIT_CONFIG_ERROR, config_or_exit

    content, why = UNUSABLE[case]
    path = _ckpt(tmp_path, content)
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"output_dir={tmp_path / 'out'}", "experiment=scalerl",
                                                      f"model={model}", f"init_from_hf={path}"])
    with pytest.raises(SystemExit) as e:
        config_or_exit(cfg, validate_only=True)
    assert e.value.code == EXIT_CONFIG_ERROR == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: init_from_hf={path!r}: "), lines
    assert why in lines[0]


@pytest.mark.parametrize("file,arch,moe", [("Qwen3-0.6B.config.json", "qwen3", False),
                                           ("Qwen3-30B-A3B.config.json", "qwen3_moe", True)])
def test_model_hf_detects_qwen3_and_qwen3_moe(tmp_path, file, arch, moe):
    """`model=hf` on the published Qwen3 files: the architecture, QK-norm, head_dim independent of hidden /
    heads, tied embeddings (0.6B), and the MoE router (128 experts, top-8 renormalised, aux coefficient)."""
    from scalerl_mega.model.hf_import import resolve_model

    cfg = json.loads((REPO / "tests" / "data" / "hf_configs" / file).read_text())
    m = resolve_model(_compose("experiment=scalerl", f"init_from_hf={_ckpt(tmp_path, cfg)}", "model=hf")).model
    assert (m.arch, m.qk_layernorm, m.kv_channels, m.rope_theta, m.is_moe) == (arch, True, 128, 1e6, moe)
    assert m.tie_embeddings is (arch == "qwen3") and m.fp32_lm_head is True
    if moe:
        assert (m.num_experts, m.moe_topk, m.expert_ffn, m.shared_expert_ffn) == (128, 8, 768, 0)
        assert (m.moe_router_score_function, m.moe_router_pre_softmax, m.moe_aux_loss_coeff) == ("softmax", False, 0.001)
        assert all(m.is_moe_layer(i) for i in range(48)) and m.moe_dense_layers == []
    else:
        assert m.kv_channels * m.num_attention_heads == 2 * m.hidden_size  # 16 heads of 128 over hidden 1024
