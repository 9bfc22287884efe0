"""Format detection and named errors of convert_megatron_to_hf for trainer checkpoints (no model
is built: every case fails before a process group starts), and the model_config.json sidecar."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from scalerl_mega.convert.to_hf import checkpoint_format, convert_megatron_to_hf
from scalerl_mega.trainer.megatron import checkpoint
from scalerl_mega.model.config import ModelConfig


def _step_dir(root, *, step=3, model: ModelConfig | None = None, sidecar: str | None = None):
    d = root / checkpoint.step_dirname(step)
    d.mkdir(parents=True)
    (d / checkpoint.COMPLETE).write_text(json.dumps({"step": step}))
    if model is not None:
        sidecar = json.dumps({"format": checkpoint.MODEL_CONFIG_FORMAT, "model": dataclasses.asdict(model)})
    if sidecar is not None:
        (d / checkpoint.MODEL_CONFIG).write_text(sidecar)
    return d


def _moe() -> ModelConfig:
    return ModelConfig(name="m", arch="llama4", num_experts=4, moe_topk=1, moe_ffn_hidden_size=64, shared_expert_ffn=64,
                       moe_router_score_function="sigmoid", moe_apply_probs_on_input=True, no_rope_freq=2,
                       attention_chunk_size=8, qk_l2_norm=True).validate()


def test_format_detection(tmp_path):
    conv = tmp_path / "conv"
    conv.mkdir()
    (conv / "megatron_convert.json").write_text("{}")
    root = tmp_path / "root"
    step = _step_dir(root)
    (root / checkpoint.LATEST).write_text(step.name)
    assert checkpoint_format(str(conv)) == "converter"
    assert checkpoint_format(str(root)) == "dist"
    assert checkpoint_format(str(step)) == "dist"


def test_neither_format_names_the_path_and_writes_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "hf"
    with pytest.raises(ValueError, match=r"empty.*neither a converter checkpoint"):
        convert_megatron_to_hf(ckpt=str(empty), out=str(out))
    with pytest.raises(ValueError, match="no such directory"):
        convert_megatron_to_hf(ckpt=str(tmp_path / "missing"), out=str(out))
    assert not out.exists() and not (tmp_path / "hf.partial").exists()


def test_root_without_latest_hints_at_the_step_dir(tmp_path):
    root = tmp_path / "root"
    _step_dir(root, step=7)
    with pytest.raises(ValueError, match=r"holds 'step_00000007' but no 'latest'"):
        convert_megatron_to_hf(ckpt=str(root), out=str(tmp_path / "hf"))


def test_missing_sidecar_names_the_checkpoint(tmp_path):
    step = _step_dir(tmp_path / "root")
    with pytest.raises(ValueError, match=re.escape(f"{step}: model_config.json is missing")):
        convert_megatron_to_hf(ckpt=str(step), out=str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


def test_incomplete_save_is_refused(tmp_path):
    root = tmp_path / "root"
    step = _step_dir(root, model=_moe())
    (root / checkpoint.LATEST).write_text(step.name)
    (step / checkpoint.COMPLETE).unlink()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        convert_megatron_to_hf(ckpt=str(root), out=str(tmp_path / "hf"))


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    (json.dumps({"format": "other/1", "model": {}}), "format='other/1'"),
    (json.dumps({"format": checkpoint.MODEL_CONFIG_FORMAT, "model": {"hidden_sise": 64}}), "unknown model key 'hidden_sise'"),
])
def test_bad_sidecar_names_the_file(tmp_path, text, match):
    step = _step_dir(tmp_path / "root", sidecar=text)
    with pytest.raises(ValueError, match=match) as info:
        convert_megatron_to_hf(ckpt=str(step), out=str(tmp_path / "hf"))
    assert str(step / checkpoint.MODEL_CONFIG) in str(info.value)


def test_sidecar_round_trip_via_latest(tmp_path):
    root = tmp_path / "root"
    m = _moe()
    step = _step_dir(root, model=m)
    (root / checkpoint.LATEST).write_text(step.name)
    assert checkpoint.read_model_config(root) == m


def test_arch_mismatch_and_existing_output_fail_before_loading(tmp_path):
    step = _step_dir(tmp_path / "root", model=_moe())
    with pytest.raises(ValueError, match=r"arch='llama4', expected 'llama'"):
        convert_megatron_to_hf(ckpt=str(step), out=str(tmp_path / "hf"), expect_arch="llama")
    (tmp_path / "hf").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        convert_megatron_to_hf(ckpt=str(step), out=str(tmp_path / "hf"))


def test_hf_config_of_the_recorded_model():
    """config.json for a Llama-4 MoE ModelConfig: HF names and HF's NoPE convention (1 = RoPE layer)."""
    from scalerl_mega.convert.distckpt import hf_config_dict

    cfg = hf_config_dict(_moe())
    assert cfg["model_type"] == "llama4_text" and cfg["architectures"] == ["Llama4ForCausalLM"]
    assert cfg["num_local_experts"] == 4 and cfg["intermediate_size"] == 64 and cfg["intermediate_size_mlp"] == 128
    assert cfg["no_rope_layers"] == [1, 0] and cfg["attention_chunk_size"] == 8 and cfg["use_qk_norm"] is True


def test_cli_reports_the_error(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "convert_megatron_to_hf.py"
    spec = importlib.util.spec_from_file_location("convert_megatron_to_hf", tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    step = _step_dir(tmp_path / "root")
    assert mod.main(["--ckpt", str(step), "--out", str(tmp_path / "hf"), "--no-progress"]) == 2
    assert f"{step}: model_config.json is missing" in capsys.readouterr().err
