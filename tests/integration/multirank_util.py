"""Shared pieces of the multi-rank `scalerl-train` tests: launch one job (plain python for 1 rank,
`torchrun --standalone` for N), read its metrics, build a warm-started HF checkpoint to start runs
from (so rewards vary and every step trains), and fingerprint a trainer checkpoint after a
single-process conversion to HF (what a 1-rank export holds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# PPO-off-policy-1: every step generates B prompts on the current weights, trains, syncs. Generation
# is then a deterministic function of the weights and the per-sample seeds, so runs at different
# layouts see the same samples and rewards (PipelineRL's in-flight timing would differ run to run).
COMMON = [
    "experiment=demo", "off_policy=ppo_off_policy", "off_policy.k=1", "data.synthetic_max_digits=1",
    "data.synthetic_num_prompts=48", "data.val_prompts=8", "data.val_samples=2", "train.prompts_per_step=8",
    "train.generations_per_prompt=4", "train.val_every=0", "rollout.max_batch_size=16",
    "metrics.tensorboard=false",
]

REL_TOL = 1e-3
"""Per-step loss and grad norm of an N-rank run vs the 1-rank run. Sharded layouts sum the same
float32 terms in another order (TP/EP partial sums, DP all-reduce, SP reduce-scatter): about 1e-6
relative at step 1 (measured 1.3e-5 for EP2 on the grad norm). Adam divides each coordinate by its
own RMS, so coordinates with near-zero gradients get O(lr) updates whatever their sign and these
differences grow with the steps: measured 2.6e-4 by step 3. 1e-3 keeps a margin; a real bug (a
DP shard trained twice or not at all, a missing reduction, a wrong micro-batch weight) moves the
loss or grad norm by tens of percent."""


def run_job(out: Path, overrides: list[str], *, nproc: int = 1, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if nproc == 1:
        cmd = [sys.executable, "-m", "scalerl_mega.train"]
    else:
        cmd = [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "-m", "scalerl_mega.train"]
    proc = subprocess.run([*cmd, *overrides, f"output_dir={out}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"scalerl-train ({nproc} ranks) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    return proc


def records(out: Path, kind: str = "train") -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == kind]


def warm_hf_checkpoint(root: Path, model_overrides: list[str], *, sft_steps: int = 100) -> Path:
    """A 1-rank SFT warm start (100 steps: pass rate 0.1-0.5 on 1-digit sums for the demo's models) exported
    to an HF dir."""
    run_job(root / "sft", [*COMMON, *model_overrides, f"sft.steps={sft_steps}", "sft.batch_size=32", "sft.warmup_steps=10",
                           "train.steps=1", "train.save_every=1"])
    hf = root / "hf"
    convert(root / "sft" / "checkpoints", hf)
    return hf


def convert(ckpt: Path, out: Path) -> None:
    proc = subprocess.run([sys.executable, "tools/convert_megatron_to_hf.py", "--ckpt", str(ckpt), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def hf_digest(hf_dir: Path) -> str:
    """`weight_sync.weights_sha256` of an HF checkpoint as the local engine holds it (FP32 params)."""
    import torch
    from transformers import AutoModelForCausalLM

    from scalerl_mega.weight_sync import weights_sha256

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    return weights_sha256(model.named_parameters())


def assert_same_run(single: list[dict], multi: list[dict]) -> None:
    """Same prompts in the same order, same samples and rewards; loss, grad norm and the loss diagnostics
    (exact aggregates over the ranks' shares) within REL_TOL."""
    assert [r["step"] for r in multi] == [r["step"] for r in single]
    for a, b in zip(single, multi):
        assert b["prompt_ids"] == a["prompt_ids"], f"step {a['step']}: different prompts"
        assert b["batch/gen_lengths"] == a["batch/gen_lengths"], f"step {a['step']}: different samples"
        assert b["reward_mean"] == a["reward_mean"] and b["pass_rate"] == a["pass_rate"]
        assert b.get("skipped_no_signal", 0.0) == a.get("skipped_no_signal", 0.0) == 0.0, "a step did not train"
        for key in ("train/loss", "train/grad_norm", "train/is_ratio_mean", "train/rho_mean", "train/rho_max",
                    "train/approx_kl", "train/entropy", "train/clip_fraction"):
            assert abs(b[key] - a[key]) <= REL_TOL * max(abs(a[key]), 1e-3), (a["step"], key, a[key], b[key])
