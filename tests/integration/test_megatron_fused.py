"""Fused FP32 CISPO head in the Megatron train step == the logits path (2 processes, gloo).

One 2-process launch (this file doubles as the worker) runs, for each layout (TP1 with dp=2, TP2,
TP2 + sequence parallel), from the same initial weights and the same global RL batch:
  A. logits path: full logits -> `trainer.policy_loss.make_policy_loss_fn(loss_type="cispo")` (objective.losses),
     one micro-batch per rank;
  B. fused path: `trainer.policy_loss.make_cispo_head_loss_fn` on the hidden states (cispo_from_hidden), same split;
  C. fused path with micro-batches by token budget (one row per micro-batch);
  D/E. an SFT batch (no advantages) through the logits and the fused head.
and records loss, grad norm, the parameter update of one AdamW step and the IS metrics. The test
checks B, C == A and E == D within 1e-5 relative (the update within 1e-4: Adam divides by |g|), and the
loss diagnostics (`finalize_train_metrics`: clip fraction, rho mean/max, k3 KL, entropy) of A, B, C
against a whole-batch float64 computation from the full logits of the initial weights (gathered over
DP and TP): exact aggregation over micro-batches and DP ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

B, T = 4, 16
CASES = {"tp1_dp2": dict(tp=1), "tp2": dict(tp=2), "tp2_sp": dict(tp=2, sequence_parallel=True)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fused")
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        log = open(out / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, __file__, str(out)], env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    codes = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=600))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    if any(codes):
        raise AssertionError(f"worker failed {codes}:\n{(out / 'rank0.log').read_text()[-4000:]}")
    return json.loads((out / "results.json").read_text())


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_fused_step_equals_logits_step(results, case):
    r = results[case]
    ref = r["A"]
    assert ref["loss"] != 0.0 and ref["grad_norm"] > 0.0
    assert 0.0 < ref["clip_fraction_ref"] < 1.0  # the batch exercises the CISPO truncation
    for variant in ("B", "C"):
        got = r[variant]
        assert rel(got["loss"], ref["loss"]) < 1e-5, (variant, got["loss"], ref["loss"])
        assert rel(got["grad_norm"], ref["grad_norm"]) < 1e-5, (variant, got["grad_norm"], ref["grad_norm"])
        assert rel(got["is_ratio_mean"], ref["is_ratio_mean"]) < 1e-5
        assert rel(got["abs_log_ratio_mean"], ref["abs_log_ratio_mean"]) < 1e-5
        assert r[f"update_rel_{variant}"] < 1e-4, (variant, r[f"update_rel_{variant}"])
    diag = r["diag_ref"]
    assert 0.0 < diag["clip_fraction"] < 1.0 and diag["approx_kl"] > 0.0
    for variant in ("A", "B", "C"):
        for key, value in diag.items():
            assert abs(r[variant][key] - value) <= 1e-5 * max(abs(value), 1e-3), (variant, key, r[variant][key], value)
    assert r["C_microbatches"] > r["B_microbatches"]
    assert rel(r["E"]["loss"], r["D"]["loss"]) < 1e-5 and rel(r["E"]["grad_norm"], r["D"]["grad_norm"]) < 1e-5
    assert r["update_rel_E"] < 1e-4


# ----------------------------------------------------------------------------- worker
def _batch(vocab: int, *, rl: bool) -> dict:
    import torch

    from scalerl_mega.objective.losses import token_weights

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, : T // 4] = 0.0          # prompt tokens
    mask[1, T - 5:] = 0.0            # uneven completion lengths (padding)
    mask[:, -1] = 0.0
    batch = {"input_ids": ids, "position_ids": torch.arange(T).expand(B, T).contiguous(),
             "targets": torch.roll(ids, -1, dims=1) * (mask > 0), "loss_mask": mask}
    if rl:
        prompt_index = torch.tensor([0, 0, 1, 1])
        batch["prompt_index"] = prompt_index
        batch["advantages"] = torch.tensor([1.0, -0.5, 0.8, -1.3])
        # generator log-probs around the uniform policy's: ratios spread on both sides of the cap
        gen = -torch.log(torch.tensor(float(vocab))) + 0.3 * torch.randn(B, T, generator=g)
        batch["gen_logp"] = gen * mask
        batch["token_weights"] = token_weights(mask, prompt_index, "prompt")
    return batch


def _diagnostics_reference(model, batch: dict, eps_high: float) -> dict:
    """Whole-batch float64 clip fraction, rho mean/max, k3 KL and entropy from the full logits (gathered over
    the TP group; every rank runs the whole batch)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    with torch.no_grad():
        logits = model(batch["input_ids"], batch["position_ids"], None)
        tp = ps.get_tensor_model_parallel_world_size()
        if tp > 1:
            parts = [torch.empty_like(logits) for _ in range(tp)]
            dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
            logits = torch.cat(parts, dim=-1)
        logp_all = torch.log_softmax(logits.double(), -1)
        m = batch["loss_mask"] > 0
        lr = (logp_all.gather(-1, batch["targets"][..., None])[..., 0] - batch["gen_logp"].double())[m]
        rho = lr.exp()
        ent = -(logp_all.exp() * logp_all).sum(-1)[m]
    return {"clip_fraction": float((rho > eps_high).double().mean()), "rho_mean": float(rho.mean()),
            "rho_max": float(rho.max()), "approx_kl": float((rho - 1 - lr).mean()), "entropy": float(ent.mean())}


