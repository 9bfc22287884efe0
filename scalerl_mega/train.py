"""`scalerl-train`: the Hydra entry point (build components from config, run).

    scalerl-train experiment=demo                 # CPU embedded default (`make demo`)
    scalerl-train --cfg job experiment=scalerl    # print the resolved ScaleRL config
    scalerl-train --validate experiment=scalerl   # every check the run makes before its first step, then exit
    scalerl-train -m experiment=loo_dapo,loo_plan hydra/launcher=submitit_slurm

The config lives in `conf/` at the repository root (shipped in the wheel as `scalerl_mega/conf/`);
`scalerl_mega/config/` holds its typed schema and `scalerl_mega/compose.py` the one way it is composed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl_mega.conf_path import conf_dir
from scalerl_mega.sft import fingerprint_diff  # noqa: F401 (tests import it from here too)

CONF_DIR = conf_dir()

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.build import Task
    from scalerl_mega.config import ForecastConfig, TrainConfig
    from scalerl_mega.interfaces import LoopComponents, PolicyTrainer
    from scalerl_mega.loop import LoopState
    from scalerl_mega.preemption import Preemption
    from scalerl_mega.scaling.forecast import Forecast
    from scalerl_mega.trainer.ranks import ControlChannel


def run_config(config: TrainConfig) -> dict[str, Any]:
    """A validated config: the dry run (`dry_run=true`: layout and memory on one CPU, then exit;
    scalerl_mega/dry_run.py) or the job."""
    if config.dry_run:
        from scalerl_mega.dry_run import run_and_exit

        run_and_exit(config)
    return run_job(config)


class AutoBudgetForecaster:
    """The live forecast of `forecast.*`: no fit before `min_points` validations, then a refit at
    every validation (paper Eq. 1, Sec. 5); budget 0 means this run's own budget, the compute at step
    `total_steps` extrapolated from the compute per step so far (twice the compute so far where the step is not
    given). The cut and the identification rule are `scaling.identify`'s (the same as `scalerl-fit` and
    report.md); the forecast carries the 95% band at the budget and at twice it (`scaling.band`)."""

    def __init__(self, fc_cfg: ForecastConfig, *, gpu_hours: bool = False, total_steps: int = 0) -> None:
        from scalerl_mega.scaling.forecast import LiveForecaster

        self.cfg = fc_cfg
        self.total_steps = int(total_steps)
        self.unit = "GPU-hours" if gpu_hours else "device-hours"
        self.live = LiveForecaster(budget=float(fc_cfg.budget) or 1.0, every=1,
                                   fit_from=float(fc_cfg.fit_from) or None, cut_fraction=float(fc_cfg.cut_fraction),
                                   gpu_hours=gpu_hours)

    def add(self, compute: float, reward: float, n_samples: float | None = None, *,
            step: float | None = None) -> Forecast | None:
        if not self.cfg.budget:
            per_step = compute / step if step and self.total_steps else None
            self.live.budget = max(per_step * self.total_steps if per_step else 2.0 * compute, compute, 1e-12)
        if len(self.live.compute) + 1 < self.cfg.min_points:
            self.live.record(compute, reward, n_samples)
            return None
        return self.live.add(compute, reward, n_samples)


def _process_setup(config: TrainConfig) -> int:
    """Logging, torch threads and the launcher watch of this trainer process; returns the world size
    (checked against `cluster.trainer_devices`)."""
    import logging

    from scalerl_mega.config.machine import check_world_size
    from scalerl_mega.preemption import watch_parent

    logging.getLogger("megatron").setLevel(logging.WARNING)  # per-parameter DDP / optimizer dumps
    _quiet_megatron_imports(cpu=config.cluster.device == "cpu")
    if config.cluster.trainer_threads:
        import torch

        torch.set_num_threads(config.cluster.trainer_threads)
    world = check_world_size(config)  # also run by --validate (config.validate_machine)
    if world > 1:  # a rank whose launcher (torchrun agent, srun) is gone exits (trainer/ranks.py "Failure")
        watch_parent(os.getppid(), name=f"trainer rank {os.environ.get('RANK', '?')}", every_s=1.0)
    return world


MEGATRON_IMPORT_WARNINGS = (r"(Transformer Engine|Apex) (and Apex )?(is|are) not installed", r"full scope is deprecated")
"""UserWarnings Megatron-Core emits while it is imported, about nothing the run chose: on a CPU (no Transformer
Engine or Apex there) and its own default `cuda_graph_scope` (megatron-core 0.16). Hidden from the console."""


def _quiet_megatron_imports(*, cpu: bool) -> None:
    import warnings

    for i, pattern in enumerate(MEGATRON_IMPORT_WARNINGS):
        if cpu or i > 0:
            warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


def run_job(config: TrainConfig) -> dict[str, Any]:
    """Build the components, SFT warm start (fresh runs only), RL (resuming if a checkpoint exists),
    then report.md + scaling.png in `output_dir`. Returns a summary dict.

    Under a multi-rank launch (torchrun / srun: WORLD_SIZE > 1) every rank builds its shard of the
    trainer and takes the warm start in lock step; then global rank 0 (the controller) alone builds
    the engines, rewards, curriculum and metrics and runs the loop, while the other ranks serve its
    trainer calls (`trainer/ranks.py`). Followers return a short summary
    and write nothing.
    """
    import logging
    import time

    from scalerl_mega import build
    from scalerl_mega.loop import latest_checkpoint
    from scalerl_mega.preemption import Preemption
    from scalerl_mega.run_dir import config_errors
    from scalerl_mega.trainer.ranks import ControlChannel, ControllerTrainer, serve

    log = logging.getLogger("scalerl_mega.train")
    with config_errors():  # a set-up error is a config error: one line, exit 2 (run_dir.py)
        world = _process_setup(config)
    t_start = time.monotonic()
    out = Path(config.output_dir)
    finished = _finished_run(config, out=out)
    if finished is not None:
        return finished
    with config_errors():
        task = pre_step_checks(config)
        trainer = build.build_trainer(config)
    channel = ControlChannel(timeout_s=config.train.follower_timeout_s) if world > 1 else None
    controller = channel is None or channel.is_controller
    if controller:
        out.mkdir(parents=True, exist_ok=True)
        log.info("trainer built (Megatron-Core, %d rank(s)) %.0f s after the start", world, time.monotonic() - t_start)
    engine = reward_fn = None
    summary: dict[str, Any] = {"output_dir": str(out)}
    preemption = Preemption().install(grace_s=config.train.sigterm_grace_s)
    try:
        resumed = latest_checkpoint(config) is not None
        if channel is not None:  # the controller's view of the run directory decides for every rank
            resumed = channel.share(resumed)
        t0 = time.monotonic()
        with config_errors():
            if config.init_from_hf and (not resumed or config.peft.kind == "lora"):  # an adapter checkpoint
                build.init_trainer_from_hf(trainer, config)  # holds no base: it is loaded again on resume
            if config.sft.steps and not resumed:
                _warm_start_or_load(config, task, trainer, out=out if controller else None, channel=channel)
        summary["sft_s"] = time.monotonic() - t0
        rank_sync = build.build_rank_sync(config, trainer, world_size=world)
        if not controller:
            preemption.armed = True  # a stop request waits for the controller's (collective) checkpoint
            steps = serve(trainer, channel, sync=rank_sync)
            return {"rank": channel.rank, "steps": steps, "sft_s": summary["sft_s"],
                    "exit_status": preemption.exit_status if preemption.requested else 0}
        handle = ControllerTrainer(trainer, channel, sync=rank_sync) if channel is not None else trainer
        t0 = time.monotonic()
        with config_errors():
            engine = build.build_engine(config, task, handle)
            reward_fn = build.build_reward_fn(config)
            comps = build.build_components(config, task=task, trainer=handle, engine=engine, reward_fn=reward_fn,
                                           sync_weights=handle.sync_weights if rank_sync is not None else None)
        summary["engine_start_s"] = time.monotonic() - t0
        log.info("%d %s engine(s) ready in %.0f s", config.rollout.num_engines, config.rollout.name,
                 summary["engine_start_s"])
        state = _run_rl(config, comps, summary, out=out, world=world, preemption=preemption, started=t_start)
        if channel is not None:
            handle.stop_followers()
    finally:
        for thing in (engine, reward_fn):
            if thing is not None:
                thing.close()
        trainer.close()
        preemption.uninstall()
    summary["wall_s"] = time.monotonic() - t_start
    return _finish(config, summary, out=out, resumed=resumed, steps=state.step, world=world)


def _run_rl(config: TrainConfig, comps: LoopComponents, summary: dict[str, Any], *, out: Path, world: int,
            preemption: Preemption, started: float) -> LoopState:
    """The RL phase of `run_job` on the controller: compute counter, live forecast, provenance segment, the loop
    (a stop request checkpointed at its next safe point from here on); fills `summary`, returns the LoopState."""
    import time

    from scalerl_mega import build
    from scalerl_mega.loop import run_rl
    from scalerl_mega.metrics.compute import ComputeCounter
    from scalerl_mega.metrics.provenance import finish_segment

    compute = ComputeCounter(devices=build.allocation_devices(config, world_size=world),
                             on_gpu=config.cluster.device == "cuda")
    forecaster = (AutoBudgetForecaster(config.forecast, gpu_hours=config.cluster.device == "cuda",
                                       total_steps=config.train.steps) if config.forecast.enabled else None)
    t0 = time.monotonic()

    def on_start(from_step: int) -> None:  # the step the loop actually loaded (0 for a fresh run)
        summary["from_step"] = _start_segment(config, out=out, from_step=from_step)

    preemption.armed = True
    state = run_rl(config, comps, compute=compute, forecaster=forecaster,
                   stop_requested=lambda: preemption.requested, started=started, on_start=on_start)
    summary["rl_s"] = time.monotonic() - t0
    finish_segment(out, to_step=state.step, wall_s=summary["rl_s"], preempted=state.preempted)
    summary.update(steps=state.step, preempted=state.preempted, val_points=[list(p) for p in state.val_points],
                   stop_signal=preemption.signal if state.preempted else None,
                   exit_status=preemption.exit_status if state.preempted else 0)
    return state


def _finished_run(config: TrainConfig, *, out: Path) -> dict[str, Any] | None:
    """A rerun of a finished run (its newest checkpoint at `train.steps` or beyond, its summary.json written):
    the saved summary, untouched (report.md and summary.json keep the timings of the launches that trained; issue
    49), after one line saying so. None when there is something to train."""
    import json
    import logging

    from scalerl_mega.loop import latest_checkpoint
    from scalerl_mega.trainer.megatron.checkpoint import loadable_step

    ckpt = latest_checkpoint(config)
    step = loadable_step(ckpt) if ckpt is not None else None  # what a resume would load, not `latest`'s step
    path = out / "summary.json"
    if step is None or step < config.train.steps or not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        return None
    if int(os.environ.get("RANK", "0")) == 0:
        logging.getLogger("scalerl_mega.train").info(
            "%s already finished at step %d (train.steps=%d): nothing to train; report.md and summary.json kept "
            "(raise train.steps to train on, or resume=never to start over)", out, step, config.train.steps)
    return {**summary, "exit_status": 0}


def launch_timings(previous: dict[str, Any] | None, this: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's launches so far: those of its previous summary.json (`launches`; a summary from before they were
    recorded counts as one launch) and `this` one ({"wall_s", "sft_s", "rl_s", "steps": [from, to], "preempted"})."""
    prev = list((previous or {}).get("launches") or [])
    if previous and not prev and "wall_s" in previous:
        prev = [{k: previous.get(k) for k in ("wall_s", "sft_s", "rl_s")} | {"steps": [None, previous.get("steps")]}]
    return [*prev, this]


