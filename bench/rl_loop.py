"""A whole bf16 RL loop of a ~0.5B-parameter model on one GPU, then save and resume (tools/gpu_check.sh's RL
stage): per-step tokens/s, trainer MFU and weight-push time, and whether the resumed run matches.

Run A: `scalerl-train experiment=gpu_check` (conf/experiment/gpu_check.yaml: Megatron trainer and the local
engine in one process on one GPU, synchronous PPO-off-policy-1, random init) for STEPS steps, saving every
SAVE_AT. Run B: a fresh process and output directory resuming from A's step-SAVE_AT checkpoint
(`resume=<A>/checkpoints/step_<SAVE_AT>`) to STEPS. Steps SAVE_AT+1.. are thus run twice. Matched when B trains
the same prompts, generates the same number of tokens, reports the same losses (relative `RESUME_LOSS_TOL`) and
holds bit-identical weights after each compared step (`gen/weights_sha256`: the engine's weights after the
step's push, digested only at the compared steps and outside the step clock). The step after the first resumed
one depends on the restored Adam state (lr 1e-4: a fresh state moves its loss visibly). Both runs use bf16
params and Megatron's mixed-precision optimizer (FP32 main weights and Adam), also in the CPU rehearsal, so the
bf16 optimizer's checkpoint and resume run before any GPU does. Triton's autotuning choices are pinned across
the two processes: both share one Triton cache with `TRITON_CACHE_AUTOTUNING=1`, so run B reuses run A's block
sizes instead of re-tuning (a different BLOCK_V reorders the head's sums and the tokens can diverge).

Results as they arrive: `--json` is written once run A is done (its step table, `resume: null`) and rewritten
after run B; `--budget` bounds both runs together (run A gets `A_SHARE` of it), so the script ends, and writes,
before tools/gpu_check.sh's outer limit.

Per step of run A (metrics.jsonl): tokens/s (generated tokens over the step's wall time), engine decode
tokens/s, trainer tokens/s (the batch's prompt + completion tokens over the optimizer step's time), trainer
TFLOP/s and MFU (`metrics.compute.train_flops` over the step time, against the device's dense bf16 peak,
`dense_bf16_peak_tflops`; none on CPU) and the weight push's time. Step 1 includes warm-up (compilation,
autotuning), so the medians are over the later steps.

    python3 bench/rl_loop.py --work /tmp/rl --json OUT/rl_loop.json --budget 200        # GPU (tools/gpu_check.sh)
    python3 bench/rl_loop.py --cpu --work /tmp/rl --json OUT/rl_loop.json               # toy size, CPU rehearsal

`decodable_chars` is the check's reward (a random-init model's output is mostly ids outside the synthetic
task's 47-token vocabulary): importable by the reward workers as `bench.rl_loop.decodable_chars`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS, SAVE_AT = 4, 2
A_SHARE = 0.55
"""Run A's share of `--budget` (it saves twice and runs STEPS steps; run B loads and runs STEPS - SAVE_AT)."""
RESUME_LOSS_TOL = 1e-5
"""Relative loss difference between a resumed step and the uninterrupted one that still counts as matched:
the same weights and samples give the same loss up to reduction order (bit-identical on CPU)."""
EXTRA = ["optim.lr=1e-4", "optim.warmup_steps=0", "metrics.weights_digest=true",
         f"metrics.weights_digest_steps=[{','.join(map(str, range(SAVE_AT + 1, STEPS + 1)))}]"]
CPU_OVERRIDES = [  # toy shape and CPU settings for the rehearsal (same loop, same stages)
    "model.vocab_size=64", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=4", "model.num_query_groups=2", "model.max_position_embeddings=128",
    "cluster.device=cpu", "cluster.trainer_threads=1", "reward.num_workers=1",
    "train.prompts_per_step=4", "train.generations_per_prompt=4", "length.max_new_tokens=16",
    "length.penalty_max_len=16", "length.penalty_cache_len=4", "rollout.max_batch_size=16",
    "data.synthetic_num_prompts=200", "data.val_prompts=8",
]