def _worker(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from scalerl_mega.trainer.policy_loss import finalize_train_metrics, make_cispo_head_loss_fn, make_policy_loss_fn
    from scalerl_mega.trainer.megatron import models, parallel as par, step
    from scalerl_mega.trainer.megatron.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset

    torch.set_num_threads(1)
    eps_high = 1.05
    loss_fn = make_policy_loss_fn(loss_type="cispo", eps_low=None, eps_high=eps_high, aggregation="prompt")
    head_fn = make_cispo_head_loss_fn(eps_low=None, eps_high=eps_high)
    results = {}
    for name, pkw in CASES.items():
        parallel = ParallelConfig(**pkw)
        cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=parallel,
                             optim=OptimConfig(lr=1e-3, warmup_steps=0, adam_eps=1e-4, clip_grad=0.0))
        cfg.validate(world_size=par.world_size_from_env())
        par.init_parallel(parallel, model=cfg.model, seed=1234)
        model, tcfg = models.build_model(cfg.model, parallel)
        chunks = [step.wrap_ddp(model, tcfg, use_distributed_optimizer=False)]
        step.configure_schedule(tcfg, chunks)
        params = dict(model.named_parameters())
        init = {k: v.detach().clone() for k, v in params.items()}
        rl, sft = _batch(cfg.model.vocab_size, rl=True), _batch(cfg.model.vocab_size, rl=False)
        res: dict = {}
        updates = {}

        def run(tag, batch, *, head, tokens):
            with torch.no_grad():
                for k, v in params.items():
                    v.copy_(init[k])
            optimizer = step.build_optimizer(chunks, cfg.optim)
            m = step.train_step(chunks, optimizer, batch, step=0, optim=cfg.optim, parallel=parallel,
                                loss_fn=loss_fn, head_loss_fn=head_fn if head else None,
                                micro_batch_tokens=tokens)
            res[tag] = {k: float(v) for k, v in finalize_train_metrics(m).items()}
            updates[tag] = torch.cat([(params[k].detach() - init[k]).reshape(-1) for k in sorted(params)])

        whole = B * T
        res["diag_ref"] = _diagnostics_reference(model, rl, eps_high)
        run("A", rl, head=False, tokens=whole)
        run("B", rl, head=True, tokens=whole)
        run("C", rl, head=True, tokens=T)
        run("D", sft, head=False, tokens=whole)
        run("E", sft, head=True, tokens=whole)
        for ref, tags in (("A", ("B", "C")), ("D", ("E",))):
            for tag in tags:
                err = torch.tensor([float((updates[tag] - updates[ref]).norm() / updates[ref].norm())])
                dist.all_reduce(err, op=dist.ReduceOp.MAX)
                res[f"update_rel_{tag}"] = float(err)
        dp = par.parallel_info().dp
        res["B_microbatches"] = 1
        res["C_microbatches"] = (B // dp)
        # clip fraction of the reference batch, from the logits path's own log-probs
        logp = step.compute_logprobs(chunks, rl, parallel=parallel, micro_batch_tokens=whole)
        dist.all_reduce(logp, group=ps.get_data_parallel_group())  # each row from the DP rank that ran it
        m = rl["loss_mask"] > 0
        # logp above is of the *updated* weights; the clip fraction only has to show truncation happens
        clipped = ((logp - rl["gen_logp"]).exp() > eps_high)[m].float().mean()
        res["A"]["clip_fraction_ref"] = float(clipped)
        results[name] = res
        par.teardown_parallel(destroy_process_group=False)
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
