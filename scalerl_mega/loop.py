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
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerl_mega.batch import build_train_batch
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.metrics.alarms import MismatchGuard, TruncationAlarm
from scalerl_mega.metrics.compute import ComputeCounter, gpu_utilization
from scalerl_mega.metrics.progress import progress_line
from scalerl_mega.metrics.rollout_stats import (domain_pass_rates, rollout_metrics, staleness_histogram,
                                                tokens_per_version)
from scalerl_mega.metrics.writer import MetricsWriter
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, SamplingParams, ScoredCompletion

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

    def __init__(self, engine: Any, *, group_size: int, poll_timeout_s: float, stall_timeout_s: float = 1800.0,
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
def score_groups(pendings: Sequence[_Pending], comps: LoopComponents, cfg: Any) -> list[Group]:
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


def validate(router: _Router, comps: LoopComponents, cfg: Any, *, version: int, rng: random.Random) -> dict[str, float]:
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
def _ckpt_root(cfg: Any) -> Path:
    return Path(cfg.output_dir) / "checkpoints"


def latest_checkpoint(cfg: Any) -> Path | None:
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


def save_state(comps: LoopComponents, cfg: Any, *, state: LoopState, outstanding: Sequence[_Pending],
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
def run_rl(cfg: Any, comps: LoopComponents, *, compute: ComputeCounter, forecaster: Any | None = None,
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


def _loop(cfg, comps, *, state, router, readmit, rng, writer, compute, forecaster, alarm, guard, on_step) -> LoopState:
    k, B = cfg.off_policy.k, cfg.train.prompts_per_step
    pipeline = cfg.off_policy.name == "pipeline_rl"
    strict_phases = not pipeline and not cfg.off_policy.overlap
    max_staleness = k if pipeline else k - 1
    state.weight_version = state.step
    push_weights(comps, version=state.step)

    hold_tokens = int(cfg.rollout.inflight_hold_tokens) if pipeline else 0

    def admit(n: int) -> None:
        for _ in range(n):
            prompt = readmit.pop(0) if readmit else comps.sampler.next_prompts(1)[0]
            if prompt.token_ids is None:
                prompt.token_ids = comps.encode(prompt.text)
            pend = _Pending(seq=state.admitted, prompt=prompt, version=state.weight_version)
            sp = sampling_params(cfg, comps, rng, seed=cfg.seed * 1_000_003 + state.admitted * 101,
                                 n=router.G)
            if hold_tokens and len(router.queue) >= B:
                # trained at step state.step + position // B > the current weight version: it may
                # wait for the next update mid-generation (rollout.inflight_hold_tokens)
                for p in sp:
                    p.hold_at = hold_tokens
            router.submit(pend, sp)
            state.admitted += 1

    if state.step == 0 and cfg.train.val_every:
        _validation(cfg, comps, router, state, writer, compute, forecaster, rng)

    gen_idle = 0.0
    gen_prev = None  # engine work counters at the start of this step (None: take them now)
    t_step = time.monotonic()
    while state.step < cfg.train.steps:
        s = state.step
        if gen_prev is None:  # else the step's wall time starts where the previous one's snapshot was taken
            gen_prev = engine_decode_stats(comps.engine)
            t_step = time.monotonic()
        # 1. admission
        if pipeline:
            admit(max(0, (k + 1) * B - len(router.queue)))
        elif not router.queue:
            admit(min(k, cfg.train.steps - s) * B)
        # 2. wait for the B oldest groups
        t_wait = time.monotonic()
        need = len(router.queue) if strict_phases else B  # strict PPO phases: the whole k * B first
        while not router.oldest_complete(need):
            router.pump()
        trainer_idle = time.monotonic() - t_wait
        pendings = router.pop(B)
        # 3. score + curriculum
        t_score = time.monotonic()
        groups = score_groups(pendings, comps, cfg)
        score_s = time.monotonic() - t_score
        for g in groups:
            comps.sampler.record(g.prompt.prompt_id, g.pass_rate)
        hist = staleness_histogram(groups, step=s)
        if max(hist) > max_staleness:
            raise AssertionError(f"step {s}: staleness {max(hist)} > bound {max_staleness} ({cfg.off_policy.name}-{k})")
        metrics = rollout_metrics(groups, step=s)
        if hasattr(comps.sampler, "metrics"):  # data/curriculum.py: removed prompts, epoch, ...
            metrics.update({f"curriculum/{key}": v for key, v in comps.sampler.metrics().items()})
        # 4. batch
        res = build_train_batch(groups, adv_norm=cfg.adv_norm.name, adv_eps=cfg.adv_norm.eps,
                                aggregation=cfg.aggregation.name, filter_zero_variance=cfg.filter.name == "zero_variance",
                                micro_batch_tokens=cfg.train.micro_batch_tokens,
                                pack_sequences=cfg.train.pack_sequences, policy_version=s,
                                route_weights=cfg.moe.routing_replay == "ids_and_weights")
        metrics.update(res.metrics)
        # 5. optimizer step (the engines keep generating meanwhile)
        engine_busy = router.in_flight > 0
        t_train = time.monotonic()
        if res.batch is not None:
            tm = comps.trainer.train_step(res.batch)
            metrics.update({f"train/{key}": v for key, v in tm.items()})
        else:
            metrics["skipped_no_signal"] = 1.0
        train_s = time.monotonic() - t_train
        if not engine_busy:
            gen_idle += train_s
        state.step = s + 1
        state.trained_prompt_ids.extend(p.prompt.prompt_id for p in pendings)
        # 6. weight sync
        sync_s = 0.0
        if pipeline or state.step % k == 0 or state.step == cfg.train.steps:
            sync_s = push_weights(comps, version=state.step)
            state.weight_version = state.step
        # 7. metrics (wall time and engine counters are snapshotted together: consecutive steps tile time)
        gen_now = engine_decode_stats(comps.engine)
        t_end = time.monotonic()
        step_s = t_end - t_step
        if gen_now is not None and gen_prev is not None:
            metrics.update({f"gen/{key}": gen_now[key] - gen_prev[key] for key in GEN_STAT_KEYS})
        gen_prev, t_step = gen_now, t_end
        metrics.update({
            "staleness_hist": {str(a): b for a, b in hist.items()},
            "tokens_per_version": {str(a): b for a, b in tokens_per_version(groups).items()},
            "trainer_idle_s": trainer_idle, "generator_idle_s": gen_idle, "train_s": train_s,
            "weight_sync_s": sync_s, "score_s": score_s, "step_s": step_s,
            "tokens_per_s": metrics["generated_tokens"] / max(step_s, 1e-9),
            "weight_version": float(state.weight_version), "outstanding_prompts": float(len(router.queue)),
            "prompt_ids": [p.prompt.prompt_id for p in pendings],
        })
        metrics.update(calibration_fields(cfg, groups, train_s=train_s, sync_s=sync_s, step_s=step_s))
        if cfg.metrics.weights_digest and hasattr(comps.engine, "weights_digest"):
            digest = comps.engine.weights_digest()
            metrics["gen/weights_sha256"] = digest["weights_sha256"]
            metrics["gen/weights_version"] = float(digest["version"])
        util = gpu_utilization() if cfg.cluster.device == "cuda" else None
        if util is not None:
            metrics["gpu_utilization"] = util
        alarm.check(step=s, truncation_rate=metrics["truncation_rate"])
        rec = writer.write("train", state.step, {**metrics, **compute.fields()})
        guard.check(step=state.step, metrics=metrics)  # before this step's checkpoint (metrics/alarms.py)
        if cfg.metrics.progress_every and state.step % cfg.metrics.progress_every == 0:
            log.info("%s", progress_line(step=state.step, total_steps=cfg.train.steps, metrics=rec))
        if on_step is not None:
            on_step(state.step, rec)
        if cfg.train.val_every and state.step % cfg.train.val_every == 0:
            if state.weight_version != state.step:  # PPO-off-policy mid-phase: validate current weights
                while router.in_flight > 0:  # the phase keeps its fixed weights to its end
                    router.pump()
                push_weights(comps, version=state.step)
                state.weight_version = state.step
            _validation(cfg, comps, router, state, writer, compute, forecaster, rng)
            gen_prev = None  # validation's decoding is outside every step's wall time
        saved = bool(cfg.train.save_every) and state.step % cfg.train.save_every == 0
        if saved:
            save_state(comps, cfg, state=state, outstanding=list(router.queue), compute=compute, rng=rng)
            gen_prev = None
        if router.stop_requested is not None and router.stop_requested() and state.step < cfg.train.steps:
            if not saved:
                raise Preempted()  # run_rl saves, then returns
            state.preempted = True
            return state
    guard.finish()
    return state


GEN_STAT_KEYS = ("busy_s", "decode_steps", "decode_tokens")
"""Engine work counters written per step as `gen/<key>` (differences over the step's wall time,
summed over engines): what `cluster/simulate.py::calibration_from_records` fits decode speed on."""


def engine_decode_stats(engine: Any) -> dict[str, float] | None:
    """Cumulative `GEN_STAT_KEYS` counters of an engine (`decode_stats()`, rollout/local.py), summed
    over the members of an engine set (`.engines`); None when an engine does not report them
    (SGLang servers)."""
    members = getattr(engine, "engines", None)
    members = list(members) if members is not None and not hasattr(engine, "decode_stats") else [engine]
    total = dict.fromkeys(GEN_STAT_KEYS, 0.0)
    for e in members:
        if not hasattr(e, "decode_stats"):
            return None
        st = e.decode_stats()
        for key in GEN_STAT_KEYS:
            total[key] += float(st[key])
    return total


def calibration_fields(cfg: Any, groups: Sequence[Group], *, train_s: float, sync_s: float,
                       step_s: float) -> dict[str, Any]:
    """The per-step fields `cluster/simulate.py::calibration_from_records` reads (timing, batch
    shape, layout). The engine-side decode counters (gen/busy_s, gen/decode_steps, gen/decode_tokens)
    are differences of `engine_decode_stats` over the step, written by the loop."""
    comps = [s.completion for g in groups for s in g.samples]
    gen_lengths = [len(c.output_ids) for c in comps]
    prompt_tokens = [len(c.prompt_ids) for c in comps]
    return {
        "timing/train_step_s": train_s, "timing/sync_s": sync_s, "timing/step_wall_s": step_s,
        "batch/tokens": float(sum(gen_lengths) + sum(prompt_tokens)), "batch/gen_lengths": gen_lengths,
        "batch/prompt_tokens_mean": sum(prompt_tokens) / max(len(prompt_tokens), 1),
        "sim/batch_samples": cfg.train.prompts_per_step * cfg.train.generations_per_prompt,
        "sim/num_generators": cfg.rollout.num_engines, "sim/gpus_per_generator": cfg.rollout.sglang_tp_size if cfg.rollout.name == "sglang" else 1,
        "sim/trainer_gpus": cfg.cluster.trainer_devices or int(os.environ.get("WORLD_SIZE", "1")), "sim/max_concurrency": cfg.rollout.max_batch_size,
        "sim/mode": cfg.off_policy.name, "sim/k": cfg.off_policy.k,
    }


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


def _as_rng_state(state: Any) -> tuple:
    """random.Random state restored from a (possibly list-converted) checkpoint value."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def prompts_from_state(state: dict[str, Any]) -> Iterator[Prompt]:  # pragma: no cover - convenience
    for d in state.get("outstanding", []):
        yield Prompt(**d)
