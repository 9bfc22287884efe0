"""`peft=lora` against the generators that serve its adapters (config/tree.py `_validate_peft_rollout`): refused when
composing (what `--validate` and the run's start do), naming the keys; and the SGLang serving flags derived from
`peft.*` (build.sglang_lora_serving)."""

from __future__ import annotations

import pytest


def _compose(*overrides: str):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", "peft=lora", *overrides])


@pytest.mark.parametrize("rollout, where", [("local", "rollout.name=local"),
                                            ("sglang", "rollout.name=sglang with cluster.device=cpu")])
def test_expert_adapters_on_generators_that_cannot_serve_them_are_refused(rollout, where):
    with pytest.raises(ValueError, match=rf"peft.targets=.*linear_fc1.*routed experts of model.arch='llama4' "
                                         rf"\(model.num_experts=4\).*{where}"):
        _compose(f"rollout={rollout}")  # the default targets include every SwiGLU: the routed experts too


def test_attention_and_shared_expert_adapters_compose_and_give_the_sglang_flags():
    from scalerl_mega.build import sglang_lora_serving

    cfg = _compose("rollout=sglang", "peft.rank=16",
                   "peft.targets=[linear_qkv,linear_proj,shared_experts.linear_fc1,shared_experts.linear_fc2]")
    serving = sglang_lora_serving(cfg)
    assert serving.max_rank == 16 and serving.backend == "torch_native"
    assert serving.target_modules == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    assert sglang_lora_serving(_compose("peft=none")) is None
