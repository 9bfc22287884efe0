"""Worker for tests/integration/test_megatron_precision.py (run as N ranks by mp_launch; not a test).

Modes (JSON results into --out):
  save      world of 2, bf16 mixed precision (wrap.py), per layout in --layouts (dp2: FP32 head,
            distributed optimizer; tp2: TP 2, bf16 head, non-distributed optimizer; tp2do / pp2do: TP 2 /
            PP 2, FP32 head, distributed optimizer saved fully_reshardable, plus a dp_reshardable copy):
            train 2 steps, dist-checkpoint, train 2 more ("after"); also records optimizer / wrapper types
            and dtypes (tp2do: optimizer-state fingerprints, `moments`). Then, unless --no-extras, dp2
            again with the DDP/optimizer overlap options on (4 steps).
  load      world of 1 (TP1 DP1): load each layout's checkpoint (model + optimizer, resharded; tp2do /
            pp2do into the distributed optimizer) and train the same 2 steps ("resumed"); tp2do / pp2do: the
            dp_reshardable copy is refused ("refused"); control: model only with a fresh optimizer
            ("fresh_optimizer"). Then, unless --no-extras, the recompute comparison.
  recompute world of 1: one forward/backward of the same model and batch under train.recompute none /
            selective / full; loss, gradients and how often core attention / layers ran forward.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_worker  # noqa: E402
from megatron_worker import global_batch, write  # noqa: E402

from scalerl_mega.model.config import (  # noqa: E402
    MegatronConfig,
    OptimConfig,
    ParallelConfig,
    load_model_preset,
)


def config(parallel: ParallelConfig, *, distopt=None, params_dtype="bfloat16", recompute="none",
           fp32_head=True) -> MegatronConfig:
    import dataclasses

    optim = OptimConfig(lr=5e-3, warmup_steps=0, adam_eps=1e-4, clip_grad=1.0, use_distributed_optimizer=distopt)
    model = dataclasses.replace(load_model_preset("tiny_dense"), fp32_lm_head=fp32_head)
    return MegatronConfig(model=model, parallel=parallel, optim=optim, params_dtype=params_dtype,
                          recompute=recompute)


# dp2: bf16 body + FP32 head -> distributed optimizer (dp_reshardable state: reshards over DP);
# tp2: bf16 head -> Megatron's non-distributed mixed-precision optimizer (model-space state: reshards over TP);
# tp2do / pp2do: TP 2 / PP 2 with the distributed optimizer (bf16 body, FP32 head), saved fully_reshardable
# (model space): reshards over TP / PP
FP32_HEAD = {"dp2": True, "tp2": False, "tp2do": True, "pp2do": True}
PARALLEL = {"tp2": dict(tp=2), "tp2do": dict(tp=2), "pp2do": dict(pp=2)}
DISTOPT = {"tp2do": True, "pp2do": True}
FORMAT = {"tp2do": "fully_reshardable", "pp2do": "fully_reshardable"}


def moments(run) -> dict:
    """Per parameter name, float64 sums over the FULL parameter (TP shards summed over the TP group)
    of the optimizer's FP32 main weight squared, Adam exp_avg squared and exp_avg_sq: layout-free
    fingerprints of the optimizer state (squares: no cancellation). Needs DP 1 (each rank holds its
    parameters' whole state) and PP 1."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    subs = getattr(run.optimizer, "chained_optimizers", [run.optimizer])
    out = {}
    for name, p in run.gpt.named_parameters():
        sub = next(o for o in subs if p in getattr(o, "model_param_group_index_map", {}))
        st = sub._get_main_param_and_optimizer_states(p)
        v = torch.tensor([float(st["param"].double().pow(2).sum()), float(st["exp_avg"].double().pow(2).sum()),
                          float(st["exp_avg_sq"].double().sum())], dtype=torch.float64)
        if getattr(p, "tensor_model_parallel", False) and ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(v, group=ps.get_tensor_model_parallel_group())
        out[name] = v.tolist()
    return out


class Run(megatron_worker.Run):
    """Model + Float16Module/DDP + optimizer exactly as MegatronPolicyTrainer builds them (the
    training loop is megatron_worker.Run's)."""

    def __init__(self, cfg: MegatronConfig):  # noqa: D107 - a different build, same attributes
        from scalerl_mega.trainer.megatron import models, parallel as par, step, wrap

        from scalerl_mega.trainer.megatron.parallel import world_size_from_env

        self.cfg = cfg.validate(world_size=world_size_from_env())
        self.info = par.init_parallel(cfg.parallel, model=cfg.model, seed=1234)
        self.gpt, self.tcfg = models.build_model(cfg.model, cfg.parallel, params_dtype=cfg.params_dtype,
                                                 recompute=cfg.recompute)
        self.chunks = [wrap.wrap_model(self.gpt, self.tcfg, cfg)]
        step.configure_schedule(self.tcfg, self.chunks)
        self.optimizer = wrap.build_optimizer(self.chunks, cfg)
        self.batch = global_batch(cfg.model.vocab_size)
        self.steps_done = 0

    def describe(self) -> dict:
        subs = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return {"optimizers": sorted({type(o).__name__ for o in subs}),
                "wrapper": type(self.chunks[0].module).__name__,
                "body_dtype": str(self.gpt.decoder.layers[0].mlp.linear_fc1.weight.dtype),
                "head_dtype": str(self.gpt.output_layer.weight.dtype) if hasattr(self.gpt, "output_layer") else None,
                "grad_dtypes": sorted({str(b.grad_dtype) for b in self.chunks[0].buffers}),
                "dp": self.info.dp, "tp": self.info.tp}


def mode_save(out: Path, layout: str) -> None:
    from scalerl_mega.trainer.megatron import checkpoint, parallel as par

    parallel = ParallelConfig(**PARALLEL.get(layout, {}))
    run = Run(config(parallel, distopt=DISTOPT.get(layout), fp32_head=FP32_HEAD[layout]))
    res = {"before": run.train(2), **run.describe()}
    checkpoint.save_checkpoint(out / f"ckpt_{layout}", step=2, chunks=run.chunks, optimizer=run.optimizer,
                               extra_state={"step": 2}, optimizer_format=FORMAT.get(layout, "dp_reshardable"))
    if layout == "tp2do":
        res["moments"] = moments(run)
    if layout in DISTOPT:
        checkpoint.save_checkpoint(out / f"ckpt_{layout}_dpr", step=2, chunks=run.chunks, optimizer=run.optimizer,
                                   extra_state={"step": 2}, optimizer_format="dp_reshardable")
    res["after"] = run.train(2)
    write(out, f"save_{layout}", res)
    par.teardown_parallel(destroy_process_group=False)


def mode_overlap(out: Path) -> None:
    """DP 2, distributed optimizer with optim.overlap_grad_reduce and overlap_param_gather: 4 steps."""
    from scalerl_mega.trainer.megatron import parallel as par

    cfg = config(ParallelConfig(), fp32_head=FP32_HEAD["dp2"])
    cfg.optim.overlap_grad_reduce = cfg.optim.overlap_param_gather = True
    run = Run(cfg)
    res = run.train(4)
    res["overlap"] = [run.chunks[0].ddp_config.overlap_grad_reduce, run.chunks[0].ddp_config.overlap_param_gather]
    write(out, "overlap_dp2", res)
    par.teardown_parallel(destroy_process_group=False)


def mode_load(out: Path, layout: str) -> None:
    from scalerl_mega.trainer.megatron import checkpoint, parallel as par

    ck = out / f"ckpt_{layout}"
    res = {}
    run = Run(config(ParallelConfig(), distopt=DISTOPT.get(layout), fp32_head=FP32_HEAD[layout]))
    checkpoint.load_checkpoint(ck, chunks=run.chunks, optimizer=run.optimizer)
    if layout == "tp2do":
        res["moments"] = moments(run)
    run.steps_done = 2
    res["resumed"] = run.train(2)
    res.update(run.describe())
    par.teardown_parallel(destroy_process_group=False)
    if layout in DISTOPT:  # the same state saved dp_reshardable is refused here, naming the key
        run = Run(config(ParallelConfig(), distopt=True, fp32_head=FP32_HEAD[layout]))
        try:
            checkpoint.load_checkpoint(out / f"ckpt_{layout}_dpr", chunks=run.chunks, optimizer=run.optimizer)
            res["refused"] = ""
        except ValueError as exc:
            res["refused"] = str(exc)
        par.teardown_parallel(destroy_process_group=False)
    run = Run(config(ParallelConfig(), fp32_head=FP32_HEAD[layout]))
    checkpoint.load_checkpoint(ck, chunks=run.chunks)
    run.steps_done = 2
    res["fresh_optimizer"] = run.train(2)
    write(out, f"load_{layout}", res)
    par.teardown_parallel(destroy_process_group=False)


def mode_recompute(out: Path) -> None:
    import torch

    from scalerl_mega.trainer.megatron import parallel as par, step

    res = {}
    for mode in ("none", "selective", "full"):
        run = Run(config(ParallelConfig(), distopt=False, params_dtype="float32", recompute=mode))
        calls = {"core_attention": 0, "layer": 0}

        def count(key):
            def hook(module, args):
                calls[key] += 1
            return hook

        for layer in run.gpt.decoder.layers:
            layer.register_forward_pre_hook(count("layer"))
            layer.self_attention.core_attention.register_forward_pre_hook(count("core_attention"))
        for chunk in run.chunks:
            chunk.zero_grad_buffer()
        metrics = step.forward_backward(run.chunks, run.batch, loss_fn=step.next_token_ce_loss,
                                        parallel=run.cfg.parallel)
        grads = torch.cat([p.main_grad.reshape(-1) for p in run.gpt.parameters()]).double()
        res[mode] = {"loss": metrics["loss"], "grad_sq": float(grads.pow(2).sum()), "grad": grads[:4096].tolist(),
                     "recompute_granularity": run.tcfg.recompute_granularity, **calls}
        par.teardown_parallel(destroy_process_group=False)
    write(out, "recompute", res)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "recompute"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="dp2,tp2")
    ap.add_argument("--no-extras", action="store_true", help="skip the overlap (save) and recompute (load) runs")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layouts = [x for x in args.layouts.split(",") if x]
    if args.mode == "save":
        for layout in layouts:
            mode_save(out, layout)
        if not args.no_extras:
            mode_overlap(out)
    elif args.mode == "load":
        for layout in layouts:
            mode_load(out, layout)
        if not args.no_extras:
            mode_recompute(out)
    else:
        mode_recompute(out)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)  # dist-checkpointing's spawned Manager can keep the interpreter alive


if __name__ == "__main__":
    main()
