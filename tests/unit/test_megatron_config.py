"""Megatron trainer configs: presets, published parameter counts, validation messages, LR schedule.

Pure Python: nothing here starts a process group (one test checks that explicitly).
"""

from __future__ import annotations

import pytest

from scalerl_mega.model.config import (
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    load_model_preset,
)


@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe", "llama3_8b", "scout_17b16e"])
def test_presets_load_and_validate(name):
    cfg = load_model_preset(name)
    assert cfg.name == name
    assert cfg.fp32_lm_head  # paper Sec. 3.2: FP32 logits everywhere


def test_llama31_8b_parameter_count_matches_published():
    counts = load_model_preset("llama3_8b").num_params()
    assert counts["total"] == counts["active"]
    assert counts["total"] == pytest.approx(8.03e9, rel=0.002)  # Meta: 8.03B


def test_scout_parameter_counts_match_published():
    counts = load_model_preset("scout_17b16e").num_params()
    assert counts["active"] == pytest.approx(17e9, rel=0.02)  # "17B active"
    # "109B total" includes the vision tower (~1B); the text model alone is ~107.8B
    assert counts["total"] == pytest.approx(109e9, rel=0.02)
    assert counts["total"] < 109e9


def test_param_count_hand_example():
    # V=10, h=4, f=6, 1 layer, 2 heads of 2, 1 kv group, untied:
    # attn q 4*4 + k,v 2*(4*2) + o 4*4 + 2 norms*4 = 56; mlp 3*4*6 = 72; embed+out 2*40 + final norm 4
    cfg = ModelConfig(vocab_size=10, hidden_size=4, ffn_hidden_size=6, num_layers=1, num_attention_heads=2,
                      num_query_groups=1).validate()
    assert cfg.num_params() == {"total": 56 + 72 + 84, "active": 56 + 72 + 84}
    # MoE: 3 experts of width 2 (3*4*2=24 each), top-1, shared width 2 (24), router 4*3=12
    moe = ModelConfig(vocab_size=10, hidden_size=4, ffn_hidden_size=6, num_layers=1, num_attention_heads=2,
                      num_query_groups=1, num_experts=3, moe_topk=1, moe_router_pre_softmax=True,
                      moe_ffn_hidden_size=2, shared_expert_ffn=2).validate()
    assert moe.num_params() == {"total": 56 + 12 + 72 + 24 + 84, "active": 56 + 12 + 24 + 24 + 84}


def test_tiny_presets_are_tiny():
    assert load_model_preset("tiny_dense").num_params()["total"] < 200_000
    moe = load_model_preset("tiny_moe")
    assert moe.num_experts == 4 and moe.moe_topk == 1 and moe.shared_expert_ffn > 0


@pytest.mark.parametrize("parallel, model_overrides, needles", [
    (ParallelConfig(tp=3), {}, ["tp=3", "num_attention_heads=4"]),
    (ParallelConfig(tp=4), {}, ["tp=4", "num_query_groups=2"]),
    (ParallelConfig(ep=3), {"num_experts": 4}, ["ep=3", "num_experts=4"]),
    (ParallelConfig(tp=2, sequence_parallel=False), {"num_experts": 4}, ["sequence_parallel", "tp=2"]),
    (ParallelConfig(etp=2), {}, ["etp=2", "dense"]),
    (ParallelConfig(etp=3, ep=2), {"num_experts": 4, "moe_ffn_hidden_size": 64}, ["etp=3", "moe_ffn_hidden_size"]),
    (ParallelConfig(tp=2, etp=1), {"num_experts": 4}, ["etp=1 with ep=1 and tp=2", "parallel.etp"]),
    (ParallelConfig(pp=3), {}, ["pp=3", "num_layers=2"]),
    (ParallelConfig(ep=2), {}, ["ep=2", "dense"]),
    (ParallelConfig(tp=1, sequence_parallel=True), {}, ["sequence_parallel=True", "tp=1"]),
    (ParallelConfig(moe_token_dispatcher="flex"), {}, ["moe_token_dispatcher", "flex"]),
])
def test_parallel_validation_names_key_and_value(parallel, model_overrides, needles):
    base = dict(name="m", vocab_size=256, hidden_size=64, ffn_hidden_size=128, num_layers=2,
                num_attention_heads=4, num_query_groups=2)
    if model_overrides.get("num_experts"):
        base.update(moe_topk=2)
    model = ModelConfig(**{**base, **model_overrides})
    with pytest.raises(ValueError) as err:
        MegatronConfig(model=model, parallel=parallel).validate()
    for needle in needles:
        assert needle in str(err.value)


def test_top1_softmax_without_pre_softmax_is_refused():
    with pytest.raises(ValueError, match=r"moe_topk=1 with moe_router_pre_softmax=False"):
        ModelConfig(num_experts=4, moe_topk=1, moe_router_pre_softmax=False).validate()
    ModelConfig(num_experts=4, moe_topk=1, moe_router_pre_softmax=True).validate()
    ModelConfig(num_experts=4, moe_topk=1, moe_router_score_function="sigmoid").validate()


def test_model_validation_messages():
    with pytest.raises(ValueError, match=r"arch='gpt2'"):
        ModelConfig(arch="gpt2").validate()
    with pytest.raises(ValueError, match=r"no_rope_freq=4 is a Llama-4 feature but arch='llama'"):
        ModelConfig(no_rope_freq=4).validate()
    with pytest.raises(ValueError, match=r"hidden_size=0"):
        ModelConfig(hidden_size=0).validate()
    with pytest.raises(ValueError, match=r"moe_topk=5"):
        ModelConfig(num_experts=4, moe_topk=5).validate()
    with pytest.raises(ValueError, match=r"world_size=1 is not divisible by etp\*ep\*pp=1\*2\*1=2 "
                                         r"\(keys parallel.etp, parallel.ep, parallel.pp\)"):
        ParallelConfig(ep=2).validate(world_size=1)


