"""The local engine and the weight manifest on Qwen3 / Qwen3-MoE.

Weights travel under the published checkpoint names (per expert for Qwen3-MoE), which transformers 5
fuses on load: the engine's manifest is what transformers itself writes (`save_pretrained`), the engine
loads per-expert tensors into its fused expert parameters, and its recorded routes follow HF Qwen3-MoE's
router (softmax over all experts, top-k, renormalised when `norm_topk_prob`), recomputed here in float64
from the router logits. SGLang 0.5.23's Qwen3 loaders (transcribed in `convert.hf_layout`) take every
exported tensor into a distinct parameter shard.
"""

from __future__ import annotations

import random

import pytest
import torch

from scalerl_mega.convert import tables
from scalerl_mega.convert.model_config import dims_from_model_config
from scalerl_mega.model.config import load_model_preset
from scalerl_mega.model.hf_export import hf_config_from_model
from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest, moe_routers
from scalerl_mega.rollout.local import LocalModelSpec, build_model, model_manifest
from scalerl_mega.types import SamplingParams
from tests.support.routing_probe import hf_router_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec(preset: str, *, seed: int = 0, **changes) -> tuple[LocalModelSpec, object]:
    import dataclasses

    m = dataclasses.replace(load_model_preset(preset), **changes)
    arch, kwargs = hf_config_from_model(m)
    return LocalModelSpec(arch=arch, config=kwargs, init_seed=seed), m


@pytest.mark.parametrize("preset", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_manifest_is_the_checkpoint_format_and_accepts_the_trainer_export_plan(preset):
    from scalerl_mega.trainer.megatron.export import export_plan

    spec, m = _spec(preset)
    manifest = model_manifest(spec)
    assert sorted(manifest.specs) == sorted(tables.hf_names(dims_from_model_config(m)))
    assert manifest.problems(export_plan(m)) == []
    if preset == "tiny_qwen3":  # tied: the head is an alias of the embedding, not a second tensor
        assert manifest.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
        return
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in manifest.specs
    assert not any(n.endswith("experts.gate_up_proj") for n in manifest.specs)
    plan = [s for s in export_plan(m) if s.name != "model.layers.2.mlp.experts.1.down_proj.weight"]
    wrong = [s if s.name != "model.layers.0.mlp.experts.0.gate_proj.weight" else type(s)(s.name, (64, 32), s.dtype)
             for s in plan]
    problems = manifest.problems(wrong)
    assert problems[0] == ("'model.layers.0.mlp.experts.0.gate_proj.weight': the update has [64, 32], the generator "
                           "expects [32, 64]")
    assert "'model.layers.2.mlp.experts.1.down_proj.weight'" in problems[1] and "keep their old weights" in problems[1]


def test_engine_loads_per_expert_checkpoint_tensors_into_its_fused_experts(tmp_path):
    """A tiny Qwen3-MoE saved by transformers (per-expert files), pushed tensor by tensor into an engine
    built with other weights, gives exactly from_pretrained's logits; a wrong expert index or shape is
    rejected naming the tensor, before anything is copied."""
    from transformers import AutoModelForCausalLM

    from scalerl_mega.convert.st_io import SafetensorsDir
    from scalerl_mega.convert.tiny import save_tiny_hf

    save_tiny_hf("qwen3_moe", str(tmp_path / "hf"), seed=3)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    src = SafetensorsDir(str(tmp_path / "hf"))
    tensors = [(n, src.get(n)) for n in src.names()]
    assert any(".experts.2.down_proj.weight" in n for n, _ in tensors)
    import json

    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    model = build_model(LocalModelSpec(arch="qwen3_moe", config=cfg, init_seed=7))
    core = GenerationCore(model, config=CoreConfig(max_batch=2, max_seq_len=32))
    before = {n: p.clone() for n, p in model.named_parameters()}
    bad = tensors[:3] + [("model.layers.0.mlp.experts.4.gate_proj.weight", torch.zeros(32, 64))]
    with pytest.raises(ValueError, match=r"unknown parameter name 'model.layers.0.mlp.experts.4.gate_proj.weight'"):
        core.load_weights(bad)
    with pytest.raises(ValueError, match=r"'model.layers.3.mlp.experts.0.down_proj.weight' has shape \(32, 64\), "
                                         r"model expects \(64, 32\)"):
        core.load_weights([("model.layers.3.mlp.experts.0.down_proj.weight", torch.zeros(32, 64))])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing applied
    assert len(core.load_weights(tensors)) == len(tensors)
    tokens = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, ref(tokens).logits)


def _oracle_routes(model, seq, *, top_k: int, renormalise: bool):
    """[N, L, K] expert ids and float64 weights of a full-sequence forward, recomputed from the router
    logits: softmax over every expert, top-k, renormalised over the top-k when `renormalise`."""
    probs = torch.softmax(hf_router_logits(model, seq, output=0), dim=-1)  # [N, L, E]
    w, ids = torch.topk(probs, top_k, dim=-1)
    return ids, (w / w.sum(-1, keepdim=True) if renormalise else w)


