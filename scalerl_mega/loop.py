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
   forecast; every `save_every` steps a checkpoint.

Resume (`resume=auto`): the checkpoint holds model + optimizer (trainer), curriculum state (data order,
pass-rate history), the prompts admitted but not yet trained on (in admission order), RNG states,
step, compute counter and weight version. On restart those prompts are re-admitted first, so the
sequence of prompts trained on is the same as in an uninterrupted run.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl_mega.batch import BatchResult, build_train_batch
from scalerl_mega.interfaces import LoopComponents, RolloutEngine
from scalerl_mega.metrics.alarms import MismatchGuard, TruncationAlarm
from scalerl_mega.metrics.calibration import GEN_STAT_KEYS, calibration_fields, engine_decode_stats
from scalerl_mega.metrics.compute import ComputeCounter, gpu_utilization
from scalerl_mega.metrics.progress import progress_line
from scalerl_mega.metrics.rollout_stats import (domain_pass_rates, rollout_metrics, staleness_histogram,
                                                tokens_per_version)
from scalerl_mega.metrics.writer import MetricsWriter
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, SamplingParams, ScoredCompletion

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig

log = logging.getLogger("scalerl_mega.loop")


@dataclass(kw_only=True)
class _Pending:
    """One admitted prompt: its G completions arrive over time."""

    seq: int
    """Admission order (global counter)."""
    prompt: Prompt
    version: int
    completions: list[Completion] = field(default_factory=list)


@dataclass(kw_only=True)
class LoopState:
    """What a checkpoint stores besides the trainer's model and optimizer."""

    step: int = 0
    weight_version: int = 0
    admitted: int = 0
    trained_prompt_ids: list[str] = field(default_factory=list)
    val_points: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, compute, val_pass_rate) of each validation."""
    preempted: bool = False
    """This launch stopped early on SIGTERM after checkpointing (not saved: reset on resume)."""


class Preempted(Exception):
    """Raised inside a wait when a stop was requested (SIGTERM): the loop checkpoints and returns."""


# ----------------------------------------------------------------------------- engine I/O
class _Router:
    """Routes engine completions to the pending training groups or to a validation collection."""

    def __init__(self, engine: RolloutEngine, *, group_size: int, poll_timeout_s: float, stall_timeout_s: float = 1800.0,
                 stop_requested: Callable[[], bool] | None = None):
        self.engine = engine
        self.G = group_size
        self.poll_timeout_s = poll_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.stop_requested = stop_requested
        self.last_progress = time.monotonic()
        self.queue: deque[_Pending] = deque()
        self.val: dict[str, list[Completion]] = {}
        self.in_flight = 0
        """Samples submitted and not yet returned."""

    def submit(self, pending: _Pending, sampling: Sequence[SamplingParams]) -> None:
        """Submit the G samples of an admitted prompt, one request each (each has its own seed and
        interruption point)."""
        self.queue.append(pending)
        self._submit_samples(pending.prompt, sampling, version=pending.version)

    def submit_val(self, prompt: Prompt, sampling: Sequence[SamplingParams], *, version: int) -> None:
        self.val[prompt.prompt_id] = []
        self._submit_samples(prompt, sampling, version=version)

    def _submit_samples(self, prompt: Prompt, sampling: Sequence[SamplingParams], *, version: int) -> None:
        for i, sp in enumerate(sampling):
            self.engine.submit(prompt, sp, n=1, version=version, first_index=i)
        if self.in_flight == 0:
            self.last_progress = time.monotonic()
        self.in_flight += len(sampling)

    def pump(self, timeout_s: float | None = None) -> int:
        """Poll the engine once; route what arrived. Returns the number of completions."""
        if self.stop_requested is not None and self.stop_requested():
            raise Preempted()
        got = self.engine.poll(self.poll_timeout_s if timeout_s is None else timeout_s)
        now = time.monotonic()
        if got:
            self.last_progress = now
        elif self.in_flight > 0 and now - self.last_progress > self.stall_timeout_s:
            raise RuntimeError(f"no completion from the engines for {now - self.last_progress:.0f}s with "
                               f"{self.in_flight} requests in flight (rollout.stall_timeout_s="
                               f"{self.stall_timeout_s:g}): a generator is hung or gone")
        for c in got:
            self.in_flight -= 1
            if c.prompt_id in self.val:
                self.val[c.prompt_id].append(c)
                continue
            for p in self.queue:  # oldest first: the same prompt may be admitted twice
                if (p.prompt.prompt_id == c.prompt_id and p.version == c.submitted_version
                        and len(p.completions) < self.G):
                    p.completions.append(c)
                    break
            else:
                log.warning("dropping a completion for unknown prompt %s", c.prompt_id)
        return len(got)

    def oldest_complete(self, n: int) -> bool:
        if len(self.queue) < n:
            return False
        return all(len(self.queue[i].completions) == self.G for i in range(n))

    def pop(self, n: int) -> list[_Pending]:
        return [self.queue.popleft() for _ in range(n)]


def sampling_params(cfg: Any, comps: LoopComponents, rng: random.Random, *, seed: int, n: int) -> list[SamplingParams]:
    """SamplingParams of the n samples of one prompt: temperature, budget, seed + i, and with
    length=interruption an interruption point drawn per sample uniformly in
    [interruption_min, interruption_max] (paper App. A.10)."""
    length = cfg.length
    out = []
    for i in range(n):
        params = SamplingParams(max_new_tokens=length.max_new_tokens, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, stop_token_ids=list(comps.stop_token_ids), seed=seed + i)
        if length.name == "interruption":
            params.interruption_at = rng.randint(length.interruption_min, length.interruption_max)
            params.interruption_ids = list(comps.interruption_ids)
            params.answer_budget = length.answer_budget
        out.append(params)
    return out


# ----------------------------------------------------------------------------- scoring
def score_groups(pendings: Sequence[_Pending], comps: LoopComponents, cfg: TrainConfig) -> list[Group]:
    """Rewards for every completion (batched through the reward pool); length penalty if configured."""
    prompts, texts, flat = [], [], []
    for p in pendings:
        for c in sorted(p.completions, key=lambda c: c.sample_index):
            if c.text is None:
                c.text = comps.decode(c.output_ids)
            prompts.append(p.prompt)
            texts.append(c.text)
            flat.append(c)
    results = comps.reward_fn(prompts, texts)
    rewards = [float(r[0]) for r in results]
    if cfg.length.name == "penalty":
        import torch

        from scalerl_mega.objective.length import apply_overlong_penalty

        rewards = apply_overlong_penalty(
            torch.tensor(rewards, dtype=torch.float64), torch.tensor([c.num_tokens for c in flat]),
            torch.tensor([bool(r[1]) for r in results]), l_max=cfg.length.penalty_max_len,
            l_cache=cfg.length.penalty_cache_len).tolist()
    groups, i = [], 0
    for p in pendings:
        samples = []
        for _ in p.completions:
            samples.append(ScoredCompletion(completion=flat[i], reward=rewards[i], passed=bool(results[i][1]),
                                            reason=str(results[i][2])))
            i += 1
        groups.append(Group(prompt=p.prompt, samples=samples))
    return groups


# ----------------------------------------------------------------------------- validation
def validation_seed(*, version: int, index: int, run_seed: int, paired: bool) -> int:
    """Sampling seed of validation prompt `index` at weight `version` (sample i uses seed + i). It includes
    the run's seed unless `paired` (`data.val_paired_draws`): then every run draws the same numbers."""
    base = 10_000_019 * (version + 1) + 1000 * index
    if paired:
        return base
    return (base + (int(run_seed) + 1) * 0x9E3779B97F4A7C15) % (1 << 62)