def _start_segment(config: TrainConfig, *, out: Path, from_step: int) -> int:
    """Record which code trains this launch's steps (metrics/provenance.py): the run's `provenance.jsonl` gains a
    segment from `from_step`, the step the loop loaded (0 for a fresh run), which is returned."""
    import shlex
    from importlib.metadata import PackageNotFoundError, version

    from scalerl_mega.metrics.provenance import start_segment

    try:
        ver = version("scalerl-mega")
    except PackageNotFoundError:
        ver = None
    start_segment(out, from_step=from_step, version=ver,
                  command=" ".join(["scalerl-train", *map(shlex.quote, sys.argv[1:])]))
    return from_step


def _finish(config: TrainConfig, summary: dict[str, Any], *, out: Path, resumed: bool, steps: int,
            world: int) -> dict[str, Any]:
    """The controller's end of a job: report.md + scaling.png, summary.json and the closing log line. Timings are
    the sums over the run's launches (`launch_timings`: a resumed run adds this launch's to the saved ones)."""
    import json
    import logging

    from scalerl_mega.report import write_report

    log = logging.getLogger("scalerl_mega.train")
    if summary.get("val_points"):
        summary["first_val_pass_rate"] = summary["val_points"][0][2]
        summary["last_val_pass_rate"] = summary["val_points"][-1][2]
    previous = None
    if resumed and (out / "summary.json").is_file():
        try:
            previous = json.loads((out / "summary.json").read_text())
        except ValueError:
            previous = None
    this = {k: summary[k] for k in ("wall_s", "sft_s", "rl_s")}
    launches = launch_timings(previous, {**this, "steps": [summary.pop("from_step", 0), steps],
                                         "preempted": bool(summary.get("preempted"))})
    for k in this:
        summary[k] = sum(float(x.get(k) or 0.0) for x in launches)
    summary["launches"] = launches
    over = f", {len(launches)} launches" if len(launches) > 1 else ""
    report = write_report(out, title=f"{config.run_name} (seed {config.seed})", extra={
        f"wall time (setup excluded{over})": f"{summary['wall_s']:.0f} s",
        "SFT warm start": f"{summary['sft_s']:.0f} s ({config.sft.steps} steps)",
        "RL": f"{summary['rl_s']:.0f} s ({steps} steps)",
        "trainer ranks": str(world),
    }, cut_fraction=float(config.forecast.cut_fraction), fit_from=float(config.forecast.fit_from) or None,
        quantization=str(config.rollout.quantization), is_correction=str(config.loss.is_correction))
    summary["report"] = str(report)
    summary["trainer_ranks"] = world
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    log.info("report: %s", report)
    if "first_val_pass_rate" in summary:
        log.info("validation pass rate: first %.3f -> last %.3f; wall %.0f s", summary["first_val_pass_rate"],
                 summary["last_val_pass_rate"], summary["wall_s"])
    if summary.get("preempted"):
        what = "interrupted" if summary.get("stop_signal") == "SIGINT" else "preempted"
        print(f"{what}: checkpoint saved at step {steps}; rerun the same command to resume", flush=True)
    return summary


