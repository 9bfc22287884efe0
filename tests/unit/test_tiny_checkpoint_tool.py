"""Qwen3 as a first-class path: tools/make_tiny_checkpoint.py writes a tiny random checkpoint of every
supported architecture offline, whose config.json reads back as the architecture's tiny preset (vocabulary cut to
the synthetic task's tokenizer) and passes the compose-time check against that preset; model presets keep their
sizes and print their names under every experiment; the Qwen3 experiments are ScaleRL on a Qwen3 model."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from scalerl_mega.model.archs import ARCHS
from scalerl_mega.model.config import load_model_preset

REPO = Path(__file__).resolve().parents[2]


def tool():
    spec = importlib.util.spec_from_file_location("make_tiny_checkpoint", REPO / "tools" / "make_tiny_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_supported_architecture_has_a_tiny_checkpoint():
    assert set(tool().TINY) == set(ARCHS)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tiny_checkpoint_reads_back_as_its_preset(tmp_path, arch):
    from transformers import AutoTokenizer

    from scalerl_mega.convert.model_config import model_config_from_hf
    from scalerl_mega.model.hf_import import model_mismatches

    t = tool()
    out = tmp_path / arch
    assert t.main([arch, str(out), "--seed", "3"]) == 0
    hf = json.loads((out / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(out)
    assert hf["vocab_size"] == len(tok) == 47  # the synthetic task's 47-token vocabulary
    preset = load_model_preset(t.TINY[arch], overrides={"vocab_size": 47})
    got = model_config_from_hf(hf)
    assert got.arch == arch
    for f in ("hidden_size", "num_layers", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "num_experts", "moe_topk", "tie_embeddings", "qk_layernorm"):
        assert getattr(got, f) == getattr(preset, f), (arch, f)
    assert model_mismatches(preset, hf) == []
    assert t.main([arch, str(out)]) == 2  # not empty: refused, nothing overwritten


def test_tool_refusals_name_the_problem(tmp_path, capsys):
    t = tool()
    assert t.main(["--list"]) == 0
    assert "qwen3_moe  conf/model/tiny_qwen3_moe.yaml" in capsys.readouterr().out
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert t.main(["qwen3", str(tmp_path / "full")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert t.main(["qwen3", str(tmp_path / "small"), "--vocab-size", "46"]) == 2
    assert "below the tokenizer's 47 tokens" in capsys.readouterr().err


def test_vocab_size_pads_the_embedding_past_the_tokenizer(tmp_path):
    """48 rows for a 47-token tokenizer (what parallel.tp=2 needs): config, embedding and head all have 48 rows."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    out = tmp_path / "padded"
    assert tool().main(["qwen3_moe", str(out), "--vocab-size", "48"]) == 0
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 48
    assert len(AutoTokenizer.from_pretrained(out)) == 47
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        rows = {k: f.get_slice(k).get_shape()[0] for k in f.keys() if k.endswith(("embed_tokens.weight", "lm_head.weight"))}
    assert rows == {"model.embed_tokens.weight": 48, "lm_head.weight": 48}


def _experiments() -> list[str]:
    root = REPO / "conf" / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in [*root.glob("*.yaml"), *root.glob("*/*.yaml")])


def test_presets_keep_their_sizes_and_names_under_every_experiment():
    from omegaconf import OmegaConf

    from scalerl_mega.compose import compose_node

    for preset in ("tiny_qwen3", "tiny_qwen3_moe", "tiny_dense"):
        want = {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(load_model_preset(preset)).items()}
        assert want["name"] == preset
        for exp in _experiments():
            got = OmegaConf.to_container(compose_node([f"experiment={exp}", f"model={preset}"]).model)
            # model.fp32_lm_head is the precision group's (precision=bf16_head turns it off), not a size
            diff = {k: (want[k], got.get(k)) for k in want if want[k] != got.get(k) and k != "fp32_lm_head"}
            assert not diff, (exp, preset, diff)


def test_qwen3_experiments():
    from scalerl_mega.compose import compose_node

    for exp, model, replay in (("qwen3", "qwen3_8b", "none"), ("qwen3_moe", "qwen3_30b_a3b", "none")):
        c = compose_node([f"experiment={exp}"])
        assert (c.model.name, c.moe.routing_replay, c.run_name) == (model, replay, exp)


def test_qwen3_experiments_pass_the_launch_check_of_their_scripts():
    """`EXPERIMENT=qwen3 ... slurm/train_dense.sh MODEL=qwen3_8b` and `EXPERIMENT=qwen3_moe ... train_qwen3_moe.sh`
    (full recompute) compose and validate as the batch node's launch check does."""
    from test_docs_plan_tables import launch_overrides

    from scalerl_mega.cluster import launch_config as LC
    from scalerl_mega.cluster.layouts import LAYOUTS

    for exp, name, env in (("qwen3", "train_dense", {"MODEL": "qwen3_8b"}), ("qwen3_moe", "train_qwen3_moe", {})):
        ovs = [o for o in launch_overrides(LAYOUTS[name].with_env(env)) if not o.startswith("experiment=")]
        cfg = LC.compose([f"experiment={exp}", *ovs])
        assert cfg.run_name == exp and cfg.model.name == LAYOUTS[name].with_env(env).model