def hold(point: str) -> None:
    """The kill test's pause point (tests/integration/test_gpu_check_kill.py), as tools/gpu_check.sh's `hold`:
    when GPU_CHECK_HOLD_AT names `point`, create <GPU_CHECK_HOLD_DIR>/<point>.reached and wait for
    <point>.release, so that the test kills the kit at a chosen point, not after a guessed delay."""
    if os.environ.get("GPU_CHECK_HOLD_AT") != point:
        return
    where = Path(os.environ["GPU_CHECK_HOLD_DIR"])
    (where / f"{point}.reached").touch()
    while not (where / f"{point}.release").exists():
        time.sleep(0.05)


def decodable_chars(completion: str, gold, **_) -> tuple[float, bool]:
    """Reward of the check's random-init model: min(characters decoded, 4) / 4, passed when any decoded."""
    n = len(completion)
    return min(n, 4) / 4.0, n > 0


def run_train(out: Path, overrides: list[str], *, log, timeout_s: float, triton_cache: Path) -> float:
    """`python -m scalerl_mega.train experiment=gpu_check output_dir=out ...`, its output appended to `log`;
    returns its wall seconds. RuntimeError naming the run when it fails or outlives `timeout_s`."""
    cmd = [sys.executable, "-m", "scalerl_mega.train", "experiment=gpu_check", f"output_dir={out}",
           f"hydra.run.dir={out}", *EXTRA, *overrides]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CACHE_DIR=str(triton_cache), TRITON_CACHE_AUTOTUNING="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"run {out.name} timed out after {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"run {out.name} failed (exit {proc.returncode}); see the log")
    return time.monotonic() - t0


def _train_records(run: Path) -> list[dict]:
    from scalerl_mega.metrics.writer import read_metrics

    return read_metrics(run / "metrics.jsonl", kind="train")


def _model(run: Path):
    from omegaconf import OmegaConf

    from scalerl_mega.model.config import model_from_dict

    node = OmegaConf.to_container(OmegaConf.load(run / "run_config.yaml"), resolve=True)
    return model_from_dict(node["model"], source=str(run / "run_config.yaml"))


def step_table(records: list[dict], model, *, peak_tflops: float | None) -> list[dict]:
    """Per-step figures of a run's train records (see module doc)."""
    from scalerl_mega.metrics.compute import train_flops

    rows = []
    for r in records:
        prompt = r["batch/prompt_tokens_mean"]
        seqs = [int(round(prompt)) + g for g in r["batch/gen_lengths"]]
        train_s = r["timing/train_step_s"]
        tflops = train_flops(model, seqs) / train_s / 1e12
        busy = r.get("gen/busy_s", 0.0)
        rows.append({
            "step": r["step"], "batch_tokens": r["batch/tokens"], "generated_tokens": r["generated_tokens"],
            "step_s": r["step_s"], "tokens_per_s": r["tokens_per_s"],
            "engine_tokens_per_s": r["gen/decode_tokens"] / busy if busy else None,
            "train_s": train_s, "train_tokens_per_s": r["batch/tokens"] / train_s, "trainer_tflops": tflops,
            "mfu": tflops / peak_tflops if peak_tflops else None, "push_s": r["weight_sync_s"],
            "loss": r["train/loss"],
        })
    return rows


def resume_check(a: list[dict], b: list[dict]) -> dict:
    """Run B's steps against run A's steps of the same number (see module doc)."""
    by_step = {r["step"]: r for r in a}
    steps, out = [], {"prompts_equal": True, "tokens_equal": True, "weights_bitwise": True, "loss_rel_diff": 0.0}
    for rb in b:
        ra = by_step.get(rb["step"])
        if ra is None:
            return {**out, "steps": steps, "matched": False, "why": f"run A has no step {rb['step']}"}
        steps.append(rb["step"])
        out["prompts_equal"] &= ra["prompt_ids"] == rb["prompt_ids"]
        out["tokens_equal"] &= ra["generated_tokens"] == rb["generated_tokens"]
        out["weights_bitwise"] &= ra.get("gen/weights_sha256") == rb.get("gen/weights_sha256") is not None
        la, lb = ra["train/loss"], rb["train/loss"]
        out["loss_rel_diff"] = max(out["loss_rel_diff"], abs(la - lb) / max(abs(la), 1e-30))
    matched = (bool(steps) and out["prompts_equal"] and out["tokens_equal"] and out["weights_bitwise"]
               and out["loss_rel_diff"] <= RESUME_LOSS_TOL)
    return {**out, "steps": steps, "matched": matched}


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return statistics.median(vals) if vals else None