SFT_FINGERPRINT = "sft_fingerprint.json"


SFT_NUMERICS_ONLY = ("micro_batch_tokens",)
"""Fingerprint keys that change only the summation order of the warm start's maths: a shared warm start written
with another value is loaded (logged), so e.g. a same-maths control that micro-batches its RL steps
(the reproduction's batch control of 7ab7997) starts from the very weights of its reference."""


def sft_fingerprint(config: TrainConfig) -> dict[str, Any]:
    """What the warm-started weights depend on (JSON-normalised): seed, model, data (the SFT examples
    and the held-out split), optim (SFT swaps only lr and warmup), the sft schedule, params dtype and
    micro-batching. Recipe groups used only by RL (loss, filter, curriculum, ...) are left out, so
    the recipes of a leave-one-out sweep share one warm start per seed. `model.fp32_lm_head` counts
    only for 16-bit params: an FP32 model's head is FP32 either way (`models.head_dtype`)."""
    import json
    from dataclasses import asdict

    model = asdict(config.model)
    if config.precision.params_dtype == "float32":
        model.pop("fp32_lm_head", None)
    sft = {k: v for k, v in asdict(config.sft).items()
           if k not in ("checkpoint", "eval_every", "any_seed", "synthetic_num_prompts")}
    fp = {"seed": int(config.seed), "model": model, "data": asdict(_warm_start_data(config)),
          "optim": asdict(config.optim), "sft": sft, "params_dtype": config.precision.params_dtype,
          "micro_batch_tokens": int(config.train.micro_batch_tokens)}
    return json.loads(json.dumps(fp, default=str))


