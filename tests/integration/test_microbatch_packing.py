"""The executed micro-batch plan through the real Megatron model on CPU (gloo; this file doubles as the
worker): packed rows == unpacked rows, and the executed padding fraction over DP ranks.

One 1-rank launch, for `tiny_dense` and `tiny_moe`, on an RL TrainBatch of samples of uneven lengths
(batch.build_train_batch), from the same initial weights:
  - log-probs of every sample position: plan U (length-sorted micro-batches, each trimmed to its own
    longest row), plan P (the same micro-batches, each packed into one row: block-diagonal causal mask,
    RoPE positions restarting per sample) and, dense only, plan W (one micro-batch of all rows in their
    original order, padded to the batch's longest: the old execution) agree within 1e-5;
  - one train step (CISPO, logits path and the fused FP32 head): loss, grad norm and parameter update
    of P == U (== W for the dense model; the MoE auxiliary loss is per micro-batch, so only plans with
    the same micro-batches compare, and padding is kept out of routing by `padding_mask`);
  - `padding_fraction` of each step == 1 - real tokens / executed tokens counted here from the plan.
One 2-rank launch (dp=2) trains the dense step on the same batch with 3 micro-batches (rank 1 runs a
filler): loss and grad norm equal the 1-rank step, and `padding_fraction` counts both ranks' tokens.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mp_launch import start, wait

HERE = Path(__file__).resolve()
LENGTHS = [(3, 9), (2, 3), (3, 6), (2, 1), (3, 8), (2, 4), (3, 2), (2, 7)]  # (prompt, output) tokens
BUDGET = 24  # rows x longest row per micro-batch: several micro-batches of this batch
TOL = 1e-5


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _expected_padding(plan: list[list[int]], lengths: list[int], *, packed: bool, fillers: int = 0) -> float:
    real = sum(lengths)
    executed = fillers + sum(sum(lengths[i] for i in mb) if packed else len(mb) * max(lengths[i] for i in mb)
                             for mb in plan)
    return 1.0 - real / executed


def _launch(out: Path, nproc: int, mode: str) -> dict:
    procs = start(HERE, nproc, [str(out), mode], logdir=out, log_name=mode)
    wait(procs, logdir=out, log_name=mode, what=mode, timeout=600)
    return json.loads((out / f"{mode}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {"single": _launch(tmp_path_factory.mktemp("packing"), 1, "single")}


@pytest.mark.parametrize("preset", ["tiny_dense", "tiny_moe"])
def test_packed_logprobs_equal_unpacked(runs, preset):
    r = runs["single"][preset]
    assert len(r["plan"]) > 1 and any(len(mb) > 1 for mb in r["plan"])  # packing has something to pack
    assert r["logp_max_abs_diff"]["P"] < TOL, r["logp_max_abs_diff"]
    if preset == "tiny_dense":
        assert r["logp_max_abs_diff"]["W"] < TOL, r["logp_max_abs_diff"]


@pytest.mark.parametrize("preset", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("head", ["logits", "fused"])
def test_packed_step_equals_unpacked_step(runs, preset, head):
    r = runs["single"][preset]
    ref = r["steps"][f"U_{head}"]
    assert ref["loss"] != 0.0 and ref["grad_norm"] > 0.0
    for variant in (("P", "W") if preset == "tiny_dense" else ("P",)):
        got = r["steps"][f"{variant}_{head}"]
        assert _rel(got["loss"], ref["loss"]) < TOL, (variant, got["loss"], ref["loss"])
        assert _rel(got["grad_norm"], ref["grad_norm"]) < TOL, (variant, got["grad_norm"], ref["grad_norm"])
        assert r["update_rel"][f"{variant}_{head}"] < 1e-4, r["update_rel"]


@pytest.mark.parametrize("preset", ["tiny_dense", "tiny_moe"])
def test_padding_fraction_is_the_executed_one(runs, preset):
    r = runs["single"][preset]
    lengths, plan = r["lengths"], r["plan"]
    steps = r["steps"]
    for head in ("logits", "fused"):
        assert steps[f"U_{head}"]["padding_fraction"] == pytest.approx(
            _expected_padding(plan, lengths, packed=False), abs=1e-12)
        assert steps[f"P_{head}"]["padding_fraction"] == pytest.approx(0.0, abs=1e-12)
        assert steps[f"P_{head}"]["executed_tokens"] == sum(lengths)
    if preset == "tiny_dense":  # the old execution: every row padded to the batch's longest
        assert steps["W_logits"]["padding_fraction"] == pytest.approx(1 - sum(lengths) / (len(lengths) * max(lengths)))
    # the plan the loop logs is the plan executed
    assert r["batch_padding_fraction"] == pytest.approx(steps["U_logits"]["padding_fraction"], abs=1e-12)


@pytest.mark.slow
def test_two_dp_ranks_aggregate_padding_and_match_one_rank(runs, tmp_path):
    one, two = runs["single"]["tiny_dense"], _launch(tmp_path, 2, "dp2")["tiny_dense"]
    lengths, plan = two["lengths"], two["plan"]
    assert len(plan) == 3  # odd: rank 1 runs a one-token filler micro-batch
    for kind in ("U", "P"):
        got, ref = two["steps"][kind], one["steps"][f"{kind}3_logits"]
        assert _rel(got["loss"], ref["loss"]) < TOL and _rel(got["grad_norm"], ref["grad_norm"]) < TOL, (got, ref)
        assert got["padding_fraction"] == pytest.approx(
            _expected_padding(plan, lengths, packed=kind == "P", fillers=1), abs=1e-12)
        assert ref["padding_fraction"] == pytest.approx(
            _expected_padding(plan, lengths, packed=kind == "P"), abs=1e-12)


# ----------------------------------------------------------------------------- worker
def _train_batch(vocab: int, *, budget: int):
    import torch

    from scalerl_mega.batch import build_train_batch
    from scalerl_mega.types import Completion, FinishReason, Group, Prompt, ScoredCompletion

    g = torch.Generator().manual_seed(11)
    groups = []
    for p in range(2):
        samples = []
        for i, (n_prompt, n_out) in enumerate(LENGTHS[4 * p:4 * p + 4]):
            ids = torch.randint(1, vocab, (n_prompt + n_out,), generator=g).tolist()
            logp = (-torch.log(torch.tensor(float(vocab))) + 0.3 * torch.randn(n_out, generator=g)).tolist()
            comp = Completion(prompt_id=f"p{p}", sample_index=i, prompt_ids=ids[:n_prompt], output_ids=ids[n_prompt:],
                              gen_logprobs=logp, weight_versions=[0] * n_out, finish_reason=FinishReason.STOP)
            samples.append(ScoredCompletion(completion=comp, reward=float((i + p) % 2), passed=bool((i + p) % 2)))
        groups.append(Group(prompt=Prompt(prompt_id=f"p{p}", text="", task="synthetic", gold=""), samples=samples))
    return build_train_batch(groups, adv_norm="batch", adv_eps=0.0, aggregation="prompt", filter_zero_variance=False,
                             micro_batch_tokens=budget)


def _worker(out: Path, mode: str) -> None:
    import dataclasses

    import torch

    sys.path.insert(0, str(HERE.parents[2]))
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.trainer.policy_loss import make_cispo_head_loss_fn, make_policy_loss_fn

    torch.set_num_threads(1)
    loss_fn = make_policy_loss_fn(loss_type="cispo", eps_low=None, eps_high=1.05, aggregation="prompt")
    head_fn = make_cispo_head_loss_fn(eps_low=None, eps_high=1.05)
    results: dict = {}
    for preset in (("tiny_dense", "tiny_moe") if mode == "single" else ("tiny_dense",)):
        cfg = MegatronConfig(model=load_model_preset(preset), parallel=ParallelConfig(),
                             optim=OptimConfig(lr=1e-3, warmup_steps=0, adam_eps=1e-4, clip_grad=0.0, seed=5))
        trainer = MegatronPolicyTrainer(cfg, loss_fn=loss_fn)
        res = _train_batch(cfg.model.vocab_size, budget=BUDGET)
        batch = res.batch
        lengths = batch.lengths_B
        three = [[0, 4], [2, 7, 5], [1, 6, 3]]  # the dp2 case: an odd number of micro-batches
        variants = {"U": batch, "P": dataclasses.replace(batch, packed=True),
                    "W": dataclasses.replace(batch, micro_batches=[list(range(len(lengths)))]),
                    "U3": dataclasses.replace(batch, micro_batches=three),
                    "P3": dataclasses.replace(batch, micro_batches=three, packed=True)}
        chunk = trainer.chunks[0]
        params = dict(chunk.named_parameters())
        init = {k: v.detach().clone() for k, v in params.items()}
        r: dict = {"lengths": lengths, "plan": batch.micro_batches, "batch_padding_fraction": res.metrics["padding_fraction"],
                   "logp_max_abs_diff": {}, "steps": {}, "update_rel": {}}
        if mode == "dp2":
            r["plan"] = three
        valid = torch.arange(batch.input_ids_BT.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        if mode == "single":
            logp = {k: trainer.logprobs(variants[k]) for k in ("U", "P", "W")}
            for k in ("P", "W"):
                r["logp_max_abs_diff"][k] = float((logp[k] - logp["U"])[valid].abs().max())
        updates = {}
        heads = ("logits", "fused") if mode == "single" else ("logits",)
        names = ("U", "P", "W", "U3", "P3") if mode == "single" else ("U3", "P3")
        for head in heads:
            trainer.head_loss_fn = head_fn if head == "fused" else None
            for name in (names if head == "logits" else names[:3]):
                with torch.no_grad():
                    for k, v in params.items():
                        v.copy_(init[k])
                trainer.reset_optimizer()
                m = trainer.train_step(variants[name])
                tag = f"{name}_{head}" if mode == "single" else name[0]
                r["steps"][tag] = {k: float(v) for k, v in m.items()}
                updates[tag] = torch.cat([(params[k].detach() - init[k]).reshape(-1) for k in sorted(params)])
            if mode == "single":
                for name in ("P", "W"):
                    ref = updates[f"U_{head}"]
                    r["update_rel"][f"{name}_{head}"] = float((updates[f"{name}_{head}"] - ref).norm() / ref.norm())
        results[preset] = r
        trainer.close()
    if os.environ["RANK"] == "0":
        (out / f"{mode}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), sys.argv[2])
