"""The `peft` group (config/peft.py): `peft=none` by default, `peft=lora` composes, each bad key is refused naming it
(at `--validate`: `config.validate`), and the adapter count of a model is r (in + out) over its adapted linears,
checked against counts worked by hand (model/lora_shapes.py)."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_config import _compose  # noqa: E402

from scalerl_mega.config import validate  # noqa: E402
from scalerl_mega.config.peft import DEFAULT_TARGETS, PeftConfig, target_kinds, validate_peft  # noqa: E402
from scalerl_mega.model.config import load_model_preset  # noqa: E402
from scalerl_mega.model.lora_shapes import lora_numel, peft_export_numel  # noqa: E402


def test_full_training_is_the_default_and_lora_composes_with_its_defaults():
    assert _compose("experiment=demo").peft.kind == "none"
    c = _compose("experiment=demo", "peft=lora", "peft.rank=16")
    assert (c.peft.kind, c.peft.rank, c.peft.alpha, c.peft.dropout, c.peft.targets) == (
        "lora", 16, 16.0, 0.0, ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
    validate(c)


@pytest.fixture(scope="module")
def lora_demo():
    return _compose("experiment=demo", "peft=lora")


def _with(cfg, **groups):
    """A copy of a composed config with some groups' keys replaced."""
    cfg = copy.deepcopy(cfg)
    for group, changes in groups.items():
        setattr(cfg, group, dataclasses.replace(getattr(cfg, group), **changes))
    return cfg


@pytest.mark.parametrize(("groups", "message"), [
    ({"peft": {"rank": 0}}, r"peft\.rank=0 must be > 0"),
    ({"peft": {"alpha": 0.0}}, r"peft\.alpha=0\.0 must be > 0"),
    ({"peft": {"dropout": 1.0}}, r"peft\.dropout=1\.0 must be in \[0, 1\)"),
    ({"peft": {"targets": ["linear_qkvv"]}}, r"unknown target 'linear_qkvv' \(did you mean linear_qkv\?\)"),
    ({"peft": {"targets": ["use_rslora"]}}, r"rsLoRA .* not offered"),
    ({"peft": {"targets": ["use_dora"]}}, r"DoRA.* not offered"),
    ({"peft": {"targets": []}}, r"peft\.targets=\[\] adapts nothing"),
    ({"peft": {"kind": "qlora"}}, r"peft\.kind='qlora' is not one of"),
    ({"peft": {"dropout": 0.1}, "parallel": {"tp": 2}}, r"peft\.dropout=0\.1 with parallel\.tp=2"),
])
def test_validate_refuses_naming_the_keys(lora_demo, groups, message):
    with pytest.raises(ValueError, match=message):
        validate(_with(lora_demo, **groups))


def test_mla_and_expert_tensor_parallel_expert_adapters_are_refused_at_validate():
    with pytest.raises(ValueError, match=r"peft\.kind=lora with model\.arch='deepseek_v3'.*deferred"):
        validate(_compose("experiment=demo", "peft=lora", "model=tiny_deepseek_v3"))
    moe = _compose("experiment=demo", "peft=lora", "model=tiny_qwen3_moe", "parallel.tp=2")
    with pytest.raises(ValueError, match=r"adapts the routed experts .*parallel\.etp"):
        validate(moe)
    validate(_with(moe, peft={"targets": ["linear_qkv", "linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]}))


def test_dataclass_default_targets_and_kinds():
    assert dataclasses.asdict(PeftConfig())["targets"] == list(DEFAULT_TARGETS)
    assert target_kinds(["linear_fc1"]) == {"fc1", "expert_fc1", "shared_fc1"}
    assert target_kinds(["experts.linear_fc2", "linear_qkv"]) == {"expert_fc2", "qkv"}
    validate_peft(PeftConfig(kind="none", rank=0))  # the lora keys are not read when peft is off


def test_adapter_counts_by_hand():
    kinds = target_kinds(list(DEFAULT_TARGETS))
    # tiny_qwen3: hidden 64, 4 heads + 2 kv heads of 32, ffn 128, 2 layers; r = 4:
    # qkv 4 (64 + 256) + o 4 (128 + 64) + fc1 4 (64 + 256) + fc2 4 (128 + 64) = 4096 per layer
    assert lora_numel(load_model_preset("tiny_qwen3"), rank=4, kinds=kinds) == 2 * 4096
    # the PEFT export repeats the shared A per projection: q/k/v 3 x 4 x 64, gate/up 2 x 4 x 64
    assert peft_export_numel(load_model_preset("tiny_qwen3"), rank=4, kinds=kinds) == 2 * (4096 + 2 * 256 + 256)
    # tiny_moe (Scout-style, both layers MoE): hidden 64, 4 heads of 16, 2 kv heads, 4 routed experts and a shared
    # expert, each of width 64; r = 2: attention 2 (64 + 128) + 2 (64 + 64) = 640, each expert (routed or shared)
    # 2 (64 + 128) + 2 (64 + 64) = 640: per layer 640 + 4 x 640 + 640 = 3840
    m = load_model_preset("tiny_moe")
    assert (m.num_layers, m.moe_layer_freq, m.num_experts, m.expert_ffn, m.shared_expert_ffn) == (2, 1, 4, 64, 64)
    assert lora_numel(m, rank=2, kinds=kinds) == 2 * 3840
    assert lora_numel(m, rank=2, kinds=target_kinds(["experts.linear_fc1"])) == 2 * 4 * 2 * (64 + 128)