def _warm_start_data(config: TrainConfig) -> Any:
    """The data config the warm start trains on: this run's, with `sft.synthetic_num_prompts` (when set) as its
    synthetic prompt count."""
    import dataclasses

    n = int(config.sft.synthetic_num_prompts)
    return dataclasses.replace(config.data, synthetic_num_prompts=n) if n else config.data


def warm_start_task(config: TrainConfig, task: Task, *, announce: bool = True) -> Task:
    """The task whose training prompts the warm start uses: `task` itself, or with `sft.synthetic_num_prompts`
    the synthetic set of that many prompts, after checking that none of `task`'s held-out prompts (compared
    by text: what the model sees) is among its training prompts (ValueError naming the key and an example).

    With the synthetic task's prefix-stable draws (`arith.sample_problems`) and a held-out set of the smallest
    hashes (`split.held_out_split`), a held-out prompt of the larger set that lies in the smaller one is held
    out there too, so no leak is expected; the check builds both sets rather than relying on that."""
    import dataclasses
    import logging

    from scalerl_mega.build import build_task

    if not int(config.sft.synthetic_num_prompts):
        return task
    small = build_task(dataclasses.replace(config, data=_warm_start_data(config)))
    seen = {p.text for p in small.train_prompts}
    leaked = [p.text for p in task.val_prompts if p.text in seen]
    if leaked:
        raise ValueError(f"sft.synthetic_num_prompts={config.sft.synthetic_num_prompts}: {len(leaked)} of this run's "
                         f"{len(task.val_prompts)} held-out prompts are training prompts of the warm start's set, "
                         f"e.g. {leaked[0]!r}")
    held = {p.text for p in small.val_prompts}
    if announce:
        logging.getLogger("scalerl_mega.train").info(
            "sft: warm start on the %d training prompts of data.synthetic_num_prompts=%d (sft.synthetic_num_prompts); "
            "none of this run's %d held-out prompts among them (%d held out there too)", len(small.train_prompts),
            config.sft.synthetic_num_prompts, len(task.val_prompts), sum(p.text in held for p in task.val_prompts))
    return small


