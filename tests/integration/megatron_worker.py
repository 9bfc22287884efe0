"""Worker for the Megatron CPU integration tests (run with python or torchrun; not a test module).

Modes (all write JSON results into --out):
  ref      world of 1: for dense and MoE, build from the seed and train 3 steps.
  layouts  world of 2: build the same initial weights (TP1, dp=2) and save them; then for each
           case in --cases load them into that layout and train 3 steps on the same global batch
           (process group reused between cases). Runs concurrently with `ref`.
  ckpt     world of 2: TP2 checkpoint round trip, crash mid-save, then reshard-load at TP1
           (also run after the layouts with `layouts --ckpt`, saving one interpreter start).
"""

from __future__ import annotations

import argparse
import functools
import logging
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scalerl_mega.model.config import (  # noqa: E402
    MegatronConfig,
    OptimConfig,
    ParallelConfig,
    load_model_preset,
)

STEPS = 3
B, T = 4, 32

CASES = {
    "dense_tp2": ("tiny_dense", dict(tp=2), False),
    "dense_tp2_sp_distopt": ("tiny_dense", dict(tp=2, sequence_parallel=True), True),
    "dense_pp2": ("tiny_dense", dict(pp=2), False),
    "dense_dp2_distopt": ("tiny_dense", dict(), True),
    "moe_ep2_alltoall": ("tiny_moe", dict(ep=2, moe_token_dispatcher="alltoall"), False),
    "moe_ep2_allgather": ("tiny_moe", dict(ep=2, moe_token_dispatcher="allgather"), False),
    "moe_tp2_sp": ("tiny_moe", dict(tp=2, sequence_parallel=True), False),
    "moe_pp2": ("tiny_moe", dict(pp=2), False),
}


def optim_cfg(distopt: bool) -> OptimConfig:
    return OptimConfig(lr=5e-3, warmup_steps=2, adam_eps=1e-4, clip_grad=1.0, use_distributed_optimizer=distopt)


def global_batch(vocab: int, seed: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, -1] = 0.0
    mask[0, : T // 2] = 0.0  # a prompt: positions not trained
    return {"input_ids": ids, "position_ids": torch.arange(T).expand(B, T).contiguous(),
            "targets": torch.roll(ids, -1, dims=1) * (mask > 0), "loss_mask": mask}


class Run:
    """Model + DDP + optimizer for one layout (process group already up)."""

    def __init__(self, preset: str, parallel: ParallelConfig, distopt: bool, init_dir: str | None):
        from scalerl_mega.trainer.megatron import checkpoint, models, parallel as par, step, wrap

        self.cfg = MegatronConfig(model=load_model_preset(preset), parallel=parallel, optim=optim_cfg(distopt))
        self.cfg.validate(world_size=par.world_size_from_env())
        self.info = par.init_parallel(parallel, model=self.cfg.model, seed=1234)
        model, self.tcfg = models.build_model(self.cfg.model, parallel)
        if init_dir is not None:
            checkpoint.load_checkpoint(init_dir, chunks=[model])
        self.chunks = [wrap.wrap_model(model, self.tcfg, self.cfg)]  # training's builders (trainer.py)
        step.configure_schedule(self.tcfg, self.chunks)
        self.optimizer = wrap.build_optimizer(self.chunks, self.cfg)
        self.batch = global_batch(self.cfg.model.vocab_size)
        self.steps_done = 0

    def train(self, n: int) -> dict:
        from scalerl_mega.trainer.megatron import step

        losses, norms = [], []
        for _ in range(n):
            m = step.train_step(self.chunks, self.optimizer, self.batch, step=self.steps_done,
                                optim=self.cfg.optim, parallel=self.cfg.parallel)
            self.steps_done += 1
            losses.append(m["loss"])
            norms.append(m["grad_norm"])
        return {"loss": losses, "grad_norm": norms}

    def full_logits(self):
        """Forward on the first micro-batch rows; logits gathered over TP: [B, T, V] (last stage)."""
        import torch
        from megatron.core import tensor_parallel

        model = self.chunks[0].module
        model.eval()
        with torch.no_grad():
            out = model(self.batch["input_ids"], self.batch["position_ids"], None)
            full = tensor_parallel.gather_from_tensor_model_parallel_region(out)
        model.train()
        return full


def write(out: Path, name: str, payload: dict) -> None:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        tmp = out / f".{name}.json.tmp"
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, out / f"{name}.json")


def weight_checksum(run: Run) -> float:
    """Sum of squares of all (full, TP1) parameters in float64: identifies the initial weights."""
    return float(sum(p.detach().double().pow(2).sum() for p in run.chunks[0].module.parameters()))


def mode_ref(out: Path) -> None:
    """Single process: build each model from the seed, record its weight checksum, train 3 steps."""
    from scalerl_mega.trainer.megatron import parallel as par

    for kind in ("tiny_dense", "tiny_moe"):
        t0 = time.time()
        run = Run(kind, ParallelConfig(), False, None)
        checksum = weight_checksum(run)
        res = run.train(STEPS)
        res["init_checksum"] = checksum
        res["seconds"] = time.time() - t0
        write(out, f"ref_{kind}", res)
        par.teardown_parallel(destroy_process_group=False)


