"""The Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) in the converter: names and shapes against what
transformers saves, the fused / split GDN projections and the gated q_proj against transformers' own split of
their outputs, the per-section TP split worked by hand, bit-exact round trips at TP2 x EP2 through the CLIs, the
layer pattern given or derived, the multimodal `text_config`, parameter counts against transformers' models, and
the refusals at validation."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from scalerl_mega.convert import gdn_layout, sharding, tables
from scalerl_mega.convert.dims import dims_from_hf_config
from scalerl_mega.convert.tiny import save_tiny_hf, tiny_hf_config

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def _dims(cfg):
    return dims_from_hf_config(json.loads(cfg.to_json_string()))


@pytest.mark.parametrize("arch", ARCHS)
def test_table_names_shapes_and_param_count_are_transformers(arch):
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    from scalerl_mega.convert.model_config import model_config_from_hf

    cfg = tiny_hf_config(arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    saved = {n: tuple(t.shape) for n, t in revert_weight_conversion(model, model.state_dict()).items()}
    d = _dims(cfg)
    names = tables.hf_names(d)
    assert len(set(names)) == len(names) and sorted(names) == sorted(saved)
    for n in names:
        assert tables.expected_hf_shape(n, d) == saved[n], n
    assert d.linear_layers == (0, 2) and d.partial_rotary_factor == 0.5 and d.attn_output_gate
    m = model_config_from_hf(json.loads(cfg.to_json_string()))
    assert m.num_params()["total"] == sum(p.numel() for p in model.parameters())


def test_fused_qwen3_next_projection_matches_transformers_reordering():
    """Megatron's in_proj rows [q, k, v, z, b, a] applied to x give what transformers'
    `fix_query_key_value_ordering` makes of in_proj_qkvz(x) and in_proj_ba(x); and back, bit for bit."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(0)
    cfg = tiny_hf_config("qwen3_next")
    gdn = Qwen3NextGatedDeltaNet(cfg, layer_idx=0)
    x = torch.randn(2, 5, cfg.hidden_size)
    with torch.no_grad():
        want = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
        w = gdn_layout.fused_in_proj_to_mcore(gdn.in_proj_qkvz.weight, gdn.in_proj_ba.weight, key_heads=2,
                                              key_head_dim=8, value_heads=4, value_head_dim=8)
        got = torch.split(x @ w.t(), gdn_layout.gdn_sections(key_dim=16, value_dim=32, value_heads=4), dim=-1)
    for g, t in zip(got, want):
        assert torch.allclose(g, t.reshape(2, 5, -1), atol=1e-6)
    back = gdn_layout.mcore_to_fused_in_proj(w, key_heads=2, key_head_dim=8, value_heads=4, value_head_dim=8)
    assert torch.equal(back[0], gdn.in_proj_qkvz.weight) and torch.equal(back[1], gdn.in_proj_ba.weight)


