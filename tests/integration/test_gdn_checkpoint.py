"""Trainer checkpoints of the Gated DeltaNet hybrids (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) save and load back bit
for bit: only some layers are GDN, so each layer's tensors are checkpointed under its own layer number (a stack
over all layers along one leading axis would leave the full-attention layers' rows of `dt_bias` / `A_log`
uncovered and the save is refused). The model that loads starts from other random weights; every parameter and
buffer it holds afterwards equals the saved model's, at one rank and at TP2 (the GDN in_proj / conv1d split
into their q/k/v/z/b/a sections per rank)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ARCHS = ("tiny_qwen3_5", "tiny_qwen3_5_moe", "tiny_qwen3_next")


def _round_trip(preset: str, ckpt: Path, tp: int) -> dict:
    """Save a perturbed model of `preset` at TP `tp`, load it into a model built from another seed; report the
    names that differ before and after the load."""
    import torch

    from scalerl_mega.model.config import ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron import checkpoint, models, parallel

    m, pc = load_model_preset(preset), ParallelConfig(tp=tp)
    parallel.init_parallel(pc, model=m, seed=3)
    saved, _ = models.build_model(m, pc)
    torch.manual_seed(11)
    fresh, _ = models.build_model(m, pc)
    with torch.no_grad():  # away from megatron's init (A_log / dt_bias have fixed-range inits)
        for p in saved.parameters():
            p.add_(torch.randn_like(p))
    want = {k: v.clone() for k, v in saved.state_dict().items() if torch.is_tensor(v)}
    before = sorted(k for k, v in fresh.state_dict().items() if torch.is_tensor(v) and not torch.equal(v, want[k]))
    checkpoint.save_checkpoint(ckpt, step=1, chunks=[saved], model_config=m)
    checkpoint.load_checkpoint(ckpt, chunks=[fresh])
    got = {k: v for k, v in fresh.state_dict().items() if torch.is_tensor(v)}
    parallel.teardown_parallel(destroy_process_group=False)
    return {"names": sorted(want), "differ_before": before, "got_names": sorted(got),
            "differ_after": sorted(k for k in want if not torch.equal(got[k], want[k]))}


def worker(out: str, root: str, tp: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    report = {preset: _round_trip(preset, Path(root) / preset, tp) for preset in ARCHS}
    if dist.is_initialized():
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(report, f)


def _check(report: dict) -> None:
    for preset in ARCHS:
        r = report[preset]
        names = r["names"]
        assert r["got_names"] == names, preset
        gdn = [n for n in names if n.endswith("self_attention.dt_bias") or n.endswith("self_attention.A_log")]
        assert len(gdn) == 4, (preset, gdn)  # layers 0 and 2 of each tiny preset are GDN
        assert set(gdn) <= set(r["differ_before"]), preset
        assert len(r["differ_before"]) > len(names) // 2, preset  # the loading model really starts elsewhere
        assert r["differ_after"] == [], (preset, r["differ_after"])


@pytest.mark.compat  # ~40 s (three tiny hybrids saved and loaded): the compatibility leg, beside its TP2 case
def test_gdn_hybrid_checkpoint_round_trips_bitwise_at_one_rank(tmp_path):
    from tests.integration.mp_launch import run_single_worker

    _check(run_single_worker(__file__, tmp_path / "report.json", args=(str(tmp_path / "ckpt"), "1")))


@pytest.mark.compat
@pytest.mark.timeout(600)
def test_gdn_hybrid_checkpoint_round_trips_bitwise_at_tp2(tmp_path):
    from tests.integration import mp_launch

    procs = mp_launch.start(Path(__file__), 2, ["--worker", str(tmp_path / "report{rank}.json"),
                                                str(tmp_path / "ckpt"), "2"], logdir=tmp_path, log_name="gdn_ckpt")
    mp_launch.wait(procs, logdir=tmp_path, log_name="gdn_ckpt", what="GDN checkpoint TP2")
    for rank in range(2):
        _check(json.loads((tmp_path / f"report{rank}.json").read_text()))


if __name__ == "__main__" and len(sys.argv) >= 5 and sys.argv[1] == "--worker":
    import os

    worker(sys.argv[2].format(rank=os.environ.get("RANK", "0")), sys.argv[3], int(sys.argv[4]))
