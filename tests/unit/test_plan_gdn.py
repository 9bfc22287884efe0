"""The planner with a Gated DeltaNet hybrid (tools/plan.py --preset): the generator caches K and V in the
full-attention layers only and adds each sequence's recurrent + conv state (value heads split over TP); the
parameters are the model's. Figures worked by hand for Qwen3-Next-80B-A3B."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from scalerl_mega.cluster import plan as P
from scalerl_mega.dry_run import model_shape
from scalerl_mega.model.config import load_model_preset

REPO = Path(__file__).resolve().parents[2]


def test_generator_kv_and_state_of_qwen3_next_80b_by_hand():
    m = load_model_preset("qwen3_next_80b_a3b")
    shape = model_shape(m)
    assert len(shape.gdn.layers) == 36 and shape.gdn.state_bytes == 77_266_944  # state: test_convert_gdn.py
    lay = P.GenLayout(tp=4, seq_len=16384, min_seqs=16)
    # 12 full-attention layers x K and V x one of the 2 KV heads per GPU (2 // 4 -> 1) x 256 dims x 2 bytes
    assert P.kv_bytes_per_token(shape, lay) == 12 * 2 * 1 * 256 * 2 == 12_288
    rep = P.generator_memory(shape, lay, P.DEVICES["h200"])
    assert rep.components["kv_cache_min"] == 16 * (16384 * 12_288 + 77_266_944 // 4)
    # every layer counted as attention would cache 4x the K/V and no state
    assert P.kv_bytes_per_token(P.ModelShape(**{**shape.__dict__, "gdn": None}), lay) == 4 * 12_288


def test_planner_parameters_are_the_models():
    for name in ("qwen3_next_80b_a3b", "qwen3_5_35b_a3b", "tiny_qwen3_next"):
        m = load_model_preset(name)
        assert model_shape(m).total_params() == m.num_params()["total"], name


def test_stage_params_are_the_tensors_megatron_builds_on_a_stage_of_mixed_layers():
    """Qwen3.5-35B-A3B at TP 2 x PP 4 x EP 4: stage 1 holds layers 10-19, three gated full-attention layers (11, 15,
    19) and seven GDN layers, not the model's 1:3 mean. The tensors of one of its GPUs as the full-size dry run builds
    them (tests/integration/test_gdn_full_size.py checks every stage against it), summed by hand."""
    shape = model_shape(load_model_preset("qwen3_5_35b_a3b"))
    gdn = 6176 * 2048 + 4096 * 4 + 16 + 16 + 128 + 2048 * 2048  # in_proj, conv1d, A_log, dt_bias (/2); out_norm whole
    full = 4608 * 2048 + 2048 * 2048 + 256 + 256  # linear_qkv (q + gate, k, v) / 2, linear_proj / 2, q and k norms
    per_layer = 2 * 2048 + 256 * 2048 + 2048 + 512 * 2048 + 2048 * 256  # norms, router, shared gate and expert (/2)
    experts = 10 * 64 * (1024 * 2048 + 2048 * 512)  # 256 / EP 4 routed experts per layer, fc1 (gate, up) and fc2
    got = P.stage_params(shape, P.TrainLayout(tp=2, pp=4, dp=2, ep=4), 1)
    assert got == {"body": 7 * gdn + 3 * full + 10 * per_layer, "head": 0, "expert": experts}


def test_plan_tool_plans_a_preset(capsys):
    spec = importlib.util.spec_from_file_location("plan_tool", REPO / "tools" / "plan.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--preset", "qwen3_next_80b_a3b", "--device", "h200", "--tp", "2", "--pp", "3", "--dp", "4",
                      "--ep", "8", "--gen-tp", "4", "--seq-len", "16384"]) == 0
    out = capsys.readouterr().out
    assert "GDN state bytes/sequence/GPU=19,316,736" in out and "KV bytes/token/GPU=12,288" in out
    assert tool.main(["--preset", "no_such_preset"]) == 1


def test_planner_model_table_entry_is_the_presets_shape():
    """`plan.MODELS["qwen3_next_80b_a3b"]` (the `--model` choice, the docs table row, the Slurm script's layout) is the
    shape the planner derives from the preset: the same parameters, GDN layers and recurrent state."""
    assert P.MODELS["qwen3_next_80b_a3b"] == model_shape(load_model_preset("qwen3_next_80b_a3b"))
