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
    assert shape.gdn[0] == 36 and shape.gdn[2] == 77_266_944  # 36 GDN layers; state: test_convert_gdn.py
    lay = P.GenLayout(tp=4, seq_len=16384, min_seqs=16)
    # 12 full-attention layers x K and V x one of the 2 KV heads per GPU (2 // 4 -> 1) x 256 dims x 2 bytes
    assert P.kv_bytes_per_token(shape, lay) == 12 * 2 * 1 * 256 * 2 == 12_288
    rep = P.generator_memory(shape, lay, P.DEVICES["h200"])
    assert rep.components["kv_cache_min"] == 16 * (16384 * 12_288 + 77_266_944 // 4)
    # every layer counted as attention would cache 4x the K/V and no state
    assert P.kv_bytes_per_token(P.ModelShape(**{**shape.__dict__, "gdn": ()}), lay) == 4 * 12_288


def test_planner_parameters_are_the_models():
    for name in ("qwen3_next_80b_a3b", "qwen3_5_35b_a3b", "tiny_qwen3_next"):
        m = load_model_preset(name)
        assert abs(model_shape(m).total_params() - m.num_params()["total"]) / m.num_params()["total"] < 1e-4, name


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