@pytest.mark.parametrize("parallel, world, needles", [
    (ParallelConfig(tp=4), 6, ["world_size=6", "tp*cp*pp=4*1*1=4", "parallel.tp"]),
    (ParallelConfig(tp=2, cp=2, pp=2), 12, ["tp*cp*pp=2*2*2=8", "parallel.cp"]),
    (ParallelConfig(tp=4, ep=16, etp=4), 16, ["etp*ep*pp=4*16*1=64", "parallel.etp", "parallel.ep"]),
    (ParallelConfig(ep=16, pp=2), 16, ["etp*ep*pp=1*16*2=32"]),
])
def test_world_divisibility_names_the_layout_keys(parallel, world, needles):
    with pytest.raises(ValueError) as err:
        parallel.validate(world_size=world)
    for needle in needles:
        assert needle in str(err.value)


def test_scout_layout_of_the_slurm_script_is_accepted():
    """slurm/train_scout.sh: 4 trainer nodes x 4 GPUs, TP 4, EP 16 (ETP 1 by default), SP set for MoE+TP."""
    scout = load_model_preset("scout_17b16e")
    par = ParallelConfig(tp=4, ep=16)
    par.validate(scout, world_size=16)
    assert par.dp(16) == 1 * 4 and par.edp(16) == 1
    assert par.sequence_parallel_on(scout) and not par.sequence_parallel_on(load_model_preset("tiny_dense"))
    with pytest.raises(ValueError, match="etp"):  # Megatron's default expert TP = TP cannot initialise
        ParallelConfig(tp=4, ep=16, etp=4).validate(scout, world_size=16)
    # ep == 1: experts are dense params to Megatron, so they must be split like the dense layers
    assert ParallelConfig(tp=2).expert_tp() == 2 and ParallelConfig(tp=2, ep=2).expert_tp() == 1


def test_distributed_optimizer_defaults_on_with_data_parallel():
    assert not OptimConfig().distributed_optimizer_on(1)
    assert OptimConfig().distributed_optimizer_on(2)
    assert not OptimConfig(use_distributed_optimizer=False).distributed_optimizer_on(4)
    with pytest.raises(ValueError, match="overlap_param_gather"):
        OptimConfig(use_distributed_optimizer=False, overlap_param_gather=True).validate()


def test_precision_and_recompute_keys_are_validated():
    with pytest.raises(ValueError, match="params_dtype='float16'"):
        MegatronConfig(params_dtype="float16").validate()
    with pytest.raises(ValueError, match="recompute='some'"):
        MegatronConfig(recompute="some").validate()


def test_unknown_preset_and_unknown_key(tmp_path):
    with pytest.raises(ValueError, match=r"model preset 'tiny_densee' not found"):
        load_model_preset("tiny_densee")
    (tmp_path / "bad.yaml").write_text("hidden_size: 64\nhiden: 3\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown model key 'hiden'"):
        load_model_preset("bad", conf_dir=tmp_path)
    (tmp_path / "bad2.yaml").write_text("num_attention_heads: 6\nnum_query_groups: 4\nhidden_size: 96\n")
    with pytest.raises(ValueError, match=r"num_attention_heads=6 is not divisible by num_query_groups=4"):
        load_model_preset("bad2", conf_dir=tmp_path)


def test_lr_linear_warmup_then_constant():
    opt = OptimConfig(lr=1e-3, warmup_steps=4)
    assert [opt.lr_at(s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert OptimConfig(lr=2.0, warmup_steps=0).lr_at(0) == 2.0
    # paper App. A.3 defaults
    d = OptimConfig()
    assert (d.lr, d.adam_eps, d.weight_decay, d.warmup_steps) == (5e-7, 1e-15, 0.01, 100)
    with pytest.raises(ValueError, match=r"adam_beta2=1.0"):
        OptimConfig(adam_beta2=1.0).validate()


def test_bad_config_fails_before_any_process_group(monkeypatch):
    import torch.distributed as dist

    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    monkeypatch.setenv("WORLD_SIZE", "6")
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(tp=3))
    with pytest.raises(ValueError, match=r"tp=3 does not divide model.num_attention_heads=4"):
        MegatronPolicyTrainer(cfg)
    with pytest.raises(ValueError, match=r"moe_topk=1 with moe_router_pre_softmax=False"):
        load_model_preset("tiny_moe", overrides={"moe_router_score_function": "softmax"})
    assert not dist.is_initialized()


def test_mixed_dtype_params_use_the_distributed_optimizer():
    """bf16 body + FP32 head: the distributed optimizer even at DP 1 (Megatron's non-distributed
    mixed-precision optimizer cannot checkpoint the FP32 head); refusing it explicitly is an error."""
    fp32_head = MegatronConfig(params_dtype="bfloat16")
    assert fp32_head.mixed_dtype_params and fp32_head.distributed_optimizer(1)
    bf16_head = MegatronConfig(model=ModelConfig(fp32_lm_head=False), params_dtype="bfloat16")
    assert not bf16_head.distributed_optimizer(1) and bf16_head.distributed_optimizer(2)
    assert not MegatronConfig().distributed_optimizer(1)  # FP32 params
    with pytest.raises(ValueError, match="use_distributed_optimizer=False"):
        MegatronConfig(params_dtype="bfloat16", optim=OptimConfig(use_distributed_optimizer=False)).validate()
