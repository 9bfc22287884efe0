"""Every shipped preset that names a published model matches that model's `config.json`.

The fixtures in tests/data/hf_configs/ are the published files' fields (sources in its README);
the check is the one `scalerl-train init_from_hf=<dir> model=<preset>` runs at compose time.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "hf_configs"
PUBLISHED = {  # preset -> its model's config.json (a new preset for a published model adds a row)
    "llama3_8b": "Llama-3.1-8B.config.json",
    "scout_17b16e": "Llama-4-Scout-17B-16E-Instruct.config.json",
    "qwen3_0p6b": "Qwen3-0.6B.config.json",
    "qwen3_8b": "Qwen3-8B.config.json",
    "qwen3_30b_a3b": "Qwen3-30B-A3B.config.json",
    "qwen3_235b_a22b": "Qwen3-235B-A22B.config.json",
    "moonlight_16b_a3b": "Moonlight-16B-A3B.config.json",
    "deepseek_v3_671b": "DeepSeek-V3.config.json",
    "qwen3_next_80b_a3b": "Qwen3-Next-80B-A3B-Instruct.config.json",
}
NOT_PUBLISHED = {"tiny_dense", "tiny_moe", "tiny_qwen3", "tiny_qwen3_moe", "tiny_deepseek_v3", "tiny_qwen3_next", "tiny_qwen3_5",
                 "tiny_qwen3_5_moe", "hf", "demo_moe", "demo_dense",
                 "gpu_check_0p5b"}  # toy shapes; `hf` takes its shapes from the checkpoint


def _ckpt_dir(tmp_path: Path, preset: str) -> Path:
    d = tmp_path / preset
    d.mkdir()
    shutil.copy(DATA / PUBLISHED[preset], d / "config.json")
    return d


def test_every_shipped_preset_has_its_published_config():
    presets = {p.stem for p in (REPO / "conf" / "model").glob("*.yaml")}
    assert presets - NOT_PUBLISHED == set(PUBLISHED), "add the published config.json of each new preset"
    for name in PUBLISHED.values():
        assert (DATA / name).is_file(), name


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_preset_passes_the_compose_time_check_against_its_published_config(tmp_path, preset):
    from test_hf_model_config import _compose

    from scalerl_mega.model.hf_import import model_mismatches, resolve_model

    d = _ckpt_dir(tmp_path, preset)
    cfg = _compose("experiment=scalerl", f"model={preset}", f"init_from_hf={d}")
    assert model_mismatches(cfg.model, json.loads((d / "config.json").read_text())) == []
    assert resolve_model(cfg) is cfg  # raises ValueError on any mismatch (exit 2 at validate)


def test_scout_fixture_is_the_multimodal_layout_and_a_wrong_context_is_caught(tmp_path):
    """The Scout file keeps the decoder under text_config; 262144 (the old preset value) is named."""
    from scalerl_mega.model.hf_import import check_model_matches_hf
    from scalerl_mega.model.config import load_model_preset

    cfg = json.loads((DATA / PUBLISHED["scout_17b16e"]).read_text())
    assert cfg["model_type"] == "llama4" and cfg["architectures"] == ["Llama4ForConditionalGeneration"]
    text = cfg["text_config"]
    assert (text["max_position_embeddings"], text["rope_scaling"]["factor"]) == (10485760, 16.0)
    assert text["no_rope_layers"].count(0) == 12 and len(text["moe_layers"]) == 48
    old = dataclasses.replace(load_model_preset("scout_17b16e"), max_position_embeddings=262144)
    with pytest.raises(ValueError, match=r"max_position_embeddings=10485760 in config.json but "
                                         r"model.max_position_embeddings gives 262144"):
        check_model_matches_hf(old, _ckpt_dir(tmp_path, "scout_17b16e"))


@pytest.mark.parametrize("preset,total,active", [("qwen3_0p6b", 0.596, 0.596), ("qwen3_8b", 8.19, 8.19),
                                                 ("qwen3_30b_a3b", 30.53, 3.35), ("qwen3_235b_a22b", 235.09, 22.19)])
def test_qwen3_presets_count_the_published_sizes(preset, total, active):
    """Parameter counts from the preset's shapes against the model cards (0.6B; 8.2B; 30.5B total, 3.3B
    active; 235B total, 22B active), to the card's precision."""
    from scalerl_mega.model.config import load_model_preset

    n = load_model_preset(preset).num_params()
    assert abs(n["total"] / 1e9 - total) < 0.01 and abs(n["active"] / 1e9 - active) < 0.01


def test_qwen3_moe_router_semantics_follow_norm_topk_prob(tmp_path):
    """norm_topk_prob=true is Megatron's softmax over the top-k logits (pre_softmax false); a preset with
    the all-expert softmax instead is named as a mismatch against the published file."""
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_import import check_model_matches_hf

    preset = load_model_preset("qwen3_30b_a3b")
    assert preset.moe_router_pre_softmax is False and json.loads((DATA / PUBLISHED["qwen3_30b_a3b"]).read_text())[
        "norm_topk_prob"] is True
    wrong = dataclasses.replace(preset, moe_router_pre_softmax=True)
    with pytest.raises(ValueError, match=r"moe_norm_topk=True in config.json but model.moe_router_pre_softmax"):
        check_model_matches_hf(wrong, _ckpt_dir(tmp_path, "qwen3_30b_a3b"))


@pytest.mark.parametrize("preset,total,active", [("moonlight_16b_a3b", 15.96, 2.91), ("deepseek_v3_671b", 671.03, 37.55)])
def test_deepseek_presets_count_the_published_sizes(preset, total, active):
    """Parameter counts from the preset's shapes (MLA attention, model/deepseek.py) against the model cards:
    Moonlight 16B total / 3B active; DeepSeek-V3 671B total / 37B active without the 14B multi-token-prediction
    module (the card's 685B counts it)."""
    from scalerl_mega.model.config import load_model_preset

    n = load_model_preset(preset).num_params()
    assert abs(n["total"] / 1e9 - total) < 0.01 and abs(n["active"] / 1e9 - active) < 0.01