def validate(router: _Router, comps: LoopComponents, cfg: TrainConfig, *, version: int, rng: random.Random) -> dict[str, float]:
    """Mean pass rate over the held-out prompts, `data.val_samples` samples each, on the same engines,
    and per domain (`val/<domain>_pass_rate`, `metrics.rollout_stats.domain_pass_rates`)."""
    n = cfg.data.val_samples
    for i, prompt in enumerate(comps.val_prompts):
        if prompt.token_ids is None:
            prompt.token_ids = comps.encode(prompt.text)
        sp = sampling_params(cfg, comps, rng, seed=validation_seed(version=version, index=i, run_seed=cfg.seed,
                                                                    paired=cfg.data.val_paired_draws), n=n)
        router.submit_val(prompt, sp, version=version)
    t0 = time.monotonic()
    while any(len(router.val[p.prompt_id]) < n for p in comps.val_prompts):
        router.pump()
    pendings = [_Pending(seq=-1, prompt=p, version=version, completions=router.val.pop(p.prompt_id))
                for p in comps.val_prompts]
    groups = score_groups(pendings, comps, cfg)
    samples = [s for g in groups for s in g.samples]
    return {
        **domain_pass_rates(groups),
        "val_pass_rate": sum(s.passed for s in samples) / len(samples),
        "val_reward_mean": sum(s.reward for s in samples) / len(samples),
        "val_truncation_rate": sum(s.completion.finish_reason == FinishReason.LENGTH for s in samples) / len(samples),
        "val_prompts": float(len(groups)),
        "val_samples_per_prompt": float(n),
        "val_seconds": time.monotonic() - t0,
    }


