"""The RL loop, top to bottom: PipelineRL-k and PPO-off-policy-k (paper Sec. 3.1).

One trainer step s (the policy has weight version s):

1. admit prompts.
   PipelineRL-k: keep at most (k + 1) * B prompts admitted but not yet trained on; the engines stream
   them continuously. PPO-off-policy-k: when nothing is outstanding, admit k * B prompts at once.
2. wait for the B oldest admitted groups to finish (G completions each); the time spent here is the
   trainer's idle time. PPO-off-policy-k (paper Sec. 3.1, strict phases by default): wait for all
   k * B groups of the phase, so the k steps run with the generators idle (`off_policy.overlap=true`:
   only the B oldest, training overlaps the rest of the phase's generation). Groups are consumed in admission order, so with the (k + 1) * B admission
   bound a prompt admitted at version a is trained on at step <= a + k: the staleness bound holds by
   construction and is asserted every step. When the trainer is k steps ahead it therefore waits.
3. score (reward pool), update the curriculum's pass-rate history, apply the length penalty if chosen.
4. batch: zero-variance filter, advantages, aggregation weights, packing (batch.py).
5. optimizer step (Megatron trainer; CISPO/DAPO/GRPO/GSPO via objective.losses).
6. weight sync. PipelineRL: after every step the new weights go to the engines, which apply them
   between decode steps (in-flight, stale KV kept). PPO-off-policy: after every k-th step.
7. metrics line, progress line, truncation alarm, log-prob mismatch guard (`metrics.max_logprob_mismatch`,
   before the step can be checkpointed); every `val_every` steps validation on held-out
   prompts (same engines, always on the trainer's current weights: PPO-off-policy pushes them first
   when they are not in sync, after the phase's generation has finished) and the live scaling
   forecast; every `save_every` steps a checkpoint. `train.val_mode=window` spreads each validation over the
   `val_every` steps before it instead: one slice of the held-out prompts is submitted at the start of each step
   on that step's weights, and the point (recorded at the window's end, drawn at its centre's compute) covers
   them all (heldout.py, metrics/val_window.py); a checkpoint scores the window's slices so far, so a
   resumed run continues the window. A stop (SIGTERM) between checkpoints loses the window's slices in flight:
   the resumed run generates them again first, on the checkpoint's weights (`val_version_mean` shows it); a stop
   that interrupts a step's validation also leaves `val_due` in the checkpoint, and the resumed run records
   that point before its next step, so no point is lost and none mixes two windows.

Resume (`resume=auto`): the checkpoint holds model + optimizer (trainer), curriculum state (data order,
pass-rate history), the prompts admitted but not yet trained on (in admission order), RNG states,
step, compute counter and weight version. On restart those prompts are re-admitted first, so the
sequence of prompts trained on is the same as in an uninterrupted run.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl_mega.batch import BatchResult, build_train_batch
from scalerl_mega.interfaces import Forecaster, LoopComponents, RolloutEngine
from scalerl_mega.metrics.alarms import MismatchGuard, TruncationAlarm
from scalerl_mega.metrics.calibration import GEN_STAT_KEYS, calibration_fields, engine_decode_stats
from scalerl_mega.metrics.compute import ComputeCounter, gpu_utilization
from scalerl_mega.metrics.progress import ProgressClock, progress_line
from scalerl_mega.metrics.untrained import UNTRAINED_KEY, no_training_warning, untrained_step_line
from scalerl_mega.metrics.rollout_stats import rollout_metrics, staleness_histogram, tokens_per_version
from scalerl_mega.metrics.val_window import center_step, val_metrics, window_slice
from scalerl_mega.metrics.writer import MetricsWriter
from scalerl_mega.weight_sync.multi import single_sender_metrics
from scalerl_mega.scaling.forecast import plain_line
from scalerl_mega.inflight import Preempted, _Pending, _Router, reward_error_metrics, sampling_params, score_groups
from scalerl_mega.types import Group, Prompt
from scalerl_mega.heldout import HeldoutSpec, collect, submit, submit_window_slice, validate

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig

log = logging.getLogger("scalerl_mega.loop")


@dataclass(kw_only=True)
class LoopState:
    """What a checkpoint stores besides the trainer's model and optimizer."""

    step: int = 0
    weight_version: int = 0
    admitted: int = 0
    trained_prompt_ids: list[str] = field(default_factory=list)
    val_points: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, compute, val_pass_rate) of each validation (window mode: compute at the window's centre)."""
    val_window: list[list] = field(default_factory=list)
    """`train.val_mode=window`: outcomes scored so far in the current window (metrics/val_window.py)."""
    val_center: dict[str, float] | None = None
    """Window mode: the compute fields at the current window's centre step, once it is reached."""
    val_due: bool = False
    """A stop interrupted the validation of `step` (trained and logged): the resumed run records that point
    before its next step."""
    preempted: bool = False
    """This launch stopped early on SIGTERM / Ctrl-C after checkpointing (not saved: reset on resume)."""


# ----------------------------------------------------------------------------- weights
def push_weights(comps: LoopComponents, *, version: int, full: bool = False) -> dict[str, float]:
    """Trainer -> engines (HF-named tensors): one sender, or every stage's sender (`comps.sync_weights`);
    returns the `sync/*` metrics (`sync/seconds`: seconds spent). With `comps.adapter_sync` (peft=lora) the LoRA
    adapter alone, preceded by the base weights when `full` (the loop's first push: the engines start from their
    own initialisation)."""
    t0 = time.monotonic()
    if comps.adapter_sync:
        if full:
            push_weights(replace(comps, adapter_sync=False), version=version)
        dtype = comps.weight_dtype.split("+")[0] if comps.weight_dtype else None  # "bfloat16+fp32_head": no head here
        config, tensors = comps.trainer.export_adapter(dtype=dtype)
        comps.engine.update_adapter(config, tensors, version=version)
        return single_sender_metrics(getattr(comps.engine, "last_sync_stats", None), seconds=time.monotonic() - t0)
    if comps.sync_weights is not None:
        out = comps.sync_weights(comps.engine, version=version, dtype=comps.weight_dtype)
        return {**out, "sync/seconds": time.monotonic() - t0}
    comps.engine.update_weights(comps.trainer.export_hf_weights(dtype=comps.weight_dtype), version=version)
    return single_sender_metrics(getattr(comps.engine, "last_sync_stats", None), seconds=time.monotonic() - t0)


# ----------------------------------------------------------------------------- checkpoints
def _ckpt_root(cfg: TrainConfig) -> Path:
    return Path(cfg.output_dir) / "checkpoints"


def latest_checkpoint(cfg: TrainConfig) -> Path | None:
    """resume=auto: <output_dir>/checkpoints if a checkpoint was written there, else None;
    resume=never: None; otherwise the given path (which must exist). The trainer's `load` picks the
    newest complete checkpoint under the directory."""
    if cfg.resume == "never":
        return None
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        if not path.exists():
            raise ValueError(f"resume={cfg.resume!r}: no such checkpoint directory")
        return path
    root = _ckpt_root(cfg)
    return root if root.is_dir() and any(not p.name.startswith(".tmp-") for p in root.iterdir()) else None


def save_state(comps: LoopComponents, cfg: TrainConfig, *, state: LoopState, outstanding: Sequence[_Pending],
               compute: ComputeCounter, rng: random.Random) -> None:
    import numpy as np

    extra = {
        "loop": asdict(state),
        "sampler": comps.sampler.state_dict(),
        "outstanding": [_prompt_dict(p.prompt) for p in outstanding],
        "compute": compute.state_dict(),
        "python_rng": rng.getstate(),
        "numpy_rng": np.random.get_state(),
    }
    # named by the loop's step: the trainer's optimizer-step count lags it when a step's groups were all filtered
    comps.trainer.save(str(_ckpt_root(cfg)), step=state.step, extra_state=extra)
    from scalerl_mega.trainer.megatron.checkpoint import prune_checkpoints

    prune_checkpoints(_ckpt_root(cfg), keep=int(cfg.train.keep_checkpoints))


def _prompt_dict(p: Prompt) -> dict[str, Any]:
    return {"prompt_id": p.prompt_id, "text": p.text, "task": p.task, "gold": p.gold,
            "token_ids": p.token_ids, "meta": dict(p.meta), "row": None if p.row is None else dict(p.row)}


# ----------------------------------------------------------------------------- the loop
def run_rl(cfg: TrainConfig, comps: LoopComponents, *, compute: ComputeCounter, forecaster: Forecaster | None = None,
           on_step: Callable[[int, dict], None] | None = None,
           stop_requested: Callable[[], bool] | None = None, started: float | None = None,
           on_start: Callable[[int], None] | None = None) -> LoopState:
    """Run RL to `cfg.train.steps` (resuming if a checkpoint exists); metrics go to
    <output_dir>/metrics.jsonl. Returns the final LoopState.

    `stop_requested` (SIGTERM / Ctrl-C, scalerl_mega/preemption.py) is polled at the safe points: while waiting
    for generations or validation, and after each step. When it is true the loop saves a checkpoint
    (the prompts admitted but not trained are re-admitted on resume; their partial generations are
    regenerated) and returns with `state.preempted` set. `started` (`time.monotonic()` at the launch's start)
    is the origin of the progress lines' elapsed time. `on_start(step)` is called once before the first step
    with the step the checkpoint actually loaded held (after a damaged newest checkpoint, the previous one's;
    0 for a fresh run): provenance records it (train.py)."""
    G = cfg.train.generations_per_prompt
    rng = random.Random(cfg.seed)
    state = LoopState()
    router = _Router(comps.engine, group_size=G, poll_timeout_s=cfg.train.poll_timeout_s,
                     stall_timeout_s=cfg.rollout.stall_timeout_s, stop_requested=stop_requested)
    alarm = TruncationAlarm(cfg.metrics.truncation_alarm)
    guard = MismatchGuard(cfg.metrics.max_logprob_mismatch, cfg.metrics.mismatch_mode)
    readmit: list[Prompt] = []

    # --- resume
    ckpt = latest_checkpoint(cfg)
    if ckpt is not None:
        extra = comps.trainer.load(str(ckpt))
        state = LoopState(**{**extra["loop"], "preempted": False})
        comps.sampler.load_state_dict(extra["sampler"])
        compute.load_state_dict(extra["compute"])
        rng.setstate(_as_rng_state(extra["python_rng"]))
        readmit = [Prompt(**d) for d in extra["outstanding"]]
        if forecaster is not None:
            n_val = len(comps.val_prompts) * cfg.data.val_samples  # what `validate` recorded per point
            for step, c, r in state.val_points:
                forecaster.add(c, r, n_val, step=step)
        log.info("resumed from %s at step %d (%d prompts re-admitted)", ckpt, state.step, len(readmit))
    if on_start is not None:
        on_start(state.step)
    from scalerl_mega.metrics.loggers import build_loggers

    writer = MetricsWriter(cfg.output_dir, tensorboard=cfg.metrics.tensorboard,
                           resume_step=state.step if ckpt is not None else None, loggers=build_loggers(cfg))
    try:
        progress = ProgressClock(first_step=state.step, started=started)
        return _loop(cfg, comps, state=state, router=router, readmit=readmit, rng=rng, writer=writer,
                     compute=compute, forecaster=forecaster, alarm=alarm, guard=guard, on_step=on_step,
                     progress=progress)
    except Preempted:
        save_state(comps, cfg, state=state, outstanding=list(router.queue), compute=compute, rng=rng)
        state.preempted = True
        log.warning("stopped at step %d on request (SIGTERM / Ctrl-C) after saving a checkpoint", state.step)
        return state
    finally:
        writer.close()


def _loop(cfg: TrainConfig, comps: LoopComponents, *, state: LoopState, router: _Router, readmit: list[Prompt],
          rng: random.Random, writer: MetricsWriter, compute: ComputeCounter,
          forecaster: Forecaster | None, alarm: TruncationAlarm, guard: MismatchGuard,
          on_step: Callable[[int, dict], None] | None, progress: ProgressClock) -> LoopState:
    k = cfg.off_policy.k
    pipeline = cfg.off_policy.name == "pipeline_rl"
    state.weight_version = state.step
    push_weights(comps, version=state.step, full=True)
    admission = _Admission(cfg=cfg, comps=comps, router=router, state=state, readmit=readmit, rng=rng)
    window = cfg.train.val_mode == "window" and cfg.train.val_every > 0
    if state.step == 0 and cfg.train.val_every:  # window mode too: R0 is the warm start's own point
        _record_validation(cfg, state, writer, forecaster, validate(router, comps, HeldoutSpec.of(cfg), version=0, rng=rng),
                           compute.fields())
    elif window:  # resumed: the window's slices a stop left unscored are generated again, on these weights
        n_val, width = len(comps.val_prompts), cfg.train.val_every
        due = range(n_val) if state.val_due else [
            i for pos in range(state.step % width) for i in window_slice(n_val, width=width, position=pos)]
        scored = {o[0] for o in state.val_window}
        submit(router, comps, HeldoutSpec.of(cfg), [i for i in due if i not in scored], version=state.weight_version,
               rng=rng)
    if state.val_due:  # a stop interrupted this step's validation: complete it before the next step
        _validate(cfg, comps, router, state, writer, compute, forecaster, rng)

    clock = _StepClock()
    first_step, trained_steps = state.step, 0
    while state.step < cfg.train.steps:
        s = state.step
        clock.start(comps.engine)
        if window:
            submit_window_slice(router, comps, HeldoutSpec.of(cfg), step=s, version=state.weight_version, rng=rng)
        pendings, trainer_idle = _admit_and_wait(cfg, router, admission, step=s)  # 1. admission, 2. wait
        t_score = time.monotonic()
        groups = score_groups(pendings, comps, cfg.length, stop_error_rate=cfg.reward.stop_error_rate,
                              where=f"step {s + 1}")  # 3. score + curriculum
        score_s = time.monotonic() - t_score
        hist, metrics = _record_groups(cfg, comps, groups, step=s)
        res = _build_batch(cfg, groups, step=s)  # 4. batch
        metrics.update(res.metrics)
        engine_busy = router.in_flight > 0  # 5. optimizer step (the engines keep generating meanwhile)
        t_train = time.monotonic()
        trained_steps += _train_or_say_why(cfg, comps, res, metrics, step=s + 1, prompts=len(groups))
        train_s = time.monotonic() - t_train
        if not engine_busy:
            clock.gen_idle += train_s
        state.step = s + 1
        state.trained_prompt_ids.extend(p.prompt.prompt_id for p in pendings)
        sync_s = 0.0  # 6. weight sync
        if pipeline or state.step % k == 0 or state.step == cfg.train.steps:
            metrics.update(push_weights(comps, version=state.step))
            sync_s = metrics["sync/seconds"]
            state.weight_version = state.step
        # 7. metrics (wall time and engine counters are snapshotted together: consecutive steps tile time)
        step_s = clock.stop(comps.engine, metrics)
        metrics.update(_step_fields(cfg, comps, groups, pendings, hist, state=state, router=router, clock=clock,
                                    trainer_idle=trainer_idle, train_s=train_s, sync_s=sync_s, score_s=score_s,
                                    step_s=step_s, generated_tokens=metrics["generated_tokens"]))
        alarm.check(step=s, truncation_rate=metrics["truncation_rate"])
        fields = compute.fields()
        rec = writer.write("train", state.step, {**metrics, **fields})
        guard.check(step=state.step, metrics=metrics)  # before this step's checkpoint (metrics/alarms.py)
        if cfg.metrics.progress_every and state.step % cfg.metrics.progress_every == 0:
            elapsed, eta = progress.timing(step=state.step, total_steps=cfg.train.steps)
            log.info("%s", progress_line(step=state.step, total_steps=cfg.train.steps, metrics=rec, elapsed_s=elapsed,
                                         eta_s=eta))
        if on_step is not None:
            on_step(state.step, rec)
        if window and state.step == center_step(end=-(-state.step // cfg.train.val_every) * cfg.train.val_every,
                                                width=cfg.train.val_every):
            state.val_center = {**fields, "val_center_step": float(state.step)}
        if _validate_save_or_stop(cfg, comps, router, state, writer, compute, forecaster, rng, clock=clock):
            return state
    guard.finish()
    if state.step > first_step and not trained_steps:
        log.warning("%s", no_training_warning(state.step - first_step))
    return state


@dataclass(kw_only=True)
class _Admission:
    """Step 1 of the loop: admits prompts (re-admitted ones first) and submits their G samples."""

    cfg: TrainConfig
    comps: LoopComponents
    router: _Router
    state: LoopState
    readmit: list[Prompt]
    rng: random.Random

    def __call__(self, n: int) -> None:
        cfg, state, router = self.cfg, self.state, self.router
        B = cfg.train.prompts_per_step
        hold_tokens = int(cfg.rollout.inflight_hold_tokens) if cfg.off_policy.name == "pipeline_rl" else 0
        for _ in range(n):
            prompt = self.readmit.pop(0) if self.readmit else self.comps.sampler.next_prompts(1)[0]
            if prompt.token_ids is None:
                prompt.token_ids = self.comps.encode(prompt.text)
            pend = _Pending(seq=state.admitted, prompt=prompt, version=state.weight_version)
            sp = sampling_params(cfg.length, cfg.rollout, self.comps, self.rng,
                                 seed=cfg.seed * 1_000_003 + state.admitted * 101, n=router.G)
            if hold_tokens and len(router.queue) >= B:
                # trained at step state.step + position // B > the current weight version: it may
                # wait for the next update mid-generation (rollout.inflight_hold_tokens)
                for p in sp:
                    p.hold_at = hold_tokens
            router.submit(pend, sp)
            state.admitted += 1


@dataclass(kw_only=True)
class _StepClock:
    """A step's wall time and engine work counters, snapshotted together so that consecutive steps
    tile time; `gen_prev` None: take the snapshot at the next step's start (after validation or a save,
    whose decoding is outside every step's wall time)."""

    gen_idle: float = 0.0
    gen_prev: dict[str, float] | None = None
    t_step: float = field(default_factory=time.monotonic)

    def start(self, engine: RolloutEngine) -> None:
        if self.gen_prev is None:  # else the step's wall time starts where the previous one's snapshot was taken
            self.gen_prev = engine_decode_stats(engine)
            self.t_step = time.monotonic()

    def stop(self, engine: RolloutEngine, metrics: dict[str, Any]) -> float:
        """The step's wall time; the engine counters' differences go to `metrics` as gen/<key>."""
        gen_now = engine_decode_stats(engine)
        t_end = time.monotonic()
        step_s = t_end - self.t_step
        if gen_now is not None and self.gen_prev is not None:
            metrics.update({f"gen/{key}": gen_now[key] - self.gen_prev[key] for key in GEN_STAT_KEYS})
        self.gen_prev, self.t_step = gen_now, t_end
        return step_s


def _admit_and_wait(cfg: TrainConfig, router: _Router, admit: _Admission, *, step: int
                    ) -> tuple[list[_Pending], float]:
    """Steps 1-2: admit (PipelineRL: up to (k + 1) * B outstanding; PPO-off-policy: k * B when nothing
    is outstanding), then wait for the B oldest groups. Returns them and the trainer's idle seconds."""
    k, B = cfg.off_policy.k, cfg.train.prompts_per_step
    pipeline = cfg.off_policy.name == "pipeline_rl"
    if pipeline:
        admit(max(0, (k + 1) * B - len(router.queue)))
    elif not router.queue:
        admit(min(k, cfg.train.steps - step) * B)
    t_wait = time.monotonic()
    strict_phases = not pipeline and not cfg.off_policy.overlap
    need = len(router.queue) if strict_phases else B  # strict PPO phases: the whole k * B first
    while not router.oldest_complete(need):
        router.pump()
    trainer_idle = time.monotonic() - t_wait
    return router.pop(B), trainer_idle


def _record_groups(cfg: TrainConfig, comps: LoopComponents, groups: list[Group], *, step: int
                   ) -> tuple[dict[int, int], dict[str, Any]]:
    """Step 3 after scoring: the curriculum's pass-rate history, the staleness bound (asserted) and
    the rollout metrics. Returns the staleness histogram and the step's metrics so far."""
    k = cfg.off_policy.k
    max_staleness = k if cfg.off_policy.name == "pipeline_rl" else k - 1
    for g in groups:
        comps.sampler.record(g.prompt.prompt_id, g.pass_rate)
    hist = staleness_histogram(groups, step=step)
    if max(hist) > max_staleness:
        raise AssertionError(f"step {step}: staleness {max(hist)} > bound {max_staleness} ({cfg.off_policy.name}-{k})")
    metrics = {**rollout_metrics(groups, step=step), **reward_error_metrics(groups)}
    if cfg.env.name != "single":
        from scalerl_mega.episodes.records import episode_lines, episode_metrics

        metrics.update(episode_metrics(groups))
        if cfg.metrics.dump_episodes:
            import json

            with open(Path(cfg.output_dir) / "episodes.jsonl", "a") as f:
                f.writelines(json.dumps(line) + "\n" for line in episode_lines(groups, step=step + 1))
    if hasattr(comps.sampler, "metrics"):  # data/curriculum.py: removed prompts, epoch, ...
        metrics.update({f"curriculum/{key}": v for key, v in comps.sampler.metrics().items()})
    return hist, metrics


def _build_batch(cfg: TrainConfig, groups: list[Group], *, step: int) -> BatchResult:
    """Step 4: the step's TrainBatch (batch.py) per the recipe's groups."""
    return build_train_batch(groups, adv_norm=cfg.adv_norm.name, adv_eps=cfg.adv_norm.eps,
                             aggregation=cfg.aggregation.name, filter_zero_variance=cfg.filter.name == "zero_variance",
                             micro_batch_tokens=cfg.train.micro_batch_tokens,
                             pack_sequences=cfg.train.pack_sequences, policy_version=step,
                             route_weights=cfg.moe.routing_replay == "ids_and_weights")


def _train_or_say_why(cfg: TrainConfig, comps: LoopComponents, res: BatchResult, metrics: dict[str, Any], *,
                      step: int, prompts: int) -> bool:
    """Step 5: the optimizer step on the batch (its `train/*` metrics), or, when the filter kept no prompt, the
    console line saying so and `skipped_no_signal` (metrics/untrained.py). Whether it trained."""
    if res.batch is not None:
        tm = comps.trainer.train_step(res.batch)
        metrics.update({f"train/{key}": v for key, v in tm.items()})
        if "onpolicy_mismatch_kl" in tm:  # generator vs trainer on the same weights (an FP8 generator's bias)
            metrics["rollout/mismatch_kl"] = tm["onpolicy_mismatch_kl"]
        return True
    metrics[UNTRAINED_KEY] = 1.0
    log.warning("%s", untrained_step_line(step, prompts=prompts, kept_prompts=0,
                                          zero_variance=cfg.filter.name == "zero_variance"))
    return False


def _step_fields(cfg: TrainConfig, comps: LoopComponents, groups: list[Group], pendings: list[_Pending],
                 hist: dict[int, int], *, state: LoopState, router: _Router, clock: _StepClock, trainer_idle: float,
                 train_s: float, sync_s: float, score_s: float, step_s: float,
                 generated_tokens: float) -> dict[str, Any]:
    """Step 7: the step's timing, staleness, calibration and engine fields of its metrics line."""
    out: dict[str, Any] = {
        "staleness_hist": {str(a): b for a, b in hist.items()},
        "tokens_per_version": {str(a): b for a, b in tokens_per_version(groups).items()},
        "trainer_idle_s": trainer_idle, "generator_idle_s": clock.gen_idle, "train_s": train_s,
        "weight_sync_s": sync_s, "score_s": score_s, "step_s": step_s,
        "tokens_per_s": generated_tokens / max(step_s, 1e-9),
        "weight_version": float(state.weight_version), "outstanding_prompts": float(len(router.queue)),
        "prompt_ids": [p.prompt.prompt_id for p in pendings],
    }
    out.update(calibration_fields(cfg, groups, train_s=train_s, sync_s=sync_s, step_s=step_s))
    steps = cfg.metrics.weights_digest_steps
    if cfg.metrics.weights_digest and hasattr(comps.engine, "weights_digest") and (not steps
                                                                                   or state.step in steps):
        digest = comps.engine.weights_digest()
        clock.gen_prev = None  # the digest's pass over the weights is outside every step's wall time
        out["gen/weights_sha256"] = digest["weights_sha256"]
        out["gen/weights_version"] = float(digest["version"])
    util = gpu_utilization() if cfg.cluster.device == "cuda" else None
    if util is not None:
        out["gpu_utilization"] = util
    return out


def _validate_save_or_stop(cfg: TrainConfig, comps: LoopComponents, router: _Router, state: LoopState,
                           writer: MetricsWriter, compute: ComputeCounter, forecaster: Forecaster | None,
                           rng: random.Random, *, clock: _StepClock) -> bool:
    """After a step's metrics: validation every `val_every` steps, a checkpoint every `save_every` and at the
    last step (also with `save_every=0` when the run has a checkpoint, e.g. a stop's), and the stop request
    (SIGTERM / Ctrl-C). True: the loop returns now (stopped after this step's checkpoint);
    raises Preempted when a stop is requested without one (run_rl saves)."""
    window = cfg.train.val_mode == "window"
    if cfg.train.val_every and state.step % cfg.train.val_every == 0:
        _validate(cfg, comps, router, state, writer, compute, forecaster, rng)
        clock.gen_prev = None  # validation's decoding is outside every step's wall time
    every = int(cfg.train.save_every)
    saved = bool(every) and state.step % every == 0
    if state.step == cfg.train.steps and not saved and (every or latest_checkpoint(cfg) is not None):
        saved = True  # the last step of a run with checkpoints: a rerun finds it finished (train.py), not its tail
    if saved:
        if window:  # the window's slices in flight are scored now: a resumed run continues the window
            state.val_window += collect(router, comps, HeldoutSpec.of(cfg))
        save_state(comps, cfg, state=state, outstanding=list(router.queue), compute=compute, rng=rng)
        clock.gen_prev = None
    if router.stop_requested is not None and router.stop_requested() and state.step < cfg.train.steps:
        if not saved:
            raise Preempted()  # run_rl saves, then returns
        state.preempted = True
        return True
    return False


def _validate(cfg: TrainConfig, comps: LoopComponents, router: _Router, state: LoopState, writer: MetricsWriter,
              compute: ComputeCounter, forecaster: Forecaster | None, rng: random.Random) -> None:
    """The validation point of `state.step`. Window mode: the window's outcomes (scored at its checkpoints and
    now), at the centre's compute; point mode: all held-out prompts on the trainer's current weights.
    `state.val_due` is set while it runs, so a stop (Preempted) inside it is checkpointed with the point due."""
    state.val_due = True
    if cfg.train.val_mode == "window":
        t0 = time.monotonic()
        state.val_window += collect(router, comps, HeldoutSpec.of(cfg))
        vm = {**val_metrics(state.val_window, expected_prompts=len(comps.val_prompts),
                            max_turns=HeldoutSpec.of(cfg).max_turns),
              "val_seconds": time.monotonic() - t0, "val_window_steps": float(cfg.train.val_every)}
        _record_validation(cfg, state, writer, forecaster, vm, state.val_center or compute.fields())
        state.val_window, state.val_center = [], None
    else:
        if state.weight_version != state.step:  # PPO-off-policy mid-phase: validate current weights
            while router.in_flight > 0:  # the phase keeps its fixed weights to its end
                router.pump()
            push_weights(comps, version=state.step)
            state.weight_version = state.step
        _record_validation(cfg, state, writer, forecaster,
                           validate(router, comps, HeldoutSpec.of(cfg), version=state.weight_version, rng=rng),
                           compute.fields())
    state.val_due = False


def _record_validation(cfg: TrainConfig, state: LoopState, writer: MetricsWriter, forecaster: Forecaster | None,
                       vm: dict[str, float], fields: dict[str, float]) -> None:
    """The validation line (its compute `fields`: the step's, or the window centre's), the point for the
    forecast and, when the forecaster has enough points, the forecast line."""
    x = fields["compute_gpu_hours"] if cfg.cluster.device == "cuda" else fields["compute_device_hours"]
    state.val_points.append((state.step, x, vm["val_pass_rate"]))
    writer.write("validation", state.step, {**vm, **fields})
    log.info("validation step %d: pass rate %.3f", state.step, vm["val_pass_rate"])
    if forecaster is not None:
        fc = forecaster.add(x, vm["val_pass_rate"], vm["val_prompts"] * vm["val_samples_per_prompt"],
                            step=fields.get("val_center_step", state.step))
        if fc is not None:  # A and the prediction are null unless identified; the band always (scaling/band.py)
            writer.write("forecast", state.step, {**fc.summary(), **fields})
            log.info("%s", plain_line(fc, unit=forecaster.unit))


def _as_rng_state(state: Sequence[object]) -> tuple:
    """random.Random state restored from a (possibly list-converted) checkpoint value."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def prompts_from_state(state: dict[str, Any]) -> Iterator[Prompt]:  # pragma: no cover - convenience
    for d in state.get("outstanding", []):
        yield Prompt(**d)
