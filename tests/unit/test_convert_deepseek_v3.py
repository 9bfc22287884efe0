"""DeepSeek-V3 in the converter tables and configs: names and shapes against what transformers saves (with and
without q_lora), Megatron-Core's sigmoid group-limited routing on bias-corrected scores against HF's
DeepseekV3TopkRouter (float64), bit-exact CLI round trips at TP/PP/EP > 1 with the multi-token-prediction layer
carried through, and the config.json fields the trainer cannot reproduce named."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_convert_qwen3 import _all, _cli, _saved_names

from scalerl_mega.convert import tables
from scalerl_mega.convert.dims import dims_from_hf_config
from scalerl_mega.convert.tiny import save_tiny_hf, tiny_hf_config


def _cfg_dict(**overrides) -> dict:
    return json.loads(tiny_hf_config("deepseek_v3", **overrides).to_json_string())


@pytest.mark.parametrize("q_lora", [24, None])
def test_table_names_and_shapes_are_what_transformers_saves(q_lora):
    from transformers import AutoModelForCausalLM

    cfg = tiny_hf_config("deepseek_v3", q_lora_rank=q_lora)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    saved = _saved_names(model)
    d = dims_from_hf_config(json.loads(cfg.to_json_string()))
    names = tables.hf_names(d)
    assert len(set(names)) == len(names) and sorted(names) == sorted(saved)
    for n in names:
        assert tables.expected_hf_shape(n, d) == saved[n], n
    assert d.moe_layers == (1, 2, 3) and d.shared_expert_ffn == 32 and d.head_dim == 16  # qk_nope, not config head_dim
    assert ("model.layers.0.self_attn.q_a_proj.weight" in names) == bool(q_lora)
    assert "model.layers.2.mlp.gate.e_score_correction_bias" in names and "model.layers.0.mlp.gate_proj.weight" in names


def _hf_router(seed=0):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    torch.manual_seed(seed)
    router = DeepseekV3TopkRouter(tiny_hf_config("deepseek_v3"))  # HF routes in float32
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        router.e_score_correction_bias.normal_(0, 0.3)
    return router


def test_megatron_group_limited_routing_equals_hf_router():
    """Megatron-Core's `topk_routing_with_score_function` with the router fields models.transformer_config passes
    (trainer/megatron/mla.router_kwargs) picks HF's experts, and its weights within float32 rounding, on 512 tokens; the bias changes
    the choice for some tokens but never the weights' source (uncorrected sigmoid scores), and replaying HF's ids
    through Megatron's router replay gives the same weights."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.megatron.mla import router_kwargs

    router = _hf_router()
    kw = router_kwargs(load_model_preset("tiny_deepseek_v3"))
    assert kw == dict(moe_router_num_groups=4, moe_router_group_topk=2, moe_router_topk_scaling_factor=2.5,
                      moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)
    x = torch.randn(512, 64)
    with torch.no_grad():
        logits, w_hf, ids_hf = router(x)
    bias = router.e_score_correction_bias.detach()
    call = dict(topk=4, use_pre_softmax=False, num_groups=4, group_topk=2, scaling_factor=2.5,
                score_function="sigmoid", expert_bias=bias)
    probs, routing_map = topk_routing_with_score_function(logits, **call)
    hf_dense = torch.zeros_like(probs).scatter(1, ids_hf, w_hf)
    assert torch.equal(routing_map, hf_dense > 0)
    torch.testing.assert_close(probs, hf_dense, rtol=0, atol=1e-6)
    unbiased = topk_routing_with_score_function(logits, **{**call, "expert_bias": None})[1]
    assert 0 < (unbiased != routing_map).any(-1).sum() < 512  # the bias decides some routes
    replay = RouterReplay()
    replay.set_target_indices(ids_hf)
    replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    replayed, replay_map = topk_routing_with_score_function(logits, **call, router_replay=replay)
    assert torch.equal(replay_map, routing_map)
    torch.testing.assert_close(replayed, hf_dense, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory):
    """Tiny DeepSeek-V3 checkpoint with one multi-token-prediction layer (model.layers.4.*: RL does not build it)."""
    from safetensors.torch import save_file

    d = str(tmp_path_factory.mktemp("ds") / "hf")
    save_tiny_hf("deepseek_v3", d, max_shard_size="100KB", num_nextn_predict_layers=1)
    torch.manual_seed(1)
    mtp = {"model.layers.4.eh_proj.weight": torch.randn(64, 128), "model.layers.4.enorm.weight": torch.randn(64),
           "model.layers.4.hnorm.weight": torch.randn(64), "model.layers.4.self_attn.kv_b_proj.weight": torch.randn(112, 16)}
    save_file(mtp, os.path.join(d, "mtp.safetensors"))
    index = os.path.join(d, "model.safetensors.index.json")
    with open(index) as f:
        idx = json.load(f)
    idx["weight_map"].update({n: "mtp.safetensors" for n in mtp})
    with open(index, "w") as f:
        json.dump(idx, f)
    return d