def summarize(rows: list[dict], resume: dict | None, *, device: str, model, params_dtype: str, wall_s: dict,
              run_b: str) -> dict:
    """The `rl_loop` entry of tools/gpu_check.sh's summary.json; `resume` None while run B has not finished
    (`run_b` says why: "not started", "done" or its error)."""
    later = rows[1:] or rows  # step 1 carries the warm-up
    return {
        "device": device, "params": model.num_params()["total"], "params_dtype": params_dtype, "steps": len(rows),
        "resumed_steps": len(resume["steps"]) if resume else 0, "tokens_per_s": _median(later, "tokens_per_s"),
        "train_tokens_per_s": _median(later, "train_tokens_per_s"), "mfu": _median(later, "mfu"),
        "trainer_tflops": _median(later, "trainer_tflops"), "push_s": _median(later, "push_s"),
        "resume_matched": resume["matched"] if resume else None, "resume": resume, "run_b": run_b,
        "per_step": rows, "wall_s": wall_s,
    }


def _device_name(cpu: bool) -> str:
    if cpu:
        return "cpu"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA)"


def _run_config(run: Path) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run / "run_config.yaml"), resolve=True)


def _write(path: str | None, out: dict) -> None:
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(path)  # a kill mid-write leaves the previous version, never half a file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="directory for the two runs (emptied first, removed after)")
    ap.add_argument("--cpu", action="store_true", help="toy shape on CPU (the rehearsal)")
    ap.add_argument("--json", help="write the rl_loop summary here (after run A, again after run B)")
    ap.add_argument("--log", help="append both runs' output here (default: <work>/rl_loop.log)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for both runs together")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    over = [f"train.steps={STEPS}", f"train.save_every={SAVE_AT}", *(CPU_OVERRIDES if args.cpu else [])]
    a, b, cache = work / "a", work / "b", work / "triton-cache"
    try:
        with open(args.log or work / "rl_loop.log", "a") as log:
            wall = {"run_a": run_train(a, over, log=log, timeout_s=A_SHARE * args.budget, triton_cache=cache)}
            from scalerl_mega.metrics.compute import dense_bf16_peak_tflops

            device = _device_name(args.cpu)
            model, params_dtype = _model(a), _run_config(a)["precision"]["params_dtype"]
            rows = step_table(_train_records(a), model,
                              peak_tflops=None if args.cpu else dense_bf16_peak_tflops(device))
            out = summarize(rows, None, device=device, model=model, params_dtype=params_dtype, wall_s=wall,
                            run_b="not started")
            _write(args.json, out)  # run A's table is kept whatever happens to run B
            hold("rl_loop.run_b")
            # A saved at SAVE_AT and at STEPS: B resumes from the SAVE_AT checkpoint itself
            ckpt = a / "checkpoints" / f"step_{SAVE_AT:08d}"  # trainer/megatron/checkpoint.py step_dirname
            left = args.budget - (time.monotonic() - t_start)
            try:
                wall["run_b_resumed"] = run_train(b, [*over, f"resume={ckpt}"], log=log, timeout_s=left,
                                                  triton_cache=cache)
            except RuntimeError as e:
                _write(args.json, {**out, "run_b": str(e)})
                raise
        resume = resume_check(_train_records(a), _train_records(b))
        out = summarize(rows, resume, device=device, model=model, params_dtype=params_dtype, wall_s=wall,
                        run_b="done")
    finally:
        if not args.keep:
            shutil.rmtree(work / "a", ignore_errors=True)
            shutil.rmtree(work / "b", ignore_errors=True)
    _write(args.json, out)
    print(f"rl_loop: {out['steps']} steps of a {out['params'] / 1e9:.3f} B {params_dtype} model on {device}; "
          f"tokens/s {out['tokens_per_s']}, trainer MFU {out['mfu']}, push {out['push_s']} s; resumed "
          f"{out['resumed_steps']} steps, matched {out['resume_matched']}")
    return 0 if out["resume_matched"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