@pytest.mark.parametrize("renormalise", [True, False])
def test_recorded_routes_follow_qwen3_moe_routing(renormalise):
    spec, m = _spec("tiny_qwen3_moe", moe_router_pre_softmax=not renormalise)
    model = build_model(spec)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
        for r in moe_routers(model):
            r.weight.mul_(30.0)  # spread the router logits: routes differ between tokens
    assert len(moe_routers(model)) == 3  # layer 1 is dense (moe_dense_layers / mlp_only_layers)
    core = GenerationCore(model, config=CoreConfig(max_batch=3, max_seq_len=32, record_routes=True))
    rng = random.Random(0)
    for i in range(5):
        core.add(GenRequest(rid=str(i), prompt_id=str(i), sample_index=0,
                            prompt_ids=[rng.randrange(m.vocab_size) for _ in range(rng.randrange(2, 8))],
                            sampling=SamplingParams(max_new_tokens=rng.randrange(3, 10)), seed=100 + i))
    out = core.run_until_done()
    used = set()
    for c in out:
        R = c.routes
        R.check(where="test")
        seq = c.prompt_ids + c.output_ids
        n = R.num_positions
        assert (n, R.num_layers, R.topk) == (len(seq) - 1, 3, 2)
        ids = torch.tensor(R.expert_ids).view(n, 3, 2).long()
        w = torch.tensor(R.weights, dtype=torch.float64).view(n, 3, 2)
        ref_ids, ref_w = _oracle_routes(model, seq[:-1], top_k=2, renormalise=renormalise)
        assert torch.equal(ids, ref_ids)
        # float32 softmax of router logits spread x30, KV-cached steps against one full forward: a few float32
        # ulps of a probability (measured 1.27e-6 with numpy 2.4.6 / scipy 1.17.1 wheels, below 1e-6 before)
        assert float((w - ref_w).abs().max()) < 4e-6
        if renormalise:
            assert torch.allclose(w.sum(-1), torch.ones(n, 3, dtype=torch.float64), atol=1e-6)
        used |= set(ids.flatten().tolist())
    assert used == {0, 1, 2, 3}


def test_routes_not_recorded_unless_asked():
    spec, _ = _spec("tiny_qwen3_moe")
    core = GenerationCore(build_model(spec), config=CoreConfig(max_batch=2, max_seq_len=24))
    core.add(GenRequest(rid="1", prompt_id="1", sample_index=0, prompt_ids=[3, 4],
                        sampling=SamplingParams(max_new_tokens=3), seed=1))
    assert core.run_until_done()[0].routes is None
    dense, _ = _spec("tiny_qwen3")
    assert moe_routers(build_model(dense)) == []


def test_every_exported_tensor_has_its_own_sglang_parameter_shard():
    """SGLang 0.5.23's Qwen3-MoE loader: q/k/v fill the three qkv_proj shards; each expert's gate/up/down
    fill w13 (w1, w3) and w2 of that expert; the dense layer's gate/up fill gate_up_proj 0/1; the rest
    (q/k norms, the `mlp.gate` router, norms, embedding, head) load under their own names."""
    from scalerl_mega.convert.hf_layout import sglang_qwen3_target, sglang_warnings

    spec, m = _spec("tiny_qwen3_moe")
    names = tables.hf_names(dims_from_model_config(m))
    targets = [sglang_qwen3_target(n) for n in names]
    assert len(set(targets)) == len(names)
    by_param: dict[str, set] = {}
    for param, shard, expert in targets:
        by_param.setdefault(param, set()).add((shard, expert))
    assert by_param["model.layers.0.mlp.experts.w13_weight"] == {(s, e) for s in ("w1", "w3") for e in range(4)}
    assert by_param["model.layers.3.mlp.experts.w2_weight"] == {("w2", e) for e in range(4)}
    assert by_param["model.layers.2.self_attn.qkv_proj.weight"] == {("q", None), ("k", None), ("v", None)}
    assert by_param["model.layers.1.mlp.gate_up_proj.weight"] == {(0, None), (1, None)}
    assert {"model.layers.0.mlp.gate.weight", "model.layers.0.self_attn.q_norm.weight", "lm_head.weight"} <= set(by_param)
    every_layer_moe = {**spec.config, "mlp_only_layers": []}
    assert sglang_warnings("causal", {"model_type": "qwen3_moe", **every_layer_moe}) == []
    tied = sglang_warnings("causal", {"model_type": "qwen3_moe", "tie_word_embeddings": True})
    assert len(tied) == 1 and "never loads it from model.embed_tokens.weight" in tied[0]
    dense = sglang_warnings("causal", {"model_type": "qwen3_moe", **spec.config})  # tiny_qwen3_moe: layer 1 dense
    assert len(dense) == 1 and "mlp_only_layers=[1]" in dense[0] and "makes every layer sparse" in dense[0]


def test_sglang_engine_refuses_a_qwen3_moe_it_would_serve_wrongly():
    """rollout=sglang with a Qwen3-MoE that has a dense layer (tiny_qwen3_moe's layer 1): refused naming
    SGLang's limitation before any server is launched or attached."""
    from scalerl_mega.build import build_sglang_engine
    from scalerl_mega.compose import compose

    cfg = compose(["experiment=demo", "model=tiny_qwen3_moe", "model.shared_expert_ffn=0", "rollout=sglang",
                   "model.vocab_size=48"])
    with pytest.raises(ValueError, match=r"rollout.engine=sglang: dense layers \(mlp_only_layers=\[1\].*makes every "
                                         r"layer sparse"):
        build_sglang_engine(cfg, None, None)