@pytest.mark.parametrize("layout", [["--tp", "2", "--ep", "2"], ["--tp", "2", "--pp", "2", "--ep", "4", "--etp", "1"]])
def test_cli_round_trip_bit_exact_with_the_mtp_layer_carried(ds_dir, tmp_path, layout):
    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    assert _cli("convert_hf_to_megatron").main(["--hf-dir", ds_dir, "--out", mc, *layout, "--no-progress"]) == 0
    assert _cli("convert_megatron_to_hf").main(["--ckpt", mc, "--out", back, "--no-progress"]) == 0
    src, dst = _all(ds_dir), _all(back)
    assert sorted(src) == sorted(dst) and "model.layers.4.eh_proj.weight" in dst
    for n in src:
        assert src[n].dtype == dst[n].dtype and torch.equal(src[n], dst[n]), n
    from scalerl_mega.convert.megatron_ckpt import MegatronShards

    names = MegatronShards(mc).names()
    assert not any(n.startswith("decoder.layers.4.") for n in names)  # the Megatron model has 4 layers only
    assert "decoder.layers.1.mlp.router.expert_bias" in names
    assert json.load(open(os.path.join(back, "config.json")))["architectures"] == ["DeepseekV3ForCausalLM"]


def test_model_config_from_config_json_and_back():
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model

    cfg = _cfg_dict(vocab_size=256, max_position_embeddings=512)
    m = model_config_from_hf(cfg, name="tiny_deepseek_v3")
    preset = load_model_preset("tiny_deepseek_v3")
    assert m == preset
    arch, kwargs = hf_config_from_model(m)
    assert arch == "deepseek_v3"
    for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group",
                "topk_group", "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace", "rope_parameters"):
        assert kwargs[key] == cfg[key], key
    assert dims_from_model_config(m) == dims_from_hf_config(cfg)


@pytest.mark.parametrize("change,match", [
    ({"scoring_func": "softmax"}, "scoring_func='softmax'"),
    ({"topk_method": "greedy"}, "topk_method='greedy'"),
    ({"norm_topk_prob": False}, "norm_topk_prob=false"),
    ({"num_experts_per_tok": 2}, r"num_experts_per_tok=2 // topk_group=2 != 2"),
    ({"rope_interleave": False}, "rope_interleave=False"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "type='llama3'"),
])
def test_unsupported_configs_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        dims_from_hf_config({**_cfg_dict(), **change})


def test_deepseek_settings_are_refused_on_other_architectures():
    from scalerl_mega.model.config import ModelConfig, load_model_preset

    with pytest.raises(ValueError, match="kv_lora_rank=16 is a DeepSeek-V3 setting but arch='qwen3_moe'"):
        ModelConfig(**{**vars(load_model_preset("tiny_qwen3_moe")), "kv_lora_rank": 16}).validate()
    with pytest.raises(ValueError, match="moe_topk=3 // moe_router_group_topk=2 = 1"):
        load_model_preset("tiny_deepseek_v3", overrides={"moe_topk": 3})


