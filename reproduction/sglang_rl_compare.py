#!/usr/bin/env python
"""`make sglang-rl-compare`: the demo's recipe trained end to end on a real SGLang 0.5.23 server (CPU) and on the
local engine, same seed and sizes, compared side by side (issue 27, deliverable 3; docs/sglang.md).

    python -m reproduction.sglang_rl_compare [--out outputs/sglang_rl] [--engine sglang|local|both] [--force]
                                      [--report-only] [-- <more scalerl-train overrides>]

1. `--engine local`: `python -m scalerl_mega.train <RECIPE> rollout=local output_dir=<out>/local`;
2. `--engine sglang`: writes the recipe's model as an HF checkpoint (random init: the loop pushes the trainer's
   weights before the first request), launches a real SGLang server on CPU through the project's launch
   (`tests/sglang_support/real_server.launch`, pause_mode=in_place: radix cache and overlap scheduler off),
   runs the same command with `rollout=sglang rollout.engine_urls=[<server>]` into `<out>/sglang` and stops the
   server's process group (also on error or Ctrl-C);
3. writes `<out>/sglang_rl.md` (table) and `<out>/sglang_rl.png` (reward and validation pass rate vs RL step).

Rerunnable per engine: a finished run (its summary.json has every step) is skipped unless --force; an
unfinished one resumes from its last checkpoint (`train.save_every`, `resume=auto`); each launch's wall time is
appended to `<out>/<engine>/launches.json`. The SGLang interpreter is `.venv-sglang/bin/python` (`make
test-sglang` builds it) or `$SCALERL_SGLANG_PYTHON`.

Model: `demo_dense` (tiny_dense at the demo's sizes), because SGLang 0.5.23 does not serve the demo's Llama-4 MoE on
CPU (docs/sglang.md, "MoE on SGLang's CPU path"). Measured on a loaded 2-core machine: the SGLang run 27 min
(server start 109 s, RL 6.1 s per step), the local one 4 min; the reward rises on both (docs/sglang.md).
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
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("local", "sglang")
MODEL = "demo_dense"
STEPS = 40
RECIPE = ["experiment=demo", f"model={MODEL}", "moe.record_routes=false", f"train.steps={STEPS}",
          "train.prompts_per_step=8", "train.generations_per_prompt=8",
          "data.val_prompts=64", "data.val_samples=2", "train.val_every=10", "train.save_every=5",
          "metrics.max_logprob_mismatch=1e-3", "metrics.mismatch_mode=assert", "metrics.tensorboard=false"]
"""The demo (PipelineRL-2, CISPO, FP32 head, interruption, NPR, zero-variance filter) with tiny_dense; 40 RL
steps of 8 prompts x 8 samples at the demo's lr 1e-4 (the demo: 80 x 32 x 8; at this batch lr 3e-4 and 1e-3
collapsed the local run to reward -1 by step 4-5), validation on 64 prompts x 2 every 10 steps; on-policy engine-vs-trainer log-prob gap above 1e-3 stops the run (assert mode)."""
SERVER_ARGS = ("--context-length", "128", "--max-running-requests", "32", "--max-total-tokens", "8192")
"""Prompt <= 16 tokens + 48 new (+ the interruption's second request) fits 128; 32 running requests."""
EDGE = 5
"""First / last reward: mean over this many RL steps."""


# ----------------------------------------------------------------------------- metrics -> summary
def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's train records (by step, the last written wins), validation points, launches and summary."""
    from scalerl_mega.metrics.writer import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    recs = read_metrics(path) if path.is_file() else []
    train = {r["step"]: r for r in recs if r.get("kind") == "train"}
    val = {r["step"]: r for r in recs if "val_pass_rate" in r}
    launches = Path(run_dir) / "launches.json"
    summary = Path(run_dir) / "summary.json"
    return {"train": [train[s] for s in sorted(train)], "val": [val[s] for s in sorted(val)],
            "launches": json.loads(launches.read_text()) if launches.is_file() else [],
            "summary": json.loads(summary.read_text()) if summary.is_file() else {}}


def summarize(run: dict[str, Any], *, edge: int = EDGE) -> dict[str, Any]:
    """The figures of one run (None where the run has no such record)."""
    train, val = run["train"], run["val"]
    if not train:
        return {"steps": 0}
    reward = [float(r["reward_mean"]) for r in train]
    gap_max = [r["train/onpolicy_abs_log_ratio_max"] for r in train if "train/onpolicy_abs_log_ratio_max" in r]
    gap_mean = [r["train/onpolicy_abs_log_ratio_mean"] for r in train if "train/onpolicy_abs_log_ratio_mean" in r]
    hist: dict[int, float] = {}
    for r in train:
        for age, n in r.get("staleness_hist", {}).items():
            hist[int(age)] = hist.get(int(age), 0.0) + float(n)
    n_hist = sum(hist.values())
    versions = [int(r["weight_version"]) for r in train]
    steps = [int(r["step"]) for r in train]
    return {
        "steps": steps[-1], "wall_s": sum(x["wall_s"] for x in run["launches"]) or None,
        "server_start_s": sum(x.get("server_start_s", 0.0) for x in run["launches"]) or None,
        "rl_s": sum(float(r["step_s"]) for r in train), "step_s_median": statistics.median(float(r["step_s"]) for r in train),
        "sync_s": (min(float(r["weight_sync_s"]) for r in train), max(float(r["weight_sync_s"]) for r in train)),
        "tokens_per_s": statistics.median(float(r["tokens_per_s"]) for r in train),
        "reward": reward, "reward_first": statistics.mean(reward[:edge]), "reward_last": statistics.mean(reward[-edge:]),
        "val": [(int(r["step"]), float(r["val_pass_rate"])) for r in val],
        "gap_max": max(gap_max) if gap_max else None, "gap_mean": statistics.mean(gap_mean) if gap_mean else None,
        "gap_steps": len(gap_max), "versions": versions, "versions_ok": versions == steps,
        "staleness_hist": dict(sorted(hist.items())),
        "staleness_mean": sum(a * n for a, n in hist.items()) / n_hist if n_hist else None,
    }


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _versions(s: dict[str, Any]) -> str:
    v = s["versions"]
    short = ", ".join(map(str, v[:3])) + (f", ..., {v[-1]}" if len(v) > 3 else "")
    return f"{short} ({'= step, every step' if s['versions_ok'] else 'NOT equal to the step'})"


def report_table(sums: dict[str, dict[str, Any]], *, edge: int = EDGE) -> str:
    """Markdown table, one column per engine present."""
    names = {"sglang": "real SGLang 0.5.23 (CPU)", "local": "local engine"}
    cols = [e for e in ("sglang", "local") if e in sums and sums[e]["steps"]]
    rows: list[tuple[str, Any]] = [
        ("RL steps", lambda s: str(s["steps"])),
        ("wall time, all launches (SFT + engine start + RL + validation)", lambda s: _f(s["wall_s"], ".0f") + " s" if s["wall_s"] else "-"),
        ("SGLang server start", lambda s: _f(s["server_start_s"], ".0f") + " s" if s["server_start_s"] else "-"),
        ("RL step time, median (sum over steps)", lambda s: f"{s['step_s_median']:.1f} s ({s['rl_s']:.0f} s)"),
        ("generated tokens/s, median step", lambda s: f"{s['tokens_per_s']:.0f}"),
        ("weight push per step (min-max)", lambda s: f"{s['sync_s'][0]:.2f}-{s['sync_s'][1]:.2f} s"),
        (f"reward, mean of the first {edge} steps -> last {edge}", lambda s: f"{s['reward_first']:+.3f} -> {s['reward_last']:+.3f}"
         f" ({s['reward_last'] - s['reward_first']:+.3f})"),
        ("validation pass rate, first -> last (steps)", lambda s: (
            f"{s['val'][0][1]:.3f} -> {s['val'][-1][1]:.3f} ({s['val'][-1][1] - s['val'][0][1]:+.3f}; "
            f"steps {s['val'][0][0]}-{s['val'][-1][0]})") if s["val"] else "-"),
        ("validation pass rate per validation", lambda s: " ".join(f"{v:.3f}" for _, v in s["val"]) or "-"),
        ("on-policy engine-vs-trainer abs log ratio: max / mean (steps with on-policy tokens)",
         lambda s: f"{_f(s['gap_max'], '.1e')} / {_f(s['gap_mean'], '.1e')} ({s['gap_steps']})"),
        ("weight version per step", _versions),
        ("staleness of trained samples (versions behind: count)",
         lambda s: ", ".join(f"{a}: {n:.0f}" for a, n in s["staleness_hist"].items()) + f"; mean {_f(s['staleness_mean'], '.2f')}"),
    ]
    out = ["| | " + " | ".join(names[c] for c in cols) + " |", "| --- |" + " --- |" * len(cols)]
    for label, fn in rows:
        out.append(f"| {label} | " + " | ".join(fn(sums[c]) for c in cols) + " |")
    return "\n".join(out) + "\n"


def plot(sums: dict[str, dict[str, Any]], path: Path) -> Path:
    """Two panels: reward per RL step (5-step running mean dashed under it) and validation pass rate."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax_r, ax_v = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = {"sglang": "tab:red", "local": "tab:blue"}
    labels = {"sglang": "real SGLang (CPU)", "local": "local engine"}
    for eng, s in sums.items():
        if not s["steps"]:
            continue
        r = s["reward"]
        x = list(range(1, len(r) + 1))
        run = [statistics.mean(r[max(0, i - EDGE + 1):i + 1]) for i in range(len(r))]
        ax_r.plot(x, r, color=colors[eng], alpha=0.3, lw=1)
        ax_r.plot(x, run, color=colors[eng], lw=2, label=f"{labels[eng]} ({EDGE}-step mean)")
        if s["val"]:
            vx, vy = zip(*s["val"])
            ax_v.plot(vx, vy, "-o", color=colors[eng], label=labels[eng])
    ax_r.set_xlabel("RL step")
    ax_r.set_ylabel("train reward (mean over the step's samples)")
    ax_v.set_xlabel("RL step")
    ax_v.set_ylabel("validation pass rate")
    for ax in (ax_r, ax_v):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", frameon=False)
    fig.suptitle(f"demo recipe ({MODEL}, PipelineRL-2, CISPO, FP32 head): real SGLang vs local engine")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def write_report(out: Path, *, overrides: Sequence[str] = ()) -> str:
    sums = {e: summarize(load_run(out / e)) for e in ENGINES if (out / e).is_dir()}
    cmd = " ".join(["python -m scalerl_mega.train", *RECIPE, *overrides])
    text = (f"# Demo recipe on real SGLang vs the local engine\n\n`{cmd}` with `rollout=local` or `rollout=sglang "
            f"rollout.num_engines=1 rollout.engine_urls=[<real SGLang 0.5.23 server on CPU>]`; seed 0 for both. "
            f"Written by `python -m reproduction.sglang_rl_compare`.\n\n" + report_table(sums))
    (out / "sglang_rl.md").write_text(text)
    if any(s["steps"] for s in sums.values()):
        plot(sums, out / "sglang_rl.png")
    return text


# ----------------------------------------------------------------------------- runs
def _done(run_dir: Path) -> bool:
    summary = run_dir / "summary.json"
    return summary.is_file() and json.loads(summary.read_text()).get("steps") == STEPS


def _hf_checkpoint(path: Path, overrides: Sequence[str]) -> Path:
    """The recipe's model as an HF checkpoint for the server to load (random init; the first push replaces it)."""
    from scalerl_mega.rollout.local import build_model
    from scalerl_mega.rollout.server import spec_from_overrides

    build_model(spec_from_overrides([*RECIPE, *overrides]).model).save_pretrained(path)
    return path


def _train(run_dir: Path, extra: Sequence[str]) -> float:
    """One `python -m scalerl_mega.train` launch (console to <run_dir>/console.log); returns its wall seconds."""
    cmd = [sys.executable, "-m", "scalerl_mega.train", *RECIPE, *extra, f"output_dir={run_dir}",
           f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print(" ".join(cmd[1:]), flush=True)
    (run_dir / "summary.json").unlink(missing_ok=True)  # a previous launch's: this launch writes its own
    t0 = time.monotonic()
    with open(run_dir / "console.log", "a") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    summary = run_dir / "summary.json"
    if rc != 0 and summary.is_file() and json.loads(summary.read_text()).get("preempted"):
        print(f"sglang-rl-compare: stopped by a signal (checkpointed; run again to resume): exit {rc}")
    elif rc != 0:
        raise SystemExit(f"sglang-rl-compare: training failed (exit {rc}); see {run_dir / 'console.log'}")
    return time.monotonic() - t0


def run_engine(engine: str, out: Path, *, overrides: Sequence[str], force: bool) -> None:
    run_dir = out / engine
    if force and run_dir.exists():
        shutil.rmtree(run_dir)
    if _done(run_dir):
        print(f"sglang-rl-compare: {run_dir} has all {STEPS} steps (--force to redo)")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    launch: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.monotonic()
    if engine == "local":
        _train(run_dir, ["rollout=local", *overrides])
    else:
        sys.path.insert(0, str(REPO))
        from tests.sglang_support.real_server import launch as launch_server

        server = None
        try:
            hf = _hf_checkpoint(run_dir / "hf", overrides)
            server = launch_server(hf, pause_mode="in_place", extra_args=SERVER_ARGS)
            launch["server_start_s"] = time.monotonic() - t0
            print(f"sglang-rl-compare: SGLang server up at {server.url} after {launch['server_start_s']:.0f} s", flush=True)
            _train(run_dir, ["rollout=sglang", "rollout.num_engines=1", f"rollout.engine_urls=[{server.url}]",
                             *overrides])
        finally:
            if server is not None:
                server.stop()
    launch["wall_s"] = time.monotonic() - t0
    path = run_dir / "launches.json"
    path.write_text(json.dumps([*(json.loads(path.read_text()) if path.is_file() else []), launch], indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "sglang_rl")
    p.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    p.add_argument("--force", action="store_true", help="delete the engine's run and start it again")
    p.add_argument("--report-only", action="store_true", help="only (re)write the table and plot from <out>/*")
    p.add_argument("overrides", nargs="*", help="more scalerl-train overrides (after --), for both engines")
    args = p.parse_args(argv)
    if not args.report_only:
        for engine in (ENGINES if args.engine == "both" else (args.engine,)):
            run_engine(engine, args.out, overrides=args.overrides, force=args.force)
    print(write_report(args.out, overrides=args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