def sft_checkpoint_diff(config: TrainConfig, theirs: dict[str, Any], mine: dict[str, Any], *,
                        numerics: bool = False) -> list[str]:
    """The fingerprint keys in which the shared warm start `theirs` differs from this run's (`mine`), the seed not
    counted under `sft.any_seed`: those that change the maths, or with `numerics` those that change only the
    summation order (`SFT_NUMERICS_ONLY`)."""
    diff = [k for k in fingerprint_diff(theirs, mine) if not (k == "seed" and config.sft.any_seed)]
    return [k for k in diff if (k in SFT_NUMERICS_ONLY) == numerics]


def check_sft_checkpoint(config: TrainConfig, *, theirs: dict[str, Any] | None = None) -> None:
    """`sft.checkpoint` holding a complete warm start written with other settings (its fingerprint `theirs`, read
    from there when not given) is refused, naming the keys: loading it would start RL from other weights."""
    import json

    from scalerl_mega.trainer.megatron.checkpoint import latest_step

    root = Path(str(config.sft.checkpoint))
    if theirs is None:
        if not (config.sft.checkpoint and latest_step(root) is not None and (root / SFT_FINGERPRINT).is_file()):
            return
        theirs = json.loads((root / SFT_FINGERPRINT).read_text())
    diff = sft_checkpoint_diff(config, theirs, sft_fingerprint(config))
    if diff:
        raise ValueError(f"sft.checkpoint={config.sft.checkpoint!r} was written by a warm start with other "
                         f"settings: {', '.join(diff)} differ (delete it or point sft.checkpoint elsewhere)")