def save_initial_weights(out: Path) -> None:
    """World of 2 at TP1/PP1 (dp=2): build each model from the same seed as `ref` (so the ref can
    run concurrently) and save it; each layout then loads (reshards) these weights."""
    from scalerl_mega.trainer.megatron import checkpoint, parallel as par

    for kind in ("tiny_dense", "tiny_moe"):
        run = Run(kind, ParallelConfig(), False, None)
        write(out, f"init_{kind}", {"init_checksum": weight_checksum(run)})
        checkpoint.save_checkpoint(out / f"init_{kind}", step=0, chunks=[run.chunks[0].module])
        par.teardown_parallel(destroy_process_group=False)


def mode_layouts(out: Path, cases: list[str]) -> None:
    from scalerl_mega.trainer.megatron import parallel as par

    save_initial_weights(out)
    for name in cases:
        preset, pkw, distopt = CASES[name]
        t0 = time.time()
        try:
            run = Run(preset, ParallelConfig(**pkw), distopt, str(out / f"init_{preset}"))
            res = run.train(STEPS)
            res["dp"], res["tp"], res["pp"], res["ep"] = run.info.dp, run.info.tp, run.info.pp, run.info.ep
        except Exception:
            res = {"error": traceback.format_exc()}
            write(out, name, res)
            raise
        res["seconds"] = time.time() - t0
        write(out, name, res)
        par.teardown_parallel(destroy_process_group=False)


def mode_ckpt(out: Path) -> None:
    import torch
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from scalerl_mega.trainer.megatron import checkpoint, parallel as par

    res: dict = {}
    t0 = time.time()
    ck = out / "ckpt"
    run = Run("tiny_dense", ParallelConfig(tp=2), False, str(out / "init_tiny_dense"))
    run.train(1)
    rng_at_save = torch.get_rng_state()
    checkpoint.save_checkpoint(ck, step=1, chunks=run.chunks, optimizer=run.optimizer,
                               extra_state={"step": 1, "rng": rng_at_save, "note": "after one step"})
    logits_tp2 = run.full_logits()
    res["after"] = run.train(2)  # steps 2 and 3 continuing in memory (step 3 depends on Adam state)

    # crash mid-save: the file writer raises after writing its first item (files half written)
    original = filesystem_async._write_item
    calls = []

    @functools.wraps(original)  # keeps the signature Megatron inspects
    def broken_write_item(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("simulated crash inside the checkpoint writer")
        return original(*args, **kwargs)

    filesystem_async._write_item = broken_write_item
    # megatron-core >= 0.19 raises "error: <class 'RuntimeError'>" and logs the worker's message instead
    logged: list[str] = []
    handler = logging.Handler(level=logging.ERROR)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("megatron.core.dist_checkpointing").addHandler(handler)
    try:
        checkpoint.save_checkpoint(ck, step=2, chunks=run.chunks, optimizer=run.optimizer, extra_state={"step": 2})
        res["crash_raised"] = False
    except BaseException as exc:  # noqa: BLE001  (torch's CheckpointException is a BaseException)
        res["crash_raised"] = True
        res["crash_error"] = repr(exc)[:500]
    finally:
        filesystem_async._write_item = original
        logging.getLogger("megatron.core.dist_checkpointing").removeHandler(handler)
    res["crash_logged"] = [m[:300] for m in logged]
    torch.distributed.barrier()
    res["latest_after_crash"] = (ck / "latest").read_text().strip()
    res["dirs_after_crash"] = sorted(p.name for p in ck.iterdir())

    # fresh model + optimizer at the same layout, load `latest`, redo step 2
    par.teardown_parallel(destroy_process_group=False)
    run2 = Run("tiny_dense", ParallelConfig(tp=2), False, None)
    extra = checkpoint.load_checkpoint(ck, chunks=run2.chunks, optimizer=run2.optimizer)
    res["extra_note"] = extra.get("note")
    res["extra_step"] = extra.get("step")
    res["extra_rng_equal"] = bool(torch.equal(extra["rng"], rng_at_save))
    run2.steps_done = 1
    res["resumed"] = run2.train(2)
    par.teardown_parallel(destroy_process_group=False)

    # control: same weights but a fresh optimizer (no Adam state) must diverge at step 3
    run_c = Run("tiny_dense", ParallelConfig(tp=2), False, None)
    checkpoint.load_checkpoint(ck, chunks=run_c.chunks)
    run_c.steps_done = 1
    res["fresh_optimizer"] = run_c.train(2)
    par.teardown_parallel(destroy_process_group=False)

    # reshard: load the TP2 checkpoint at TP1 (dp=2) and compare full logits
    run3 = Run("tiny_dense", ParallelConfig(tp=1), False, None)
    checkpoint.load_checkpoint(ck, chunks=run3.chunks)
    logits_tp1 = run3.full_logits()
    res["logits_max_abs_diff"] = float((logits_tp1 - logits_tp2).abs().max())
    res["logits_max_abs"] = float(logits_tp2.abs().max())
    res["logits_shape_tp1"] = list(logits_tp1.shape)
    res["seconds"] = time.time() - t0
    write(out, "ckpt", res)
    par.teardown_parallel(destroy_process_group=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["ref", "layouts", "ckpt"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="")
    ap.add_argument("--ckpt", action="store_true", help="layouts: also run the checkpoint scenario")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "ref":
        mode_ref(out)
    elif args.mode == "layouts":
        mode_layouts(out, [c for c in args.cases.split(",") if c])
        if args.ckpt:
            mode_ckpt(out)
    else:
        mode_ckpt(out)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
