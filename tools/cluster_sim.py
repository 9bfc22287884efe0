#!/usr/bin/env python
"""Simulate generators + trainer: PipelineRL-k vs PPO-off-policy-k (scalerl_mega/cluster/schedule_sim.py).

  tools/cluster_sim.py                                 # paper layout (64 gen + 16 trainer GPUs), k=8, both modes
  tools/cluster_sim.py --scale 12 --k 8                # ~1k GPUs (768 gen + 192 trainer), batch x12
  tools/cluster_sim.py --calibration run/metrics.jsonl # calibrate on a measured run and compare
  tools/cluster_sim.py --calibration cal.json --json
  tools/cluster_sim.py --sync-layout train_qwen3_moe --senders many   # sync_s from the weight-sync model

Calibration input: either a JSON object with the keys below, or a metrics.jsonl whose step records
carry these fields (one record per optimizer step; the first record is skipped as warm-up):
  timing/train_step_s   trainer compute seconds of the step (forward+backward+optimizer, no waiting)
  timing/sync_s         weight-sync seconds after the step (export + broadcast + engine load)
  timing/step_wall_s    wall seconds between this step's end and the previous step's end
  batch/tokens          prompt + completion tokens in the step's batch
  batch/gen_lengths     list of completion lengths (tokens) of the step's batch
  batch/prompt_tokens_mean   mean prompt length
  gen/busy_s            engine seconds spent in decode/prefill since the previous record (sum over engines)
  gen/decode_steps      decode steps (forward calls) since the previous record (sum over engines)
  gen/decode_tokens     tokens decoded since the previous record (= sum of batch size over decode steps)
  sim/batch_samples, sim/num_generators, sim/gpus_per_generator, sim/trainer_gpus,
  sim/max_concurrency, sim/mode, sim/k   run layout (constant; needed on at least one record)
Calibration JSON keys: decode_base_s, decode_per_seq_s, train_fixed_s, train_per_token_s, sync_s,
prompt_len, gen_lengths, batch_samples, num_generators, gpus_per_generator, trainer_gpus,
max_concurrency, mode, k, and optionally "measured": {trainer_idle_fraction, generator_idle_fraction,
samples_per_hour} and "source".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalerl_mega.cluster.schedule_calibration import config_from_calibration, load_calibration  # noqa: E402
from scalerl_mega.cluster.schedule_sim import paper_layout, simulate  # noqa: E402


def _row(res) -> str:
    st = res.staleness
    n = sum(st.values()) or 1
    mean_st = sum(s * c for s, c in st.items()) / n
    return (f"| {res.mode}-{res.k} | {res.gpu_idle_fraction:.3f} | {res.generator_idle_fraction:.3f} | "
            f"{res.trainer_idle_fraction:.3f} | {res.samples_per_hour:,.0f} | {res.mean_step_period_s:.1f} | "
            f"{mean_st:.2f} | {res.max_staleness} |")


HEADER = ("| regime | GPU idle | generator idle | trainer idle | samples/h | s/step | mean staleness | "
          "max staleness |\n|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", help="calibration JSON or metrics.jsonl of a measured run")
    ap.add_argument("--mode", choices=("pipeline_rl", "ppo_off_policy", "both"), default="both")
    ap.add_argument("--k", type=int, default=None, help="off-policy k (default 8, or the calibrated run's)")
    ap.add_argument("--scale", type=int, default=1, help="multiply the paper layout and batch (12 -> 960 GPUs)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sync-layout", default=None,
                    help="a shipped layout (cluster/layouts.py shipped_layouts): sync_s = the weight-sync model's prediction for it")
    ap.add_argument("--senders", choices=("one", "many"), default="many", help="with --sync-layout: which sync")
    args = ap.parse_args(argv)
    weight_sync = None
    if args.sync_layout:
        from scalerl_mega.cluster.layouts import shipped_layouts
        from scalerl_mega.cluster.plan import MODELS
        from scalerl_mega.cluster.sync_model import predict_sync

        layouts = shipped_layouts()
        if args.sync_layout not in layouts:
            print(f"error: --sync-layout {args.sync_layout!r} is not one of {sorted(layouts)}", file=sys.stderr)
            return 1
        sl = layouts[args.sync_layout]
        pred = predict_sync(MODELS[sl.model], sl.train_layout())
        weight_sync = pred.as_json()

    modes = ("pipeline_rl", "ppo_off_policy") if args.mode == "both" else (args.mode,)
    results, measured = [], None
    for mode in modes:
        try:
            if args.calibration:
                cal = load_calibration(args.calibration)
                measured = cal.get("measured")
                k = args.k or int(cal.get("k", 8))
                cfg = config_from_calibration(cal, mode=mode, k=k, seed=args.seed)
            else:
                k = args.k or 8
                cfg = paper_layout(mode=mode, k=k, scale=args.scale, seed=args.seed)
            steps = args.steps
            warm = args.warmup_steps
            if mode == "ppo_off_policy":  # whole rounds
                steps = max(k, -(-steps // k) * k)
                warm = (warm // k) * k
                if warm >= steps:
                    warm = 0
            cfg = replace(cfg, steps=steps, warmup_steps=min(warm, steps - 1))
            if weight_sync is not None:
                cfg = replace(cfg, sync_s=weight_sync["multi_sender_s" if args.senders == "many" else "single_sender_s"])
            results.append(simulate(cfg))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({"results": [r.to_dict() for r in results], "measured": measured,
                          "weight_sync": weight_sync}, indent=2))
        return 0
    total = cfg.trainer_gpus + cfg.generator_gpus
    print(f"layout: {cfg.generator_gpus} generator GPUs ({cfg.num_generators} servers) + {cfg.trainer_gpus} "
          f"trainer GPUs = {total}; {cfg.batch_samples} sequences/step")
    if weight_sync is not None:
        print(f"sync_s = {cfg.sync_s:.2f} s ({args.senders} sender(s), modelled for {args.sync_layout}: "
              f"{json.dumps(weight_sync)})")
    print(HEADER)
    for r in results:
        print(_row(r))
    if measured:
        print(f"measured (calibration run): {json.dumps(measured)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