def test_gated_q_proj_matches_transformers_query_and_gate_split():
    """Megatron's gated linear_qkv, read per query group as [queries, gates, key, value] (megatron's
    `get_query_key_value_tensors` with an output gate), gives transformers' query / gate chunks of q_proj."""
    torch.manual_seed(0)
    nh, ng, hd, h = 4, 2, 3, 5
    q_gate, k, v = torch.randn(nh * 2 * hd, h), torch.randn(ng * hd, h), torch.randn(ng * hd, h)
    x = torch.randn(h)
    hf_query, hf_gate = (q_gate @ x).view(nh, 2 * hd).chunk(2, dim=-1)
    fused = gdn_layout.gated_qkv_to_mcore(q_gate, k, v, num_groups=ng, head_dim=hd)
    per_group = (fused @ x).view(ng, (2 * nh // ng + 2) * hd)
    q, g, kk, vv = torch.split(per_group, [nh // ng * hd, nh // ng * hd, hd, hd], dim=-1)
    assert torch.allclose(q.reshape(nh, hd), hf_query, atol=1e-6) and torch.allclose(g.reshape(nh, hd), hf_gate, atol=1e-6)
    assert torch.allclose(kk.reshape(-1), k @ x, atol=1e-6) and torch.allclose(vv.reshape(-1), v @ x, atol=1e-6)
    back = gdn_layout.mcore_to_gated_qkv(fused, num_groups=ng, head_dim=hd, heads_per_group=nh // ng)
    assert all(torch.equal(a, b) for a, b in zip(back, (q_gate, k, v)))


def test_section_split_hand_worked():
    """in_proj rows 0..13 in sections q=2, k=2, v=4, z=2, b=2, a=2 (made-up sizes): TP rank 1 of 2 holds the second
    half of each section."""
    d = dims_from_hf_config(json.loads(tiny_hf_config("qwen3_5").to_json_string()))
    full = torch.arange(14.0)[:, None]
    shard = gdn_layout.shard_sections(full, [2, 2, 4, 2, 2, 2], rank=1, size=2)
    assert shard.flatten().tolist() == [1, 3, 6, 7, 9, 11, 13]
    shards = [gdn_layout.shard_sections(full, [2, 2, 4, 2, 2, 2], rank=r, size=2) for r in range(2)]
    assert torch.equal(gdn_layout.merge_sections(shards, [2, 2, 4, 2, 2, 2]), full)
    name = "decoder.layers.0.self_attention.in_proj.weight"  # tiny: q 16, k 16, v 32, z 32, b 4, a 4 rows
    w = torch.randn(104, 32)
    parts = [sharding.tp_shard(name, w, rank=r, size=2, dims=d) for r in range(2)]
    assert torch.equal(parts[0][16:24], w[32:40]) and torch.equal(parts[1][48:50], w[98:100])
    assert torch.equal(sharding.tp_merge(name, parts, dims=d), w)
    assert sharding.tp_kind("decoder.layers.0.self_attention.A_log") == sharding.DIM0
    assert sharding.tp_kind("decoder.layers.0.self_attention.out_norm.weight") == sharding.REPLICATED
    with pytest.raises(ValueError, match="pass dims="):
        sharding.tp_shard(name, w, rank=0, size=2)


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch,layout", [("qwen3_next", ["--tp", "2", "--ep", "2"]), ("qwen3_5", ["--tp", "2"]),
                                         ("qwen3_5_moe", ["--tp", "2", "--ep", "2"])])
def test_cli_round_trip_bit_exact(tmp_path, arch, layout):
    from scalerl_mega.convert.st_io import SafetensorsDir

    hf, mc, back = tmp_path / "hf", tmp_path / "mc", tmp_path / "back"
    save_tiny_hf(arch, str(hf))
    assert _tool("convert_hf_to_megatron").main(["--hf-dir", str(hf), "--out", str(mc), *layout]) == 0
    assert _tool("convert_megatron_to_hf").main(["--ckpt", str(mc), "--out", str(back)]) == 0
    a, b = SafetensorsDir(str(hf)), SafetensorsDir(str(back))
    assert sorted(a.names()) == sorted(b.names())
    assert all(torch.equal(a.get(n), b.get(n)) for n in a.names())


def test_layer_pattern_given_or_derived_and_multimodal_text_config():
    from scalerl_mega.model.hf_import import hf_text_config

    cfg = json.loads(tiny_hf_config("qwen3_5", num_hidden_layers=8).to_json_string())
    cfg.pop("layer_types")
    assert dims_from_hf_config(cfg).linear_layers == (0, 1, 2, 4, 5, 6)  # default full_attention_interval 4
    assert dims_from_hf_config({**cfg, "full_attention_interval": 3}).linear_layers == (0, 1, 3, 4, 6, 7)
    given = ["full_attention"] * 2 + ["linear_attention"] * 6
    assert dims_from_hf_config({**cfg, "layer_types": given}).linear_layers == (2, 3, 4, 5, 6, 7)
    with pytest.raises(ValueError, match="layer_types"):
        dims_from_hf_config({**cfg, "layer_types": given[:3]})
    with pytest.raises(ValueError, match="attn_output_gate"):
        dims_from_hf_config({**cfg, "attn_output_gate": False})
    mm = {"model_type": "qwen3_5_moe", "tie_word_embeddings": False, "vision_config": {"depth": 2},
          "text_config": {**json.loads(tiny_hf_config("qwen3_5_moe").to_json_string()), "model_type": "qwen3_5_moe_text"}}
    assert dims_from_hf_config(hf_text_config(mm)).arch == "qwen3_5_moe"


def test_gdn_refusals_name_the_key():
    from scalerl_mega.model.config import ParallelConfig, load_model_preset

    m = load_model_preset("tiny_qwen3_next")
    with pytest.raises(ValueError, match=r"parallel: cp=2 > 1 with Gated DeltaNet"):
        ParallelConfig(cp=2).validate(m)
    with pytest.raises(ValueError, match=r"tp=4 does not divide model.linear_num_key_heads=2"):
        ParallelConfig(tp=4, sequence_parallel=True).validate(load_model_preset("tiny_qwen3_next", overrides=dict(
            num_attention_heads=8, num_query_groups=4)))
    with pytest.raises(ValueError, match="attention_output_gate=False"):
        load_model_preset("tiny_qwen3_5", overrides={"attention_output_gate": False})
    with pytest.raises(ValueError, match="moe_shared_expert_gate=False"):
        load_model_preset("tiny_qwen3_5_moe", overrides={"moe_shared_expert_gate": False})
    with pytest.raises(ValueError, match="partial_rotary_factor.*Qwen3-Next"):
        load_model_preset("tiny_qwen3", overrides={"partial_rotary_factor": 0.5})


def test_qwen3_next_80b_preset_counts_the_published_80b_total_and_3b_active():
    """Qwen3-Next-80B-A3B: "80B total, 3B activated" (its model card); the count from the shapes, GDN and gated
    attention included, is 79.67B total and 3.87B per token (embedding and head included)."""
    from scalerl_mega.model.config import load_model_preset

    n = load_model_preset("qwen3_next_80b_a3b").num_params()
    assert abs(n["total"] - 80e9) / 80e9 < 0.005
    assert 3e9 <= n["active"] < 4e9


def test_recurrent_state_and_banner_of_the_80b_preset():
    """Per sequence, whatever its length: 36 GDN layers x (32 value heads x 128 x 128 FP32 state = 2,097,152 B
    + conv cache (2 x 16 x 128 + 32 x 128 = 8,192 channels) x 3 past inputs x 2 B = 49,152 B) = 77,266,944 B."""
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hybrid import banner_note, recurrent_state_bytes_per_sequence

    m = load_model_preset("qwen3_next_80b_a3b")
    assert recurrent_state_bytes_per_sequence(m) == 77_266_944
    assert banner_note(m, cuda=False) == ", Gated DeltaNet in 36 of 48 layers (torch path, no fla)"
    assert banner_note(load_model_preset("tiny_qwen3"), cuda=False) == ""


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_multimodal_qwen3_5_checkpoint_round_trip_carries_the_vision_tower(tmp_path, arch):
    """The published layout (`Qwen3_5(Moe)ForConditionalGeneration`): text tensors under `model.language_model.`,
    the vision tower under `model.visual.`; converted at TP2 and back in the same layout, every tensor bit-exact,
    and the config's text model is the trainer's."""
    from scalerl_mega.convert.hf_layout import read_layout
    from scalerl_mega.convert.st_io import SafetensorsDir
    from scalerl_mega.model.hf_import import model_from_hf_dir

    hf, mc, back = tmp_path / "hf", tmp_path / "mc", tmp_path / "back"
    save_tiny_hf(arch, str(hf), conditional=True)
    names = SafetensorsDir(str(hf)).names()
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert any(n.startswith("model.visual.") for n in names)
    assert model_from_hf_dir(hf).arch == arch
    assert _tool("convert_hf_to_megatron").main(["--hf-dir", str(hf), "--out", str(mc), "--tp", "2"]) == 0
    assert _tool("convert_megatron_to_hf").main(["--ckpt", str(mc), "--out", str(back)]) == 0
    a, b = SafetensorsDir(str(hf)), SafetensorsDir(str(back))
    assert sorted(a.names()) == sorted(b.names())
    assert all(torch.equal(a.get(n), b.get(n)) for n in a.names())
    assert json.loads((back / "config.json").read_text())["model_type"] == arch
    assert read_layout(str(back)).text_config["model_type"] == f"{arch}_text"