def _warm_start_or_load(config: TrainConfig, task: Task, trainer: PolicyTrainer, *, out: Path | None,
                        channel: ControlChannel | None) -> None:
    """The warm start, or with `sft.checkpoint` set: load it from there when a complete checkpoint
    with a matching fingerprint exists (a mismatch is an error naming the differing keys), else run
    it and save it there (fingerprint first, then the checkpoint: only a complete save counts). The
    loaded weights get a fresh optimizer, as after a warm start (`sft.warm_start`)."""
    import json
    import logging

    from scalerl_mega.trainer.megatron.checkpoint import latest_step

    log = logging.getLogger("scalerl_mega.train")
    task = warm_start_task(config, task)
    if not config.sft.checkpoint:
        _warm_start(config, task, trainer, out=out)
        return
    root = Path(config.sft.checkpoint)
    fp_path = root / SFT_FINGERPRINT
    mine = sft_fingerprint(config)
    ready = root.is_dir() and latest_step(root) is not None and fp_path.is_file()
    if channel is not None:  # the controller's view of the directory decides for every rank
        ready = channel.share(ready)
    if ready:
        theirs = json.loads(fp_path.read_text())
        for k in sft_checkpoint_diff(config, theirs, mine, numerics=True):  # same maths, another summation order
            log.info("sft: the shared warm start was written with %s=%s, this run has %s: same maths, loaded",
                     k, theirs.get(k), mine.get(k))
        check_sft_checkpoint(config, theirs=theirs)
        trainer.load(str(root))
        trainer.reset_optimizer()
        log.info("sft: loaded the shared warm start from %s (%d steps of seed %s not rerun)", root, config.sft.steps,
                 theirs.get("seed"))
        return
    _warm_start(config, task, trainer, out=out)
    if out is not None:
        root.mkdir(parents=True, exist_ok=True)
        tmp = fp_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
        tmp.replace(fp_path)
    trainer.save(str(root))
    log.info("sft: saved the warm start to %s", root)


def _warm_start(config: TrainConfig, task: Task, trainer: PolicyTrainer, *, out: Path | None) -> None:
    """SFT warm start on every rank in lock step (identical batches: same examples, same seed); only
    the controller (`out` given) logs to sft.jsonl and the console."""
    import json
    import logging

    from scalerl_mega import sft
    from scalerl_mega.data.tasks.arith import sft_token_ids
    from scalerl_mega.episodes.demonstrations import warm_start_examples

    examples = warm_start_examples(config, task)  # an environment's protocol traces (env=custom), if it shows them
    if examples is None:
        examples = [sft_token_ids(task.tokenizer, p) for p in task.train_prompts]
    kwargs = dict(steps=config.sft.steps, batch_size=config.sft.batch_size, lr=config.sft.lr,
                  warmup_steps=config.sft.warmup_steps, seed=int(config.seed))
    if out is None:
        sft.warm_start(trainer, examples, **kwargs)
        return
    logging.getLogger("scalerl_mega.train").info("sft: warm start, %d steps of batch %d on %d examples",
                                                 config.sft.steps, config.sft.batch_size, len(examples))
    with open(out / "sft.jsonl", "w", buffering=1) as f:
        def log_sft(step: int, m: dict) -> None:
            f.write(json.dumps({"step": step, **m}) + "\n")
            if step % max(config.sft.eval_every, 1) == 0 or step == config.sft.steps:
                logging.getLogger("scalerl_mega.train").info("sft step %d/%d: loss %.4f", step, config.sft.steps,
                                                             m["loss"])

        sft.warm_start(trainer, examples, on_step=log_sft, **kwargs)


def pre_step_checks(config: TrainConfig) -> Task | None:
    """Every check of the run's start that needs no model and no process, in the order the run meets them: the
    trainer ranks, the installed backends, the task (its prompts within the length budget), the curriculum, the
    engine settings, the episodes' target and chat template, and for a fresh warm start its prompt set and shared
    checkpoint. What `--validate` runs after the compose-time checks, and what the run runs before it builds its
    trainer. Returns the run's task (None for a dry run, which builds none)."""
    from scalerl_mega import build
    from scalerl_mega.config.machine import check_world_size
    from scalerl_mega.episodes.checks import check_episodes
    from scalerl_mega.loop import latest_checkpoint
    from scalerl_mega.preflight import check_backends, check_engine_settings
    from scalerl_mega.sft import check_sft_batch

    check_world_size(config)
    if config.dry_run:
        return None
    check_backends(config)
    task = build.build_task(config)
    build.build_sampler(config, task)
    check_engine_settings(config, task)
    check_episodes(config.env, task.tokenizer, stop_token_ids=task.stop_token_ids)
    if config.sft.steps and latest_checkpoint(config) is None:
        check_sft_batch(config.sft.batch_size, num_examples=len(warm_start_task(config, task, announce=False)
                                                                .train_prompts))
        check_sft_checkpoint(config)
    return task


