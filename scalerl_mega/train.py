"""`scalerl-train`: the Hydra entry point (DESIGN.md "Layout": build components from config, run).

    scalerl-train experiment=demo                 # CPU embedded default (`make demo`)
    scalerl-train --cfg job experiment=scalerl    # print the resolved ScaleRL config
    scalerl-train -m experiment=loo_dapo,loo_plan hydra/launcher=submitit_slurm

The config lives in `conf/` at the repository root; `scalerl_mega/config.py` holds its typed schema.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def to_config(cfg: Any):
    """OmegaConf node -> validated TrainConfig dataclass tree."""
    from omegaconf import OmegaConf

    from scalerl_mega.config import validate

    obj = OmegaConf.to_object(cfg)
    validate(obj)
    return obj


def run(cfg: Any) -> dict[str, Any]:
    """Validate `cfg` and run the job (SFT warm start if configured, then RL, then the report)."""
    config = to_config(cfg)
    if config.dry_run:  # layout/memory check on one CPU, then exit (trainer/megatron/dry_run.py)
        from scalerl_mega.trainer.megatron.dry_run import run_and_exit

        run_and_exit(config)
    return run_job(config)


class AutoBudgetForecaster:
    """The live forecast of `forecast.*`: no fit before `min_points` validations, then a refit at
    every validation; budget 0 means twice the compute spent so far (paper Eq. sigmoid_law)."""

    def __init__(self, fc_cfg: Any) -> None:
        from scalerl_mega.scaling.forecast import LiveForecaster

        self.cfg = fc_cfg
        self.live = LiveForecaster(budget=float(fc_cfg.budget) or 1.0, every=1,
                                   fit_from=float(fc_cfg.fit_from) or None)

    def add(self, compute: float, reward: float):
        if not self.cfg.budget:
            self.live.budget = 2.0 * max(compute, 1e-12)
        if len(self.live.compute) + 1 < self.cfg.min_points:
            self.live.compute.append(float(compute))
            self.live.reward.append(float(reward))
            return None
        return self.live.add(compute, reward)


def run_job(config: Any) -> dict[str, Any]:
    """Build the components, SFT warm start (fresh runs only), RL (resuming if a checkpoint exists),
    then report.md + scaling.png in `output_dir`. Returns a summary dict."""
    import json
    import time

    from scalerl_mega import build, sft
    from scalerl_mega.data.tasks.arith import sft_token_ids
    from scalerl_mega.loop import latest_checkpoint, run_rl
    from scalerl_mega.metrics.compute import ComputeCounter
    from scalerl_mega.report import write_report

    import logging

    logging.getLogger("megatron").setLevel(logging.WARNING)  # per-parameter DDP / optimizer dumps
    if config.cluster.trainer_threads:
        import torch

        torch.set_num_threads(config.cluster.trainer_threads)
    t_start = time.monotonic()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = build.build_task(config)
    trainer = build.build_trainer(config)
    engine = reward_fn = None
    summary: dict[str, Any] = {"output_dir": str(out)}
    try:
        resumed = latest_checkpoint(config) is not None
        if config.init_from_hf and not resumed:
            build.init_trainer_from_hf(trainer, config)
        t0 = time.monotonic()
        if config.sft.steps and not resumed:
            examples = [sft_token_ids(task.tokenizer, p) for p in task.train_prompts]
            with open(out / "sft.jsonl", "w", buffering=1) as f:
                def log_sft(step: int, m: dict) -> None:
                    f.write(json.dumps({"step": step, **m}) + "\n")
                    if step % max(config.sft.eval_every, 1) == 0 or step == config.sft.steps:
                        print(f"sft step {step}/{config.sft.steps}: loss {m['loss']:.4f}", flush=True)

                sft.warm_start(trainer, examples, steps=config.sft.steps, batch_size=config.sft.batch_size,
                               lr=config.sft.lr, warmup_steps=config.sft.warmup_steps, seed=int(config.seed),
                               on_step=log_sft)
        summary["sft_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        engine = build.build_engine(config, task, trainer)
        reward_fn = build.build_reward_fn(config)
        comps = build.build_components(config, task=task, trainer=trainer, engine=engine, reward_fn=reward_fn)
        summary["engine_start_s"] = time.monotonic() - t0
        devices = config.cluster.trainer_devices + config.cluster.generator_devices * config.rollout.num_engines
        compute = ComputeCounter(devices=devices, on_gpu=config.cluster.device == "cuda")
        forecaster = AutoBudgetForecaster(config.forecast) if config.forecast.enabled else None
        t0 = time.monotonic()
        state = run_rl(config, comps, compute=compute, forecaster=forecaster)
        summary["rl_s"] = time.monotonic() - t0
        summary["steps"] = state.step
        summary["val_points"] = [list(p) for p in state.val_points]
    finally:
        for thing in (engine, reward_fn):
            if thing is not None:
                thing.close()
        trainer.close()
    summary["wall_s"] = time.monotonic() - t_start
    if summary.get("val_points"):
        summary["first_val_pass_rate"] = summary["val_points"][0][2]
        summary["last_val_pass_rate"] = summary["val_points"][-1][2]
    report = write_report(out, title=f"{config.run_name} (seed {config.seed})", extra={
        "wall time (this launch, setup excluded)": f"{summary['wall_s']:.0f} s",
        "SFT warm start": f"{summary['sft_s']:.0f} s ({config.sft.steps if not resumed else 0} steps)",
        "RL": f"{summary['rl_s']:.0f} s ({state.step} steps)",
    })
    summary["report"] = str(report)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"report: {report}", flush=True)
    if "first_val_pass_rate" in summary:
        print(f"validation pass rate: first {summary['first_val_pass_rate']:.3f} -> last "
              f"{summary['last_val_pass_rate']:.3f}; wall {summary['wall_s']:.0f} s", flush=True)
    return summary


def main() -> None:
    """Console script `scalerl-train`."""
    import hydra

    from scalerl_mega.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def _entry(cfg) -> None:
        run(cfg)

    _entry()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