# ----------------------------------------------------------------------------- weights
def push_weights(comps: LoopComponents, *, version: int) -> float:
    """Trainer -> engines (HF-named tensors); returns seconds spent."""
    t0 = time.monotonic()
    comps.engine.update_weights(comps.trainer.export_hf_weights(dtype=comps.weight_dtype), version=version)
    return time.monotonic() - t0


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
    comps.trainer.save(str(_ckpt_root(cfg)), extra_state=extra)
    from scalerl_mega.trainer.megatron.checkpoint import prune_checkpoints

    prune_checkpoints(_ckpt_root(cfg), keep=int(cfg.train.keep_checkpoints))


def _prompt_dict(p: Prompt) -> dict[str, Any]:
    return {"prompt_id": p.prompt_id, "text": p.text, "task": p.task, "gold": p.gold,
            "token_ids": p.token_ids, "meta": dict(p.meta)}


# ----------------------------------------------------------------------------- the loop
def run_rl(cfg: TrainConfig, comps: LoopComponents, *, compute: ComputeCounter, forecaster: Any | None = None,
           on_step: Callable[[int, dict], None] | None = None,
           stop_requested: Callable[[], bool] | None = None) -> LoopState:
    """Run RL to `cfg.train.steps` (resuming if a checkpoint exists); metrics go to
    <output_dir>/metrics.jsonl. Returns the final LoopState.

    `stop_requested` (SIGTERM, scalerl_mega/preemption.py) is polled at the safe points: while waiting
    for generations or validation, and after each step. When it is true the loop saves a checkpoint
    (the prompts admitted but not trained are re-admitted on resume; their partial generations are
    regenerated) and returns with `state.preempted` set."""
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
            for _, c, r in state.val_points:
                forecaster.add(c, r, n_val)
        log.info("resumed from %s at step %d (%d prompts re-admitted)", ckpt, state.step, len(readmit))
    from scalerl_mega.metrics.loggers import build_loggers

    writer = MetricsWriter(cfg.output_dir, tensorboard=cfg.metrics.tensorboard,
                           resume_step=state.step if ckpt is not None else None, loggers=build_loggers(cfg))
    try:
        return _loop(cfg, comps, state=state, router=router, readmit=readmit, rng=rng, writer=writer,
                     compute=compute, forecaster=forecaster, alarm=alarm, guard=guard, on_step=on_step)
    except Preempted:
        save_state(comps, cfg, state=state, outstanding=list(router.queue), compute=compute, rng=rng)
        state.preempted = True
        log.warning("stopped at step %d on request (SIGTERM) after saving a checkpoint; rerun to resume", state.step)
        print(f"preempted: checkpoint saved at step {state.step}; rerun the same command to resume", flush=True)
        return state
    finally:
        writer.close()


