"""Worker for test_megatron_ep_resume.py (2 ranks, gloo; not a test module): tiny_qwen3_moe at EP 2 (dense
parameters data-parallel over 2 ranks, experts over 1) with the distributed optimizer, full training.

After one step it saves (`dp_reshardable`), takes a second step (the reference), loads the checkpoint back into
the same optimizer and takes that second step again; then it loads the checkpoint into a new model and optimizer
(never stepped) and takes it a third time. Each rank writes what it saw into --out/rank{r}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def optimizer_state(optimizer) -> dict:
    """{(chained index, group, position, key): tensor} over every sub-optimizer: the FP32 main param shard
    ('param') and its torch Adam state (exp_avg, exp_avg_sq, step)."""
    out = {}
    for i, sub in enumerate(getattr(optimizer, "chained_optimizers", None) or [optimizer]):
        inner = sub.optimizer
        for g, group in enumerate(inner.param_groups):
            for j, p in enumerate(group["params"]):
                out[f"{i}/{g}/{j}/param"] = p.detach().clone()
                for k, v in inner.state.get(p, {}).items():
                    out[f"{i}/{g}/{j}/{k}"] = v.detach().clone()
    return out


def differences(ref: dict, got: dict) -> dict:
    """{key: max |difference|} of the tensors that are not bitwise equal (inf: missing or another shape)."""
    import torch

    diff = {}
    for k in sorted(set(ref) | set(got)):
        a, b = ref.get(k), got.get(k)
        if a is None or b is None or a.shape != b.shape:
            diff[k] = float("inf")
        elif not torch.equal(a, b):
            diff[k] = float((a.double() - b.double()).abs().max())
    return diff


def distinct_steps(optimizer) -> list[int]:
    """Per sub-optimizer: how many distinct 'step' tensor objects its states hold (one per parameter expected)."""
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [len({id(st["step"]) for st in s.optimizer.state.values() if "step" in st}) for s in subs]


def second_step(run) -> dict:
    run.steps_done = 1
    metrics = run.train(1)
    return {"metrics": metrics, "state": optimizer_state(run.optimizer), "logits": run.full_logits()}


def main() -> None:
    import torch

    from megatron_worker import Run
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.trainer.megatron import checkpoint, parallel as par

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    torch.set_num_threads(1)
    run = Run("tiny_qwen3_moe", ParallelConfig(ep=2), True, None)
    run.train(1)
    saved = optimizer_state(run.optimizer)
    checkpoint.save_checkpoint(out / "ckpt", step=1, chunks=run.chunks, optimizer=run.optimizer)
    ref = second_step(run)
    checkpoint.load_checkpoint(out / "ckpt", chunks=run.chunks, optimizer=run.optimizer)
    loaded_in_place = optimizer_state(run.optimizer)
    in_place = second_step(run)
    res = {"subs": [type(s).__name__ for s in run.optimizer.chained_optimizers],
           "dp": run.info.dp, "ep": run.info.ep,
           "ref_metrics": ref["metrics"], "in_place_metrics": in_place["metrics"],
           "load_in_place_vs_save": differences(saved, loaded_in_place),
           "second_step_vs_save": len(differences(saved, ref["state"])),
           "in_place_vs_ref": differences(ref["state"], in_place["state"]),
           "in_place_logits_equal": bool(torch.equal(ref["logits"], in_place["logits"])),
           "ref_steps": sorted({float(v) for k, v in ref["state"].items() if k.endswith("/step")}),
           "in_place_steps": sorted({float(v) for k, v in in_place["state"].items() if k.endswith("/step")}),
           "distinct_steps_in_place": distinct_steps(run.optimizer),
           "params_per_sub": [len(s.optimizer.state) for s in run.optimizer.chained_optimizers]}
    par.teardown_parallel(destroy_process_group=False)
    fresh_run = Run("tiny_qwen3_moe", ParallelConfig(ep=2), True, None)  # never stepped: primed before the load
    checkpoint.load_checkpoint(out / "ckpt", chunks=fresh_run.chunks, optimizer=fresh_run.optimizer)
    res["load_fresh_vs_save"] = differences(saved, optimizer_state(fresh_run.optimizer))
    fresh = second_step(fresh_run)
    res.update(fresh_metrics=fresh["metrics"], fresh_vs_ref=differences(ref["state"], fresh["state"]),
               fresh_logits_equal=bool(torch.equal(ref["logits"], fresh["logits"])))
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(res))
    par.teardown_parallel()


if __name__ == "__main__":
    main()
