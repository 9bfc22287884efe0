"""`peft=lora` against the generators that serve its adapters (config/tree.py `_validate_peft_rollout`): refused when
composing (what `--validate` and the run's start do), naming the keys; and the SGLang serving flags derived from
`peft.*` (build.sglang_lora_serving)."""

from __future__ import annotations

import pytest


def _compose(*overrides: str):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", "peft=lora", *overrides])


@pytest.mark.parametrize("overrides, where", [
    (("model=tiny_qwen3_moe",), r"model.arch='qwen3_moe'.*rollout.name=local and cluster.device='cpu'"),
    (("rollout=sglang",), r"model.arch='llama4'.*rollout.name=sglang with cluster.device=cpu"),
])
def test_expert_adapters_on_generators_that_cannot_serve_them_are_refused(overrides, where):
    with pytest.raises(ValueError, match=rf"peft.targets=.*linear_fc1.*routed experts of {where}"):
        _compose(*overrides)  # the default targets include every SwiGLU: the routed experts too


def test_expert_adapters_on_the_cpu_llama4_local_engine_and_attention_ones_on_sglang_compose():
    from scalerl_mega.build import sglang_lora_serving

    assert _compose().peft.targets == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]  # sparse Llama-4
    _compose("model=tiny_qwen3_moe", "peft.targets=[linear_qkv,linear_proj]")
    cfg = _compose("rollout=sglang", "peft.rank=16",
                   "peft.targets=[linear_qkv,linear_proj,shared_experts.linear_fc1,shared_experts.linear_fc2]")
    serving = sglang_lora_serving(cfg)
    assert serving.max_rank == 16 and serving.backend == "torch_native"
    assert serving.target_modules == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    assert sglang_lora_serving(_compose("peft=none")) is None


def test_demo_lora_is_the_demo_with_rank_8_adapters_at_ten_times_its_learning_rate():
    from tests.unit.test_config import _compose as hydra_compose

    demo, lora = hydra_compose("experiment=demo"), hydra_compose("experiment=demo_lora")
    assert (lora.peft.kind, lora.peft.rank, lora.peft.alpha) == ("lora", 8, 16.0)
    assert lora.peft.targets == ["linear_qkv", "linear_proj", "shared_experts.linear_fc1", "shared_experts.linear_fc2"]
    assert lora.optim.lr == pytest.approx(10 * demo.optim.lr) and lora.sft.steps == 0
    assert (lora.model, lora.train, lora.rollout, lora.loss) == (demo.model, demo.train, demo.rollout, demo.loss)