def validate_or_exit(node: Any) -> None:
    """`scalerl-train --validate`: the compose-time and run-directory checks (`run_dir.config_or_exit`), then
    `pre_step_checks`; one `config OK: ...` line (after the checks' warnings), or the run's one `config error:`
    line and exit status 2."""
    from scalerl_mega.run_dir import config_errors, config_ok_line, config_or_exit

    import logging
    import logging.handlers

    config = config_or_exit(node, validate_only=True)
    held = logging.handlers.BufferingHandler(capacity=1 << 20)  # warnings of the checks: after the verdict, if OK
    held.setLevel(logging.WARNING)
    logging.getLogger().addHandler(held)
    try:
        with config_errors():
            pre_step_checks(config)
    finally:
        logging.getLogger().removeHandler(held)
    for record in held.buffer:
        print(f"warning: {record.getMessage()}", file=sys.stderr, flush=True)
    print(config_ok_line(config), flush=True)


def _with_recorded_run(argv: list[str]) -> list[str]:
    """`argv` with the overrides a tiny checkpoint records beside itself (`init_from_hf`'s scalerl_run.json),
    said in one line; an unreadable file: one `config error:` line, exit 2."""
    from scalerl_mega.model.tiny_run import RUN_FILE, with_recorded

    try:
        argv, added = with_recorded(argv)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    if added:
        print(f"init_from_hf is a tiny checkpoint for the synthetic task on CPU: adding its {RUN_FILE}'s "
              f"{' '.join(added)} (the command line's own keys win)", flush=True)
    return argv


def main() -> None:
    """Console script `scalerl-train`."""
    import hydra

    from scalerl_mega.config import register_configs

    from scalerl_mega.compose import compose_run_node
    from scalerl_mega.config.output_dir import follow_output_dir
    from scalerl_mega.run_dir import config_error_exit, config_or_exit, precheck_overrides

    register_configs()
    sys.argv[1:] = _with_recorded_run(sys.argv[1:])  # a tiny checkpoint's own settings (model/tiny_run.py)
    precheck_overrides(sys.argv[1:])  # a bad override or a misspelled name: one line, exit 2
    validate_only = "--validate" in sys.argv[1:]  # every check the run makes before its first step, then exit
    argv = [a for a in sys.argv[1:] if a != "--validate"]
    try:
        argv = follow_output_dir(argv)  # output_dir=X: train.log and .hydra/ go to X as well
    except ValueError as exc:
        config_error_exit(exc)
    if validate_only and not any(a.startswith("-") for a in argv):
        # composed as Hydra composes the run, with the run's folder as output_dir; Hydra's job (which creates that
        # folder, its train.log and .hydra/) never starts, so --validate writes nothing
        validate_or_exit(compose_run_node(argv))
        return
    sys.argv[1:] = argv

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def _entry(cfg) -> None:
        if validate_only:  # `--validate -m`: each point of the sweep
            validate_or_exit(cfg)
            return
        config = config_or_exit(cfg)  # config errors: one line, exit 2
        status = run_config(config).get("exit_status", 0)
        if status:
            sys.exit(status)  # 130: stopped by Ctrl-C after its checkpoint

    try:
        _entry()
    except KeyboardInterrupt:  # Ctrl-C before the RL loop could checkpoint (preemption.Preemption)
        print("interrupted (Ctrl-C) before the RL loop started: nothing saved by this launch; rerun the same "
              "command to start again", file=sys.stderr, flush=True)
        sys.exit(128 + 2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
