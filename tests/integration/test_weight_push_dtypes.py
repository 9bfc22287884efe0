"""What a weight push sends, by generator: SGLang holds its LM head in its serving
dtype (a pushed FP32 head is rounded on load; `--enable-fp32-lm-head` upcasts at compute), so the push
to SGLang sends every tensor, the head included, in bf16: the model's bf16 bytes, not +2 bytes per head
element. The local engine keeps an FP32 head copy (rollout/core.py), so its push keeps the head FP32.
The head bf16-rounded on the trainer equals what the server's load would make of the FP32 push.
Worker: a CPU world-1 MegatronPolicyTrainer (bf16 body, FP32 head) in a subprocess.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_launch import run_single_worker  # noqa: E402


SPECS = ("bfloat16", "bfloat16+fp32_head")  # checked against build.engine_weight_dtype in the test


def worker(out: str) -> None:
    import torch

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(), optim=OptimConfig(),
                         params_dtype="bfloat16")
    trainer = MegatronPolicyTrainer(cfg)
    res: dict = {"num_params": cfg.model.num_params()["total"]}
    pushed = {}
    try:
        for spec in SPECS:
            stream = trainer.export_hf_weights(dtype=spec)
            plan = {s.name: s.dtype for s in stream.plan}
            tensors = {n: t.detach().clone() for n, t in stream}
            pushed[spec] = tensors
            res[spec] = {"dtypes": {n: str(t.dtype).replace("torch.", "") for n, t in tensors.items()},
                         "plan": plan, "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                         "numel": sum(t.numel() for t in tensors.values())}
    finally:
        trainer.close()
    sg, loc = (pushed[s] for s in SPECS)
    res["head_rounded_equal"] = bool(torch.equal(sg["lm_head.weight"], loc["lm_head.weight"].to(torch.bfloat16)))
    res["body_equal"] = all(torch.equal(sg[n], loc[n]) for n in sg if n != "lm_head.weight")
    Path(out).write_text(json.dumps(res))


@pytest.mark.timeout(600)
def test_sglang_push_sends_the_head_in_bf16_and_the_local_push_keeps_it_fp32(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_hf_model_config import _compose

    from scalerl_mega.build import engine_weight_dtype

    sglang = engine_weight_dtype(_compose("experiment=scalerl", "rollout=sglang"))
    local = engine_weight_dtype(_compose("experiment=scalerl", "rollout=local"))
    assert (sglang, local) == SPECS
    res = run_single_worker(__file__, tmp_path / "res.json")
    n, head = res["num_params"], 256 * 64  # tiny_dense: vocab 256 x hidden 64, untied
    s, loc = res[sglang], res[local]
    assert set(s["dtypes"].values()) == {"bfloat16"} and set(s["plan"].values()) == {"bfloat16"}
    assert s["numel"] == loc["numel"] == n
    assert s["bytes"] == 2 * n  # every element in bf16
    assert loc["dtypes"]["lm_head.weight"] == "float32" and loc["plan"]["lm_head.weight"] is None
    assert loc["bytes"] == 2 * n + 2 * head  # the FP32 head costs 2 more bytes per element
    assert res["head_rounded_equal"] and res["body_equal"]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
