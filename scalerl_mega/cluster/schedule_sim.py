"""Discrete-event simulator of generators and trainers: PipelineRL-k vs PPO-off-policy-k (paper Sec. 3.1).

Model (everything a :class:`SimConfig` field):

* ``num_generators`` inference servers of ``gpus_per_generator`` GPUs each, continuous batching of at
  most ``max_concurrency`` sequences. One decode step advances every active sequence by one token and
  takes ``decode_base_s + decode_per_seq_s * n`` seconds with ``n`` active sequences (memory-bound
  weight read + per-sequence KV read). Admitting a sequence stalls its server for
  ``prefill_per_token_s * prompt_len`` (busy). Progress between events is integrated exactly for a
  constant ``n`` (fluid in the decode-step boundary: an event may fall inside a decode step).
* Completion lengths come from :class:`LengthDist`.
* One trainer (``trainer_gpus`` GPUs) takes ``batch_samples`` sequences per optimizer step, lasting
  ``train_fixed_s + train_per_token_s * (prompt + completion tokens of the batch)``. After a step the
  new weights are broadcast: the trainer and every generator spend ``sync_s`` on it (counted as idle:
  no decode, no training).

Regimes:

* ``pipeline_rl`` (PipelineRL-k): generators never drain; a weight update pauses decoding for
  ``sync_s`` and sequences continue with the new weights (in-flight update). A sequence's *staleness*
  is the trainer step that consumes it minus the weight version when its generation began. Admission
  is throttled so staleness never exceeds ``k``: with ``U`` steps started, generator version ``g`` and
  ``Q`` admitted-but-unconsumed sequences, a new sequence is admitted only if ``g + k >= U`` and
  ``Q + 1 <= (g + k - U + 1) * B``. The trainer takes the oldest completed sequences, and waits
  (idles) while taking them would leave more than ``(s + k - U) * B`` unconsumed sequences started at
  versions ``<= s`` for some ``s`` -- i.e. it waits rather than get more than ``k`` steps ahead.
* ``ppo_off_policy`` (PPO-off-policy-k): generators produce ``k * B`` sequences with fixed weights
  (split evenly over generators), the trainer then takes ``k`` steps, then one sync. Staleness of the
  ``j``-th step of a round is ``j``.

Statistics are taken over ``[t_free(warmup_steps - 1), t_free(steps - 1)]`` where ``t_free(j)`` is
when the trainer is free after step ``j`` and its sync. Idle fractions count sync time as idle.
``gpu_idle_fraction`` weights generator and trainer idle fractions by their GPU counts.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any


MODES = ("pipeline_rl", "ppo_off_policy")
LENGTH_KINDS = ("fixed", "uniform", "lognormal", "empirical")


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """Completion length in tokens. ``fixed``: ``mean``; ``uniform``: [low, high]; ``lognormal``:
    mean ``mean``, log-std ``sigma``; ``empirical``: draw from ``values``. All capped at ``max_len``
    (interruption / truncation) and floored at 1."""

    kind: str = "fixed"
    mean: float = 1000.0
    sigma: float = 0.6
    low: int = 1
    high: int = 1
    values: tuple[int, ...] = ()
    max_len: int = 1 << 30

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"LengthDist.kind={self.kind!r} not in {LENGTH_KINDS}")
        if self.kind == "empirical" and not self.values:
            raise ValueError("LengthDist.values must be non-empty for kind='empirical'")
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError(f"LengthDist.high={self.high} < low={self.low}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            x = self.mean
        elif self.kind == "uniform":
            x = rng.randint(self.low, self.high)
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - self.sigma**2 / 2
            x = rng.lognormvariate(mu, self.sigma)
        else:
            x = rng.choice(self.values)
        return int(min(max(1, round(x)), self.max_len))


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    mode: str = "pipeline_rl"
    k: int = 8
    batch_samples: int = 768  # B * G sequences per optimizer step (paper: 48 x 16)
    num_generators: int = 64
    gpus_per_generator: int = 1
    trainer_gpus: int = 16
    max_concurrency: int = 64
    decode_base_s: float = 0.002
    decode_per_seq_s: float = 0.00013
    prompt_len: int = 512
    prefill_per_token_s: float = 0.0
    train_fixed_s: float = 1.0
    train_per_token_s: float = 4e-6
    sync_s: float = 2.0
    lengths: LengthDist = field(default_factory=lambda: LengthDist(kind="lognormal", mean=6000, max_len=14336))
    steps: int = 40
    warmup_steps: int = 8
    seed: int = 0

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"SimConfig.mode={self.mode!r} not in {MODES}")
        for key in ("k", "batch_samples", "num_generators", "gpus_per_generator", "trainer_gpus",
                    "max_concurrency", "steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"SimConfig.{key}={getattr(self, key)} must be >= 1")
        for key in ("decode_base_s", "decode_per_seq_s", "prefill_per_token_s", "train_fixed_s",
                    "train_per_token_s", "sync_s", "prompt_len"):
            if getattr(self, key) < 0:
                raise ValueError(f"SimConfig.{key}={getattr(self, key)} must be >= 0")
        if self.decode_base_s + self.decode_per_seq_s <= 0:
            raise ValueError("SimConfig: decode_base_s + decode_per_seq_s must be > 0")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"SimConfig.warmup_steps={self.warmup_steps} must be in [0, steps={self.steps})")
        if self.mode == "ppo_off_policy" and (self.steps % self.k or self.warmup_steps % self.k):
            raise ValueError(f"SimConfig: ppo_off_policy needs steps={self.steps} and warmup_steps="
                             f"{self.warmup_steps} to be multiples of k={self.k}")

    @property
    def generator_gpus(self) -> int:
        return self.num_generators * self.gpus_per_generator


@dataclass(frozen=True, kw_only=True)
class SimResult:
    mode: str
    k: int
    window_s: float
    steps_measured: int
    samples_per_hour: float
    trainer_idle_fraction: float
    generator_idle_fraction: float
    gpu_idle_fraction: float
    staleness: dict[int, int]  # staleness (steps) -> number of consumed sequences in the window
    mean_step_period_s: float

    @property
    def max_staleness(self) -> int:
        return max(self.staleness) if self.staleness else 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["staleness"] = {str(k): v for k, v in sorted(self.staleness.items())}
        return d


class _Seq:
    __slots__ = ("idx", "length", "start_version", "end_counter", "done")

    def __init__(self, idx: int, length: int, start_version: int) -> None:
        self.idx, self.length, self.start_version = idx, length, start_version
        self.end_counter = 0.0
        self.done = False


class _Gen:
    """One inference server; ``counter`` = decode steps taken so far (fluid)."""

    __slots__ = ("gid", "active", "counter", "last_t", "stall_until", "busy_s", "epoch", "quota")

    def __init__(self, gid: int) -> None:
        self.gid = gid
        self.active: list[tuple[float, int, _Seq]] = []  # heap by end_counter
        self.counter = 0.0
        self.last_t = 0.0
        self.stall_until = 0.0  # prefill (busy) or sync (idle) stalls
        self.busy_s = 0.0
        self.epoch = 0  # invalidates stale heap events
        self.quota = 0  # ppo: sequences still to admit in this round


class Simulator:
    """Event loop; use :func:`simulate` instead of instantiating directly."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.t = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self._tie = 0
        self.gens = [_Gen(i) for i in range(cfg.num_generators)]
        self.gen_version = 0
        self.steps_started = 0
        self.steps_done = 0
        self.trainer_busy = False  # computing or syncing
        self.trainer_compute_s = 0.0
        self.sync_total_s = 0.0
        self.gen_sync_s = 0.0
        self.admitted = 0
        self.unconsumed_by_version: Counter[int] = Counter()
        self.completed: dict[int, deque[_Seq]] = {}
        self.completed_n = 0
        self.t_free: list[float] = []
        self.snap: list[tuple[float, float, float]] = []  # per step: (trainer compute, gen busy total)
        self.consumed_log: list[tuple[int, int]] = []  # (step, staleness) per sequence
        self.ppo_round_left = 0

    # ------------------------------------------------------------ event plumbing
    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._tie += 1
        heapq.heappush(self.events, (t, self._tie, kind, payload))

    def _step_time(self, n: int) -> float:
        return self.cfg.decode_base_s + self.cfg.decode_per_seq_s * n

    def _advance(self, g: _Gen) -> None:
        """Integrate decode progress of ``g`` up to ``self.t``."""
        start = max(g.last_t, g.stall_until)
        if g.active and self.t > start:
            dt = self.t - start
            g.counter += dt / self._step_time(len(g.active))
            g.busy_s += dt
        g.last_t = self.t

    def _schedule(self, g: _Gen) -> None:
        g.epoch += 1
        if not g.active:
            return
        start = max(self.t, g.stall_until)
        end_counter = g.active[0][0]
        t_done = start + max(0.0, end_counter - g.counter) * self._step_time(len(g.active))
        self._push(t_done, "gen", (g.gid, g.epoch))

    # ------------------------------------------------------------ admission
    def _pipeline_may_admit(self) -> bool:
        B, k = self.cfg.batch_samples, self.cfg.k
        g, U = self.gen_version, self.steps_started
        q = sum(self.unconsumed_by_version.values())
        return g + k >= U and q + 1 <= (g + k - U + 1) * B

    def _admit(self, g: _Gen) -> None:
        seq = _Seq(self.admitted, self.cfg.lengths.sample(self.rng), self.gen_version)
        self.admitted += 1
        self.unconsumed_by_version[seq.start_version] += 1
        prefill = self.cfg.prefill_per_token_s * self.cfg.prompt_len
        if prefill > 0:  # the server is busy prefilling: decode of the others stalls
            g.stall_until = max(g.stall_until, self.t) + prefill
            g.busy_s += prefill
        seq.end_counter = g.counter + seq.length
        heapq.heappush(g.active, (seq.end_counter, seq.idx, seq))

    def _fill(self, only: _Gen | None = None) -> None:
        """Admit new sequences wherever a server has a free slot and the regime allows it.

        The PipelineRL cap only opens at a sync (a completion frees a slot on its own server only;
        a trainer step lowers ``Q`` and raises ``U`` by the same ``B``), so completions refill
        ``only`` their server and syncs refill all, least loaded first."""
        cfg = self.cfg
        pool = [only] if only is not None else sorted(self.gens, key=lambda x: len(x.active))
        for g in pool:
            if len(g.active) >= cfg.max_concurrency:
                continue
            if cfg.mode == "pipeline_rl" and not self._pipeline_may_admit():
                break
            changed = False
            self._advance(g)
            while len(g.active) < cfg.max_concurrency:
                if cfg.mode == "pipeline_rl":
                    if not self._pipeline_may_admit():
                        break
                else:
                    if g.quota <= 0:
                        break
                    g.quota -= 1
                self._admit(g)
                changed = True
            if changed:
                self._schedule(g)

    # ------------------------------------------------------------ trainer
    def _oldest_completed(self, n: int) -> Counter[int]:
        """How many of the ``n`` oldest completed sequences come from each start version."""
        taken: Counter[int] = Counter()
        left = n
        for v in sorted(self.completed):
            m = min(left, len(self.completed[v]))
            if m:
                taken[v] = m
                left -= m
            if not left:
                break
        return taken

    def _select_pipeline(self) -> Counter[int] | None:
        B, k, U = self.cfg.batch_samples, self.cfg.k, self.steps_started
        if self.completed_n < B:
            return None
        taken = self._oldest_completed(B)
        # the next step must stay feasible: unconsumed(start <= s) <= (s + k - U) * B for every s;
        # for s <= U - k this forces every such sequence into this step (the trainer waits for it)
        cum = 0
        for v in sorted(self.unconsumed_by_version):
            cum += self.unconsumed_by_version[v] - taken[v]
            if cum > max(0, v + k - U) * B:
                return None
        return taken

    def _select_ppo(self) -> Counter[int] | None:
        B = self.cfg.batch_samples
        # the whole round (k * B) must be generated before its first step: strict alternation
        if self.ppo_round_left <= 0 or self.completed_n < self.ppo_round_left * B:
            return None
        return self._oldest_completed(B)

    def _try_train(self) -> None:
        cfg = self.cfg
        if self.trainer_busy or self.steps_started >= cfg.steps:
            return
        taken = self._select_pipeline() if cfg.mode == "pipeline_rl" else self._select_ppo()
        if taken is None:
            return
        step = self.steps_started
        tokens = 0
        for v, m in taken.items():
            dq = self.completed[v]
            for _ in range(m):
                seq = dq.popleft()
                tokens += seq.length + cfg.prompt_len
                self.consumed_log.append((step, step - seq.start_version))
            if not dq:
                del self.completed[v]
            self.completed_n -= m
            self.unconsumed_by_version[v] -= m
            if self.unconsumed_by_version[v] == 0:
                del self.unconsumed_by_version[v]
        dur = cfg.train_fixed_s + cfg.train_per_token_s * tokens
        self.steps_started += 1
        self.trainer_busy = True
        self.trainer_compute_s += dur
        if cfg.mode == "ppo_off_policy":
            self.ppo_round_left -= 1
        self._push(self.t + dur, "train_done", step)

    def _sync_needed(self, step: int) -> bool:
        return self.cfg.mode == "pipeline_rl" or (step + 1) % self.cfg.k == 0

    def _on_train_done(self, step: int) -> None:
        cfg = self.cfg
        self.steps_done = step + 1
        if self._sync_needed(step) and cfg.sync_s > 0:
            self.sync_total_s += cfg.sync_s
            for g in self.gens:  # pause between decode steps; generation resumes on new weights
                self._advance(g)
                g.stall_until = max(g.stall_until, self.t) + cfg.sync_s
                self._schedule(g)
            self.gen_sync_s += cfg.sync_s
            self._push(self.t + cfg.sync_s, "sync_done", step)
        else:
            self._on_sync_done(step)

    def _on_sync_done(self, step: int) -> None:
        if self._sync_needed(step):
            self.gen_version = step + 1
        self.trainer_busy = False
        self.t_free.append(self.t)
        self.snap.append((self.t, self.trainer_compute_s, self._gen_busy_total()))
        if self.cfg.mode == "ppo_off_policy" and self.ppo_round_left == 0 and self.steps_started < self.cfg.steps:
            self._start_ppo_round()
        self._fill()
        self._try_train()

    def _gen_busy_total(self) -> float:
        for g in self.gens:
            self._advance(g)
        return sum(g.busy_s for g in self.gens)

    def _start_ppo_round(self) -> None:
        cfg = self.cfg
        total = cfg.k * cfg.batch_samples
        base, extra = divmod(total, cfg.num_generators)
        for i, g in enumerate(self.gens):
            g.quota = base + (1 if i < extra else 0)
        self.ppo_round_left = cfg.k

    # ------------------------------------------------------------ generators
    def _on_gen(self, gid: int, epoch: int) -> None:
        g = self.gens[gid]
        if epoch != g.epoch:
            return
        self._advance(g)
        eps = 1e-9 * max(1.0, g.counter)
        while g.active and g.active[0][0] <= g.counter + eps:
            _, _, seq = heapq.heappop(g.active)
            seq.done = True
            self.completed.setdefault(seq.start_version, deque()).append(seq)
            self.completed_n += 1
        self._fill(only=g)
        self._schedule(g)
        self._try_train()

    # ------------------------------------------------------------ run
    def run(self) -> SimResult:
        cfg = self.cfg
        if cfg.mode == "ppo_off_policy":
            self._start_ppo_round()
        self._fill()
        guard = 0
        while self.events and len(self.t_free) < cfg.steps:
            t, _, kind, payload = heapq.heappop(self.events)
            self.t = t
            if kind == "gen":
                self._on_gen(*payload)
            elif kind == "train_done":
                self._on_train_done(payload)
            elif kind == "sync_done":
                self._on_sync_done(payload)
            guard += 1
            if guard > 50_000_000:  # pragma: no cover
                raise RuntimeError("simulator did not converge")
        if len(self.t_free) < cfg.steps:
            raise RuntimeError(f"simulation stalled after {len(self.t_free)} of {cfg.steps} steps")
        return self._result()

    def _result(self) -> SimResult:
        cfg = self.cfg
        w = cfg.warmup_steps
        t0, tc0, gb0 = (0.0, 0.0, 0.0) if w == 0 else self.snap[w - 1]
        t1, tc1, gb1 = self.snap[cfg.steps - 1]
        window = t1 - t0
        n_steps = cfg.steps - w
        trainer_idle = 1.0 - (tc1 - tc0) / window
        gen_idle = 1.0 - (gb1 - gb0) / (window * cfg.num_generators)
        gpu_idle = (trainer_idle * cfg.trainer_gpus + gen_idle * cfg.generator_gpus) / (
            cfg.trainer_gpus + cfg.generator_gpus)
        stale = Counter(s for step, s in self.consumed_log if step >= w)
        return SimResult(
            mode=cfg.mode,
            k=cfg.k,
            window_s=window,
            steps_measured=n_steps,
            samples_per_hour=n_steps * cfg.batch_samples * 3600.0 / window,
            trainer_idle_fraction=trainer_idle,
            generator_idle_fraction=gen_idle,
            gpu_idle_fraction=gpu_idle,
            staleness=dict(sorted(stale.items())),
            mean_step_period_s=window / n_steps,
        )


def simulate(cfg: SimConfig) -> SimResult:
    """Run one simulation (deterministic for a given ``cfg.seed``)."""
    return Simulator(cfg).run()


# ---------------------------------------------------------------------------- scenarios
def paper_layout(*, mode: str, k: int, scale: int = 1, **overrides: Any) -> SimConfig:
    """Paper App. A.3 layout (64 generator + 16 trainer GPUs, 48 x 16 sequences per step) times
    ``scale`` (batch and both GPU pools scaled together; the trainer's per-token time divides by
    ``scale``: data parallelism over ``scale`` times more trainer GPUs). Timing defaults are
    illustrative assumptions (8B on GB200-class GPUs), not measurements: calibrate for real numbers."""
    if scale < 1:
        raise ValueError(f"paper_layout: scale={scale} must be >= 1")
    d = SimConfig()
    base = SimConfig(mode=mode, k=k, batch_samples=768 * scale, num_generators=64 * scale,
                     trainer_gpus=16 * scale, train_per_token_s=d.train_per_token_s / scale)
    return replace(base, **overrides)
