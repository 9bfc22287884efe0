"""Resume with Megatron's inner optimizer being TransformerEngine's FusedAdam (what GPU nodes run).

TE is GPU-only, so `FusedAdamContract` below stands in for it on CPU: an AdamW that keeps the state
the way TE's `FusedAdam` (transformer_engine/pytorch/optimizers/fused_adam.py) does and enforces the
same contract: one integer 'step' per param group, and per-parameter state only under the names of
`name_to_dtype_map` ('exp_avg', 'exp_avg_sq', 'master_param'); `state_dict()` / `load_state_dict()`
look every per-parameter key up there, so a per-parameter 'step' raises KeyError: 'step' (the crash a
first restart or 24 h requeue hit). Megatron is switched to it the way it selects TE at import time
(`megatron.core.optimizer.Adam`, `USING_PYTORCH_OPTIMIZER`, and distrib_optimizer's `Adam`,
`HAVE_APEX_OR_TE` / `USING_TE_OPTIMIZER`), in one subprocess (both optimizer kinds) so the switch
dies with it.

The run: 1 step, save, 1 more step (reference); a fresh trainer loads the checkpoint and takes the
same second step. Equal loss and bit-identical weights mean the Adam moments and the step (bias
correction) came back.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_launch import run_single_worker  # noqa: E402




def _fused_adam_class():
    import torch

    class FusedAdamContract(torch.optim.Optimizer):
        """AdamW (decoupled weight decay, bias correction) with TE FusedAdam's state layout."""

        def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                     adam_w_mode=True, weight_decay=0.0, **_te_only_kwargs):
            super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                          weight_decay=weight_decay))
            self.adam_w_mode = adam_w_mode
            self.name_to_dtype_map = {"exp_avg": torch.float32, "exp_avg_sq": torch.float32,
                                      "master_param": torch.float32}
            self.state_keys_seen: set[str] = set()

        def _check(self, name: str, value) -> None:
            dtype = self.name_to_dtype_map[name]  # TE: get_unscaled_state / set_scaled_state; KeyError 'step'
            assert value.dtype == dtype, (name, value.dtype)
            self.state_keys_seen.add(name)

        def state_dict(self):
            sd = super().state_dict()
            for per_param in sd["state"].values():
                for name, value in per_param.items():
                    self._check(name, value)
            return sd

        def load_state_dict(self, state_dict):
            for per_param in state_dict["state"].values():
                for name, value in per_param.items():
                    if value is not None:
                        self._check(name, value)
            super().load_state_dict(state_dict)

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                if not group["params"]:
                    continue
                group["step"] = group.get("step", 0) + 1  # one step per group, as TE keeps it
                t, (b1, b2) = group["step"], group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                        st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                    for name, value in st.items():
                        self._check(name, value)
                    g = p.grad.float()
                    st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if group["bias_correction"] else (1.0, 1.0)
                    update = (st["exp_avg"] / c1) / ((st["exp_avg_sq"] / c2).sqrt() + group["eps"])
                    if self.adam_w_mode:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(update.to(p.dtype), alpha=-group["lr"])
            return None

    return FusedAdamContract


def _use_contract_optimizer() -> type:
    """Make Megatron pick the contract optimizer exactly where it would pick TE's FusedAdam."""
    import megatron.core.optimizer as mopt
    import megatron.core.optimizer.distrib_optimizer as dopt

    cls = _fused_adam_class()
    mopt.Adam, mopt.USING_PYTORCH_OPTIMIZER = cls, False
    dopt.Adam, dopt.HAVE_APEX_OR_TE, dopt.USING_TE_OPTIMIZER = cls, True, True
    return cls


def _round_trip(ckpt: str, distopt: bool) -> dict:
    import torch

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import SftBatch

    cls = _use_contract_optimizer()
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(),
                         optim=OptimConfig(lr=1e-2, use_distributed_optimizer=distopt))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (4, 13), generator=g)
    batch = SftBatch(input_ids_BT=ids[:, :-1], position_ids_BT=torch.arange(12).expand(4, 12).contiguous(),
                     targets_BT=ids[:, 1:], loss_mask_BT=torch.ones(4, 12))

    def subs(t) -> list:
        return getattr(t.optimizer, "chained_optimizers", None) or [t.optimizer]

    def weights(t) -> dict:
        return {n: p.detach().clone() for n, p in t.chunks[0].named_parameters()}

    res: dict = {}
    a = MegatronPolicyTrainer(cfg)
    try:
        res["types"] = sorted({type(s.optimizer).__name__ for s in subs(a)} | {type(s).__name__ for s in subs(a)})
        a.sft_step(batch)
        a.save(ckpt)
        res["loss_ref"] = a.sft_step(batch)["loss"]
        ref = weights(a)
    finally:
        a.close()
    b = MegatronPolicyTrainer(cfg)
    try:
        b.load(ckpt)
        res["keys_after_load"] = sorted({k for s in subs(b) for st in s.optimizer.state.values() for k in st})
        res["group_steps_after_load"] = sorted({grp.get("step") for s in subs(b) for grp in s.optimizer.param_groups
                                                if grp["params"]})
        res["loss_resumed"] = b.sft_step(batch)["loss"]
        got = weights(b)
        res["max_weight_diff"] = max(float((got[n] - ref[n]).abs().max()) for n in ref)
        res["keys_checked"] = sorted({k for s in subs(b) if isinstance(s.optimizer, cls)
                                      for k in s.optimizer.state_keys_seen})
    finally:
        b.close()
    return res


def worker(out: str) -> None:
    import torch

    torch.set_num_threads(1)
    res = {name: _round_trip(str(Path(out).with_name(f"ckpt_{name}")), distopt)
           for name, distopt in (("fp32-optimizer", False), ("distributed-optimizer", True))}
    Path(out).write_text(json.dumps(res))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return run_single_worker(__file__, tmp_path_factory.mktemp("fused_adam") / "res.json")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["fp32-optimizer", "distributed-optimizer"])
def test_resume_under_fused_adam_contract_is_exact(runs, name):
    res = runs[name]
    assert "FusedAdamContract" in res["types"], res["types"]
    assert ("DistributedOptimizer" in res["types"]) is (name == "distributed-optimizer"), res["types"]
    assert res["keys_after_load"] == ["exp_avg", "exp_avg_sq"]  # no per-parameter 'step'
    assert res["group_steps_after_load"] == [1]  # the saved step, restored into the param groups
    assert res["keys_checked"] == ["exp_avg", "exp_avg_sq"]  # the contract was exercised
    assert res["loss_resumed"] == res["loss_ref"]
    assert res["max_weight_diff"] == 0.0


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