def _loop(cfg: TrainConfig, comps: LoopComponents, *, state: LoopState, router: _Router, readmit: list[Prompt],
          rng: random.Random, writer: MetricsWriter, compute: ComputeCounter,
          forecaster: Any | None, alarm: TruncationAlarm, guard: MismatchGuard,
          on_step: Callable[[int, dict], None] | None) -> LoopState:
    k = cfg.off_policy.k
    pipeline = cfg.off_policy.name == "pipeline_rl"
    state.weight_version = state.step
    push_weights(comps, version=state.step)
    admission = _Admission(cfg=cfg, comps=comps, router=router, state=state, readmit=readmit, rng=rng)
    if state.step == 0 and cfg.train.val_every:
        _validation(cfg, comps, router, state, writer, compute, forecaster, rng)

    clock = _StepClock()
    while state.step < cfg.train.steps:
        s = state.step
        clock.start(comps.engine)
        pendings, trainer_idle = _admit_and_wait(cfg, router, admission, step=s)  # 1. admission, 2. wait
        t_score = time.monotonic()
        groups = score_groups(pendings, comps, cfg)  # 3. score + curriculum
        score_s = time.monotonic() - t_score
        hist, metrics = _record_groups(cfg, comps, groups, step=s)
        res = _build_batch(cfg, groups, step=s)  # 4. batch
        metrics.update(res.metrics)
        engine_busy = router.in_flight > 0  # 5. optimizer step (the engines keep generating meanwhile)
        t_train = time.monotonic()
        if res.batch is not None:
            tm = comps.trainer.train_step(res.batch)
            metrics.update({f"train/{key}": v for key, v in tm.items()})
        else:
            metrics["skipped_no_signal"] = 1.0
        train_s = time.monotonic() - t_train
        if not engine_busy:
            clock.gen_idle += train_s
        state.step = s + 1
        state.trained_prompt_ids.extend(p.prompt.prompt_id for p in pendings)
        sync_s = 0.0  # 6. weight sync
        if pipeline or state.step % k == 0 or state.step == cfg.train.steps:
            sync_s = push_weights(comps, version=state.step)
            state.weight_version = state.step
        # 7. metrics (wall time and engine counters are snapshotted together: consecutive steps tile time)
        step_s = clock.stop(comps.engine, metrics)
        metrics.update(_step_fields(cfg, comps, groups, pendings, hist, state=state, router=router, clock=clock,
                                    trainer_idle=trainer_idle, train_s=train_s, sync_s=sync_s, score_s=score_s,
                                    step_s=step_s, generated_tokens=metrics["generated_tokens"]))
        alarm.check(step=s, truncation_rate=metrics["truncation_rate"])
        rec = writer.write("train", state.step, {**metrics, **compute.fields()})
        guard.check(step=state.step, metrics=metrics)  # before this step's checkpoint (metrics/alarms.py)
        if cfg.metrics.progress_every and state.step % cfg.metrics.progress_every == 0:
            log.info("%s", progress_line(step=state.step, total_steps=cfg.train.steps, metrics=rec))
        if on_step is not None:
            on_step(state.step, rec)
        if _validate_save_or_stop(cfg, comps, router, state, writer, compute, forecaster, rng, clock=clock):
            return state
    guard.finish()
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
            sp = sampling_params(cfg, self.comps, self.rng, seed=cfg.seed * 1_000_003 + state.admitted * 101,
                                 n=router.G)
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
    metrics = rollout_metrics(groups, step=step)
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
    if cfg.metrics.weights_digest and hasattr(comps.engine, "weights_digest"):
        digest = comps.engine.weights_digest()
        out["gen/weights_sha256"] = digest["weights_sha256"]
        out["gen/weights_version"] = float(digest["version"])
    util = gpu_utilization() if cfg.cluster.device == "cuda" else None
    if util is not None:
        out["gpu_utilization"] = util
    return out


def _validate_save_or_stop(cfg: TrainConfig, comps: LoopComponents, router: _Router, state: LoopState,
                           writer: MetricsWriter, compute: ComputeCounter, forecaster: Any | None,
                           rng: random.Random, *, clock: _StepClock) -> bool:
    """After a step's metrics: validation every `val_every` steps, a checkpoint every `save_every`,
    and the stop request (SIGTERM). True: the loop returns now (stopped after this step's checkpoint);
    raises Preempted when a stop is requested without one (run_rl saves)."""
    if cfg.train.val_every and state.step % cfg.train.val_every == 0:
        if state.weight_version != state.step:  # PPO-off-policy mid-phase: validate current weights
            while router.in_flight > 0:  # the phase keeps its fixed weights to its end
                router.pump()
            push_weights(comps, version=state.step)
            state.weight_version = state.step
        _validation(cfg, comps, router, state, writer, compute, forecaster, rng)
        clock.gen_prev = None  # validation's decoding is outside every step's wall time
    saved = bool(cfg.train.save_every) and state.step % cfg.train.save_every == 0
    if saved:
        save_state(comps, cfg, state=state, outstanding=list(router.queue), compute=compute, rng=rng)
        clock.gen_prev = None
    if router.stop_requested is not None and router.stop_requested() and state.step < cfg.train.steps:
        if not saved:
            raise Preempted()  # run_rl saves, then returns
        state.preempted = True
        return True
    return False


def _validation(cfg, comps, router, state, writer, compute, forecaster, rng) -> None:
    vm = validate(router, comps, cfg, version=state.weight_version, rng=rng)
    fields = compute.fields()
    x = fields["compute_gpu_hours"] if cfg.cluster.device == "cuda" else fields["compute_device_hours"]
    state.val_points.append((state.step, x, vm["val_pass_rate"]))
    writer.write("validation", state.step, {**vm, **fields})
    log.info("validation step %d: pass rate %.3f", state.step, vm["val_pass_rate"])
    if forecaster is not None:
        fc = forecaster.add(x, vm["val_pass_rate"], vm["val_prompts"] * vm["val_samples_per_prompt"])
        if fc is not None:  # A and the prediction are null unless identified (scaling/identify.py)
            writer.write("forecast", state.step, {**fc.summary(), **fields})


def _as_rng_state(state: Sequence[Any]) -> tuple:
    """random.Random state restored from a (possibly list-converted) checkpoint value."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def prompts_from_state(state: dict[str, Any]) -> Iterator[Prompt]:  # pragma: no cover - convenience
    for d in state.get("outstanding", []):
        yield Prompt(**d)
