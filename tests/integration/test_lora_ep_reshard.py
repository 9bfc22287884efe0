"""A LoRA (`peft=lora`) checkpoint of an MoE model resumed under another expert-parallel size: tiny_qwen3_moe (4 layers,
layers 0, 2, 3 with 4 routed experts), adapters on every linear the default targets select -- attention `linear_qkv`
and `linear_proj`, the dense layer's `linear_fc1` / `linear_fc2`, and each routed expert's own `linear_fc1` /
`linear_fc2` (trainer/megatron/lora.py) -- on a frozen base, FP32 on CPU over gloo (worker: lora_ep_reshard_worker.py).

One rank and EP 2 over 2 ranks (dense adapters data-parallel over 2, experts split 2 + 2) each train step 1, save
(adapters and Adam state in model space, `optim.checkpoint_format=fully_reshardable`, the distributed optimizer on
both sides), and continue with step 2: the uninterrupted runs. EP 2 loads the one-rank checkpoint and one rank the
EP 2 checkpoint, and each takes the same step 2. Asserted:

- right after the load every adapter tensor (experts under their global index: `mlp.experts.<e>.*`) equals bitwise
  the saving layout's after step 1; each layer's 4 experts hold distinct adapters, so experts landing on the wrong
  index would fail;
- the resumed step 2 gives the loss and grad norm of the saving layout's continued step 2 within 1e-6 relative
  (measured: loss equal, grad norm 6e-8), the adapters after it within 5e-5 (measured 6e-6; step 2 moves them by
  0.03, an Adam step from wrong or missing moments by as much) and the log-probs within 1e-5, the tolerances of
  test_lora.py's TP 2 cases (rounding of another layout's reductions);
- the base: the same tensors in every run (a random base is drawn per expert-parallel rank -- asserted: EP 2's own
  draw differs from one rank's -- so each run loads the one-rank draw and references it as `init_from_hf` would).
  A random base's reference records the EP size it was drawn under, so a resume of random-base adapters under
  another EP is refused instead of meeting other experts;
- the optimizer kind: one rank's default optimizer (torch Adam at DP 1) refuses the EP 2 run's distributed-optimizer
  state, naming `optim.use_distributed_optimizer` (Megatron's own load fails on a missing key either way).
"""

from __future__ import annotations

from pathlib import Path

import mp_launch
import pytest

pytestmark = [pytest.mark.compat, pytest.mark.timeout(900)]  # ~75 s of Megatron in three launches
WORKER = Path(__file__).with_name("lora_ep_reshard_worker.py")
PHASES = (("one", 1), ("ep2", 2), ("resume", 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch

    out = tmp_path_factory.mktemp("lora_ep_reshard")
    for phase, nproc in PHASES:
        procs = mp_launch.start(WORKER, nproc, ["--dir", str(out), "--phase", phase], logdir=out, log_name=phase)
        mp_launch.wait(procs, logdir=out, log_name=phase, what=phase, timeout=800)
    return {phase: torch.load(out / f"{phase}.pt") for phase, _ in PHASES}


def _max_abs(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _bitwise(a: dict, b: dict) -> bool:
    import torch

    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_adapters_land_on_their_experts_bitwise_in_both_directions(runs):
    import torch

    saved = runs["one"]["after_step1"]
    experts = [k for k in saved if ".mlp.experts." in k]
    assert len(experts) == 3 * 4 * 6  # 3 MoE layers x 4 experts x (gate, up, down) x (A, B)
    for layer in (0, 2, 3):
        bs = [saved[f"base_model.model.model.layers.{layer}.mlp.experts.{e}.down_proj.lora_B.weight"] for e in range(4)]
        assert all(not torch.equal(bs[i], bs[j]) for i in range(4) for j in range(i + 1, 4))
    assert _bitwise(runs["ep2"]["after_load"], runs["one"]["after_step1"])  # one rank -> EP 2
    assert _bitwise(runs["resume"]["after_load"], runs["ep2"]["after_step1"])  # EP 2 -> one rank


@pytest.mark.parametrize("resumed,saved", [("ep2", "one"), ("resume", "ep2")], ids=["one_to_ep2", "ep2_to_one"])
def test_next_step_after_the_resharded_load_is_the_uninterrupted_one(runs, resumed, saved):
    r, c = runs[resumed]["resumed"], runs[saved]["continued"]
    assert abs(r["loss"] - c["loss"]) <= 1e-6 * abs(c["loss"])
    assert abs(r["grad_norm"] - c["grad_norm"]) <= 1e-6 * c["grad_norm"]
    assert _max_abs(r["adapters"], c["adapters"]) <= 5e-5
    assert _max_abs(c["adapters"], runs[saved]["after_step1"]) > 1e-2  # step 2 moved them: the check can fail
    rows = (r["logp"].abs().sum(1) > 0) & (c["logp"].abs().sum(1) > 0)  # a DP rank returns the rows it executed
    mask = runs["one"]["mask"]
    assert rows.any() and float(((r["logp"] - c["logp"]).abs() * mask)[rows].max()) <= 1e-5


def test_a_random_base_is_drawn_per_expert_parallel_rank_and_its_reference_says_so(runs):
    from scalerl_mega.trainer.megatron.lora_ckpt import check_base

    assert any(".mlp.experts." in n for n in runs["ep2"]["own_draw_differs"])
    one, ep2 = runs["one"]["random_base_reference"], runs["ep2"]["random_base_reference"]
    assert one == {"path": "", "seed": 7, "model": "tiny_qwen3_moe"}
    assert ep2 == {**one, "drawn_under": {"ep": 2}}
    with pytest.raises(ValueError, match="drawn under"):
        check_base(ep2, one, where="test")
    check_base(runs["resume"]["random_base_reference"], one, where="test")  # the same layout: accepted


def test_the_distributed_optimizers_state_is_refused_by_one_ranks_default_optimizer(runs):
    # EP 2 over 2 ranks runs the distributed optimizer by default (DP 2), one rank torch Adam: their states differ
    # (FP32 main weights, param-group keys), so the load names the setting instead of failing inside Megatron
    msg = runs["resume"]["plain_adam_refused"]
    assert "distributed optimizer" in msg and "optim.use_distributed_optimizer=true" in msg