@pytest.mark.parametrize("q_lora", [24, None])
def test_every_exported_tensor_has_its_own_sglang_parameter_shard(q_lora):
    """SGLang 0.5.23's DeepSeek-V3 loader (deepseek_weight_loader.py): each exported tensor fills its own
    (parameter, shard, expert); q_a_proj and kv_a_proj_with_mqa are fused only with a q_lora_rank; the MTP layer is
    skipped there (served without speculative decoding), as by the trainer."""
    from scalerl_mega.convert.hf_layout import sglang_deepseek_v3_target

    cfg = _cfg_dict(q_lora_rank=q_lora, num_nextn_predict_layers=1)
    names = tables.hf_names(dims_from_hf_config(cfg))
    targets = [sglang_deepseek_v3_target(n, cfg) for n in names]
    assert None not in targets and len(set(targets)) == len(names)
    by_param: dict[str, set] = {}
    for param, shard, expert in targets:
        by_param.setdefault(param, set()).add((shard, expert))
    assert by_param["model.layers.1.mlp.experts.w13_weight"] == {(s, e) for s in ("w1", "w3") for e in range(8)}
    assert by_param["model.layers.3.mlp.experts.w2_weight"] == {("w2", e) for e in range(8)}
    assert by_param["model.layers.0.mlp.gate_up_proj.weight"] == {(0, None), (1, None)}
    assert by_param["model.layers.2.mlp.shared_experts.gate_up_proj.weight"] == {(0, None), (1, None)}
    assert ("model.layers.1.self_attn.fused_qkv_a_proj_with_mqa.weight" in by_param) == bool(q_lora)
    assert ("model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in by_param) == (not q_lora)
    assert {"model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.1.self_attn.kv_b_proj.weight"} <= set(by_param)
    assert sglang_deepseek_v3_target("model.layers.4.eh_proj.weight", cfg) is None


def test_engine_manifest_is_the_checkpoint_format_and_accepts_the_trainer_export_plan():
    """The local engine's DeepseekV3ForCausalLM (built from the tiny preset's config) expects exactly the table's
    names and shapes (score-correction biases included), and the trainer's export plan fills it."""
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.local import LocalModelSpec, model_manifest
    from scalerl_mega.trainer.megatron.export import export_plan

    m = load_model_preset("tiny_deepseek_v3")
    arch, kwargs = hf_config_from_model(m)
    manifest = model_manifest(LocalModelSpec(arch=arch, config=kwargs, init_seed=0))
    assert sorted(manifest.specs) == sorted(tables.hf_names(dims_from_model_config(m)))
    assert "model.layers.3.mlp.gate.e_score_correction_bias" in manifest.specs
    assert manifest.problems(export_plan(m)) == []


def test_local_engine_serves_mla_from_its_latent_cache():
    """The local engine's slot cache holds DeepSeek-V3's latents (compressed KV 16 + RoPE key 8 per token and
    layer, one head): three rows of different prompt lengths decoded together (past the YaRN original context of
    16) have the log-probs of a plain transformers forward over each whole sequence."""
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
    from scalerl_mega.rollout.local import LocalModelSpec, build_model
    from scalerl_mega.types import SamplingParams

    arch, kwargs = hf_config_from_model(load_model_preset("tiny_deepseek_v3"))
    model = build_model(LocalModelSpec(arch=arch, config=kwargs, init_seed=0))
    core = GenerationCore(model, config=CoreConfig(max_batch=4, max_seq_len=40))
    assert tuple(core.kv.keys[0].shape[1::2]) == (1, 16) and core.kv.values[0].shape[-1] == 8
    for i, prompt in enumerate(([3, 4], [3, 4, 6], [9, 8, 7, 6])):
        core.add(GenRequest(rid=str(i), prompt_id=str(i), sample_index=0, prompt_ids=prompt,
                            sampling=SamplingParams(max_new_tokens=20, temperature=1.0), seed=i))
    done = core.run_until_done()
    assert len(done) == 3
    for c in done:
        full = torch.tensor([list(c.prompt_ids) + list(c.output_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, len(c.prompt_ids) - 1:-1].float(), -1)
        ref = logp.gather(1, torch.tensor(c.output_ids)[:, None])[:, 0]
        assert len(c.output_ids) == 20 and (ref - torch.tensor(c.gen_logprobs)).abs().max() < 1e-5
