"""FP8 on sync (`rollout.quantization=fp8`): the export seam's wire format and plan (single and per-stage senders),
the FP8 engine's manifest and loading (it holds the dequantized FP8 weights), the launch flag, and the on-policy
mismatch metric. No Megatron process groups: the export's emitter and plans are pure."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl_mega.quant import fp8


def _model():
    from scalerl_mega.model.config import load_model_preset

    return load_model_preset("tiny_dense")


def test_emitter_quantizes_linear_projections_only_and_keeps_the_fp32_head():
    from scalerl_mega.trainer.megatron.export import hf_emitter, split_quantization

    m = _model()
    assert split_quantization("bfloat16+fp32_head+fp8") == ("bfloat16+fp32_head", "fp8")
    assert split_quantization("bfloat16") == ("bfloat16", "none")
    emit = hf_emitter("bfloat16+fp32_head+fp8", m)
    w = torch.randn(130, 64)
    out = list(emit("model.layers.0.self_attn.q_proj.weight", w))
    assert [(n, t.dtype) for n, t in out] == [("model.layers.0.self_attn.q_proj.weight", torch.float8_e4m3fn),
                                              ("model.layers.0.self_attn.q_proj.weight_scale_inv", torch.float32)]
    q, s = fp8.quantize_blockwise(w.to(torch.bfloat16))  # cast first, then quantized
    assert torch.equal(out[0][1].view(torch.uint8), q.view(torch.uint8)) and torch.equal(out[1][1], s)
    head = list(emit("lm_head.weight", torch.randn(256, 64)))
    assert [(n, t.dtype) for n, t in head] == [("lm_head.weight", torch.float32)]  # the FP32 head stays FP32
    norm = list(emit("model.norm.weight", torch.ones(64)))
    assert norm[0][1].dtype == torch.bfloat16


def test_fp8_plan_and_bytes_about_half_of_bf16():
    """The plan of an FP8 push: every linear projection FP8 + its scale, the rest bf16. Bytes by hand for
    tiny_dense (hidden 64, vocab 256 untied): the FP8 weights cost 1 byte + one 4-byte scale per block."""
    from scalerl_mega.weight_sync.plan import SenderLayout, spec_bytes
    from scalerl_mega.trainer.megatron.export import export_plan
    from scalerl_mega.trainer.megatron.export_senders import sender_plan

    m = _model()
    bf16 = export_plan(m, dtype="bfloat16")
    plan = export_plan(m, dtype="bfloat16+fp8")
    lin = [s for s in bf16 if fp8.is_fp8_weight(s.name, s.shape)]
    assert len(lin) == 7 * m.num_layers
    assert len(plan) == len(bf16) + len(lin)
    by = {s.name: s for s in plan}
    for s in lin:
        assert by[s.name].dtype == "float8_e4m3fn" and by[s.name + "_scale_inv"].dtype == "float32"
        assert by[s.name + "_scale_inv"].shape == tuple(math.ceil(d / 128) for d in s.shape)
    n_lin = sum(math.prod(s.shape) for s in lin)
    n_all = sum(math.prod(s.shape) for s in bf16)
    scales = sum(math.prod(fp8.scale_shape(s.shape)) for s in lin)
    assert sum(spec_bytes(s) for s in plan) == 2 * (n_all - n_lin) + n_lin + 4 * scales
    assert sum(spec_bytes(s) for s in bf16) == 2 * n_all
    # the per-stage senders: the same tensors, each FP8 weight directly followed by its scale
    per = sender_plan(m, SenderLayout(pp=2, ep=1), dtype="bfloat16+fp8", params_dtype="bfloat16")
    flat = [s for specs in per.values() for s in specs]
    assert sorted(s.name for s in flat) == sorted(by) and all(by[s.name] == s for s in flat)
    for specs in per.values():
        for i, s in enumerate(specs):
            if s.dtype == "float8_e4m3fn":
                assert specs[i + 1].name == s.name + "_scale_inv"


def test_bytes_per_param_gives_the_fp8_share():
    """A projection's bytes per parameter under FP8 / bf16: 1.000244 / 2 (the planner's input)."""
    assert fp8.bytes_per_param("fp8") / fp8.bytes_per_param("none", dtype_bytes=2) == pytest.approx(0.500122)


def _core(quantization: str):
    from scalerl_mega.rollout.core import CoreConfig, GenerationCore
    from scalerl_mega.rollout.local_spec import LocalModelSpec, build_model, model_manifest

    spec = LocalModelSpec(arch="qwen3_moe", quantization=quantization, config=dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=48, num_experts=4, num_experts_per_tok=2))
    return GenerationCore(build_model(spec), config=CoreConfig(max_batch=2, max_seq_len=16)), model_manifest(spec)


def test_fp8_engine_manifest_loading_and_initial_weights():
    """An FP8 engine accepts FP8 weights + scales (not unquantized ones), loads their dequantized values (Qwen3-MoE
    experts into their slices of the fused parameter), and starts from FP8 weights; an unquantized engine
    rejects the scales before anything is sent."""
    from scalerl_mega.rollout.hf_params import checkpoint_target
    from scalerl_mega.weight_sync import WeightSyncError, spec_of

    core, manifest = _core("fp8")
    params = dict(core.model.named_parameters())
    names = list(manifest.specs)
    expert = "model.layers.0.mlp.experts.2.up_proj.weight"
    assert manifest.specs[expert].dtype == "float8_e4m3fn" and expert + "_scale_inv" in manifest.specs
    before = checkpoint_target(params, expert).detach().clone()
    assert torch.equal(fp8.dequantize_blockwise(*fp8.quantize_blockwise(before)), before)  # FP8 from the start
    torch.manual_seed(3)
    update = {n: torch.randn(manifest.specs[n].shape) for n in names if not n.endswith("_scale_inv")}
    pushed = list(fp8.quantize_named(update.items()))
    manifest.check([spec_of(n, t) for n, t in pushed], version=1)
    with pytest.raises(WeightSyncError, match="float8_e4m3fn"):
        manifest.check([spec_of(n, t) for n, t in update.items()], version=1)
    staged = []
    for i in range(0, len(pushed), 5):  # buckets of 5: a scale may come in the bucket after its weight
        staged += [(n, t) for n, _, t in core.check_weights(pushed[i:i + 5])]
    core.load_weights(staged)
    deq = dict(fp8.dequantize_named(pushed))
    assert torch.equal(checkpoint_target(params, expert), deq[expert])
    assert not torch.equal(deq[expert], update[expert])
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(params[norm], update[norm])
    with pytest.raises(ValueError, match=r"q_proj.weight_scale_inv' has shape \(2, 1\)"):
        core.check_weights([("model.layers.0.self_attn.q_proj.weight_scale_inv", torch.ones(2, 1))])
    _, plain = _core("none")
    with pytest.raises(WeightSyncError, match="_scale_inv' is not a parameter"):
        plain.check([spec_of(n, t) for n, t in pushed], version=1)


def test_launch_flag_and_config_check():
    from scalerl_mega.config.rollout import RolloutConfig, validate_rollout
    from scalerl_mega.rollout.sglang.launch import SGLangServerConfig, launch_command

    cmd = launch_command(SGLangServerConfig(model_path="/m", quantization="fp8"))
    assert cmd[cmd.index("--quantization") + 1] == "fp8"
    assert "--quantization" not in launch_command(SGLangServerConfig(model_path="/m"))
    with pytest.raises(ValueError, match="rollout.quantization"):
        validate_rollout(RolloutConfig(quantization="int8"))


def test_onpolicy_mismatch_kl():
    """k3 per on-policy token: log-ratios (train - gen) 0.5 and -0.2 on one on-policy sample; a stale sample's
    token (version 0 != trainer version 1) is left out."""
    from scalerl_mega.trainer.policy_loss import finalize_train_metrics, policy_metrics

    logp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    mb = {"loss_mask": torch.ones(2, 2), "gen_logp": torch.tensor([[-1.5, -1.8], [-3.0, -1.0]]),
          "token_weights": torch.full((2, 2), 0.25), "weight_version": torch.tensor([[1, 1], [0, 1]]),
          "trainer_version": torch.tensor(1)}
    m = policy_metrics(logp, mb, torch.tensor(0.0))
    want = ((math.exp(0.5) - 1 - 0.5) + (math.exp(-0.2) - 1 + 0.2)) / 2
    out = finalize_train_metrics({k: float(v) for k, v in m.items()})
    assert out["onpolicy_mismatch_kl"] == pytest.approx(want, rel=1e-6)
    assert "onpolicy_kl_sum" not in out


@pytest.mark.parametrize("name", ["llama3_8b", "qwen3_30b_a3b"])
def test_planner_counts_fp8_generator_weights(name):
    """`--gen-quantization fp8` / `rollout.quantization=fp8`: every projection parameter (attention, MLPs, experts)
    drops from 2 bytes to 1 + 4/128^2; embedding, head, norms and routers stay bf16. At TP1 and TP2."""
    from scalerl_mega.cluster import plan as P

    m = P.MODELS[name]
    proj = m.layers * m.attention_params() + m.dense_layers * m.dense_mlp_params() + m.moe_layers * (
        m.expert_params_per_layer() + m.shared_expert_params())
    for tp in (1, 2):
        none = P.generator_weight_bytes(m, P.GenLayout(tp=tp))
        q = P.generator_weight_bytes(m, P.GenLayout(tp=tp, quantization="fp8"))
        assert none - q == pytest.approx(proj * (2 - (1 + 4 / 128**2)) / tp, abs=2)


def test_float8_crosses_gloo_as_bytes():
    """gloo has no float8 type (its broadcast raises "Invalid scalar type"); `wire_tensors` sends the bytes as a
    uint8 view of the same storage, other dtypes unchanged."""
    import torch.distributed as dist

    from scalerl_mega.weight_sync import destroy_group, free_port, init_custom_process_group, wire_tensors

    g = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0,
                                  group_name="fp8_wire_test", timeout_s=30)
    try:
        q = torch.randn(4, 4).to(torch.float8_e4m3fn)
        with pytest.raises(RuntimeError, match="Invalid scalar type"):
            dist.broadcast(q, src=0, group=g)
        wire = wire_tensors([q, torch.ones(2)], g)
        assert wire[0].dtype == torch.uint8 and wire[0].data_ptr() == q.data_ptr() and wire[1].dtype == torch.float32
        dist.broadcast(wire[0], src=0, group=g)
    finally:
        destroy_group(g)


def test_planner_fp8_kv_cache_halves_the_kv_bytes(capsys, monkeypatch):
    """`tools/plan.py --kv-cache-dtype fp8_e4m3` (SGLang's flag): one byte per cached K/V element. Qwen3-30B-A3B on
    its script's layout (generator TP 2 of 4 KV heads): 2 (K, V) x 48 layers x 2 heads x 128 x 2 bytes = 49,152
    bytes per token per GPU in bf16, half in FP8, so the pool holds twice the full sequences; the docs say so."""
    import importlib
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setattr(sys, "path", [str(root / "tools"), *sys.path])
    plan_tool = importlib.import_module("plan")
    gen = {}
    for kv in ("auto", "fp8_e4m3"):
        assert plan_tool.main(["--layout", "train_qwen3_moe", "--kv-cache-dtype", kv, "--json"]) == 0
        gen[kv] = json.loads(capsys.readouterr().out)["generator"]
    per_tok = {kv: int(g["notes"][0].split("=")[1].replace(",", "")) for kv, g in gen.items()}
    assert per_tok == {"auto": 2 * 48 * 2 * 128 * 2, "fp8_e4m3": 2 * 48 * 2 * 128}
    assert gen["fp8_e4m3"]["components_bytes"]["kv_cache_min"] * 2 == gen["auto"]["components_bytes"]["kv_cache_min"]
    seqs = {kv: int(g["notes"][1].split(" = ")[2].split()[0]) for kv, g in gen.items()}
    docs = " ".join((root / "docs" / "running_scalerl.md").read_text().split())
    assert (f"{per_tok['auto']:,} -> {per_tok['fp8_e4m3']:,} KV bytes per token per GPU, {seqs['auto']} -> "
            f"{seqs['fp8_e4m3']} full 16,384-token sequences") in docs
