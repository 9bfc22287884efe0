"""The pre-send weight manifest check: the trainer's export plan, derived from the model
dimensions through the conversion tables, agrees exactly with the generator model's parameters,
derived independently by instantiating the HF class on the meta device -- for every model preset,
tied and untied -- and any wrong name, shape or missing tensor is named."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalerl_mega.weight_sync import (PlannedTensors, TensorSpec, WeightManifest, WeightSyncError,
                                              checked_update, follow_plan)


def _manifest_and_plan(preset: str, *, tie: bool, dtype: str | None = "bfloat16"):
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.local import LocalModelSpec, model_manifest
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.megatron.export import export_plan

    m = dataclasses.replace(load_model_preset(preset), tie_embeddings=tie)
    arch, kw = hf_config_from_model(m)
    return m, model_manifest(LocalModelSpec(arch=arch, config=kw)), export_plan(m, dtype=dtype)


def export_plan_of(m, dtype):
    from scalerl_mega.trainer.megatron.export import export_plan

    return export_plan(m, dtype=dtype)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("preset", ["tiny_dense", "tiny_moe", "llama3_8b", "scout_17b16e"])
def test_export_plan_matches_the_generator_model(preset, tie):
    m, man, plan = _manifest_and_plan(preset, tie=tie)
    assert man.problems(plan) == []
    # hand count: embed + final norm (+ lm_head) + per layer 2 norms + q,k,v,o + MLP tensors
    per_dense, per_moe = 6 + 3, 6 + 1 + 2 + 3  # router, fused experts gate_up/down, shared gate/up/down
    n_moe = sum(m.is_moe_layer(i) for i in range(m.num_layers)) if m.num_experts else 0
    assert len(plan) == 2 + (not tie) + per_dense * (m.num_layers - n_moe) + per_moe * n_moe
    assert man.aliases == ({"lm_head.weight": "model.embed_tokens.weight"} if tie else {})
    q = next(s for s in plan if s.name == "model.layers.0.self_attn.q_proj.weight")
    assert q.shape == (m.num_attention_heads * m.kv_channels, m.hidden_size) and q.dtype == "bfloat16"
    head = next(s for s in plan if s.name == ("model.embed_tokens.weight" if tie else "lm_head.weight"))
    assert head.shape == (m.vocab_size, m.hidden_size)
    assert head.dtype == "bfloat16"  # the generator's dtype, head included (SGLang rounds it on load anyway)
    # "+fp32_head" (the local engine, which keeps an FP32 head copy): an FP32 head keeps its parameter dtype
    head_kept = next(s for s in export_plan_of(m, "bfloat16+fp32_head") if s.name == head.name)
    assert head_kept.dtype == (None if m.fp32_lm_head else "bfloat16")
    assert [s for s in export_plan_of(m, "bfloat16+fp32_head") if s.name != head.name] == [
        s for s in plan if s.name != head.name]


def test_every_kind_of_mismatch_is_named():
    _, man, plan = _manifest_and_plan("tiny_dense", tie=False)
    last = plan[-1]
    bad = plan[:-1] + [TensorSpec(last.name, (last.shape[0] + 1, *last.shape[1:]), last.dtype)]
    (p,) = man.problems(bad)
    assert repr(last.name) in p and str(list(last.shape)) in p and str([last.shape[0] + 1, *last.shape[1:]]) in p
    q = "model.layers.0.self_attn.q_proj.weight"
    renamed = [dataclasses.replace(s, name=s.name.replace("q_proj", "qproj")) if s.name == q else s for s in plan]
    probs = man.problems(renamed)
    assert len(probs) == 2 and "'model.layers.0.self_attn.qproj.weight' is not a parameter" in probs[0]
    assert "closest: 'model.layers.0.self_attn.q_proj.weight'" in probs[0]
    assert "1 parameter(s)" in probs[1] and "'model.layers.0.self_attn.q_proj.weight'" in probs[1]
    with pytest.raises(WeightSyncError, match=r"v7 rejected before the first bucket was sent, nothing was applied"):
        man.check(bad, version=7)
    assert man.problems(plan + [plan[0]]) == []  # a tied alias sent under both names is fine (state_dict())


def test_manifest_dtype_is_checked_only_where_fixed():
    man = WeightManifest([TensorSpec("a", (2,), "float32"), TensorSpec("b", (3,))], source="hand")
    assert man.problems([TensorSpec("a", (2,), "float32"), TensorSpec("b", (3,), "bfloat16")]) == []
    (p,) = man.problems([TensorSpec("a", (2,), "bfloat16"), TensorSpec("b", (3,), "float32")])
    assert p == "'a': the update has bfloat16[2], the generator expects float32[2]"


def test_checked_update_checks_lists_whole_and_streams_plans_lazily():
    man = WeightManifest([TensorSpec("a", (2,)), TensorSpec("b", (3,))], source="hand")
    good = [("a", torch.zeros(2)), ("b", torch.zeros(3))]
    assert [n for n, _ in checked_update(iter(good), man, version=1)] == ["a", "b"]  # a bare iterator: collected
    with pytest.raises(WeightSyncError, match=r"'b': the update has float32\[4\]"):
        checked_update(iter([("a", torch.zeros(2)), ("b", torch.zeros(4))]), man, version=1)
    produced = []

    def source():
        for n, t in good:
            produced.append(n)
            yield n, t

    out = checked_update(PlannedTensors(source(), plan=[TensorSpec("a", (2,)), TensorSpec("b", (3,))]), man, version=1)
    assert produced == []  # checked by its plan, nothing produced yet
    assert [n for n, _ in out] == ["a", "b"] and produced == ["a", "b"]
    assert checked_update(good, None, version=1) is good  # no manifest: passed through


@pytest.mark.parametrize("stream,msg", [
    ([("a", torch.zeros(2)), ("b", torch.zeros(3, dtype=torch.float64))], r"'b' is float64\[3\], the plan said float32\[3\]"),
    ([("a", torch.zeros(2)), ("c", torch.zeros(3))], r"'c' is not in the plan"),
    ([("a", torch.zeros(2)), ("a", torch.zeros(2))], r"'a' came twice"),
    ([("a", torch.zeros(2))], r"ended without 1 planned tensor\(s\), e.g. 'b'"),
])
def test_follow_plan_stops_a_stream_that_strays(stream, msg):
    plan = [TensorSpec("a", (2,), "float32"), TensorSpec("b", (3,), "float32")]
    got = []
    with pytest.raises(WeightSyncError, match=msg):
        for n, _ in follow_plan(stream, plan):
            got.append(n)
    assert got == ["a"]  # the first, fitting tensor went through before the stray one was seen
    assert [n for n, _ in follow_plan(reversed([("a", torch.zeros(2)), ("b", torch.zeros(3))]), plan)] == ["b", "a"]
