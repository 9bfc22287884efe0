"""Prompt sampling across epochs (paper Sec. 3.2 "Adaptive Prompt Filtering").

`no_positive_resampling`: a history of pass rates is kept per prompt, and a prompt whose pass rate
reaches >= `threshold` (0.9) is permanently removed from all subsequent epochs. The decision uses
the latest recorded pass rate (one group of G samples), not the cumulative mean: the paper's
premise is that "once a prompt becomes too easy for a policy, it typically remains easy", so the
prompt should go as soon as the current policy solves it; a cumulative mean would keep a prompt the
policy now solves for many epochs because of its early failures. The full history is kept (for
metrics and `pass_rate_history`).
`uniform`: every prompt is resampled every epoch (the ablation baseline).

Each epoch is a fresh permutation of the prompts still active at its start, drawn from
Random(seed, epoch), so a run is reproducible, and `state_dict()` / `load_state_dict()` capture the
position inside the current epoch: a resumed run samples exactly the sequence an uninterrupted run
would have.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from scalerl_mega.types import Prompt

CURRICULA = ("no_positive_resampling", "uniform")


class CurriculumExhausted(RuntimeError):
    """No-Positive-Resampling left fewer prompts than one step needs (all of them removed, or fewer than
    `min_active`): a batch would have to repeat a prompt."""


class Curriculum:
    """Implements loop.PromptSampler: `next_prompts`, `record`, `state_dict`, `load_state_dict`."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        *,
        name: str = "no_positive_resampling",
        pass_rate_threshold: float = 0.9,
        seed: int = 0,
        min_active: int = 1,
    ) -> None:
        """`min_active`: the fewest prompts an epoch may start with (the loop passes `train.prompts_per_step`):
        below it one step's batch would hold the same prompt several times, every epoch a few prompts long
        (the paper's 53k-prompt pool never gets there; a small pool that the policy learns does)."""
        if name not in CURRICULA:
            raise ValueError(f"curriculum.name={name!r} must be one of {CURRICULA}")
        if not 0.0 < pass_rate_threshold <= 1.0:
            raise ValueError(f"curriculum.pass_rate_threshold={pass_rate_threshold!r} must be in (0, 1]")
        if not prompts:
            raise ValueError("curriculum: no training prompts")
        self._by_id: dict[str, Prompt] = {}
        for p in prompts:
            if p.prompt_id in self._by_id:
                raise ValueError(f"curriculum: duplicate prompt_id {p.prompt_id!r}")
            self._by_id[p.prompt_id] = p
        self._ids = [p.prompt_id for p in prompts]
        self.name, self.threshold, self.seed = name, pass_rate_threshold, seed
        self.min_active = max(1, int(min_active))
        self.epoch = -1
        self._order: list[str] = []
        self._pos = 0
        self._removed: set[str] = set()
        self._history: dict[str, list[float]] = {}

    # -- sampling
    def _start_epoch(self) -> None:
        active = [i for i in self._ids if i not in self._removed]
        if not active:
            raise CurriculumExhausted(
                f"curriculum: all {len(self._ids)} prompts reached pass rate >= {self.threshold} and were removed"
            )
        if len(active) < self.min_active:
            raise CurriculumExhausted(
                f"curriculum: No-Positive-Resampling left {len(active)} of {len(self._ids)} training prompts "
                f"(the rest reached pass rate >= {self.threshold}), fewer than one step's {self.min_active} "
                f"(train.prompts_per_step): every batch would repeat them. Train on more prompts (data.*) or "
                f"use curriculum=uniform"
            )
        self.epoch += 1
        random.Random(f"{self.seed}:{self.epoch}").shuffle(active)
        self._order, self._pos = active, 0

    def next_prompts(self, n: int) -> list[Prompt]:
        """The next `n` prompts; crosses epoch boundaries (a new epoch drops removed prompts)."""
        out: list[Prompt] = []
        while len(out) < n:
            if self._pos >= len(self._order):
                self._start_epoch()
            out.append(self._by_id[self._order[self._pos]])
            self._pos += 1
        return out

    # -- pass-rate history
    def record(self, prompt_id: str, pass_rate: float) -> None:
        """Record one group's pass rate in [0, 1]; may remove the prompt from later epochs."""
        if prompt_id not in self._by_id:
            raise ValueError(f"curriculum.record: unknown prompt_id {prompt_id!r}")
        if not 0.0 <= pass_rate <= 1.0:
            raise ValueError(f"curriculum.record: pass_rate={pass_rate!r} not in [0, 1]")
        self._history.setdefault(prompt_id, []).append(float(pass_rate))
        if self.name == "no_positive_resampling" and pass_rate >= self.threshold:
            self._removed.add(prompt_id)

    def pass_rate_history(self, prompt_id: str) -> list[float]:
        return list(self._history.get(prompt_id, []))

    def is_removed(self, prompt_id: str) -> bool:
        return prompt_id in self._removed

    def metrics(self) -> dict[str, float]:
        return {
            "curriculum/epoch": float(max(self.epoch, 0)),
            "curriculum/active_prompts": float(len(self._ids) - len(self._removed)),
            "curriculum/removed_prompts": float(len(self._removed)),
        }

    # -- checkpointing
    def _fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self._ids).encode()).hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state: enough to continue the exact sampling sequence."""
        return {
            "version": 1,
            "name": self.name,
            "threshold": self.threshold,
            "seed": self.seed,
            "fingerprint": self._fingerprint(),
            "epoch": self.epoch,
            "order": list(self._order),
            "pos": self._pos,
            "removed": sorted(self._removed),
            "history": {k: list(v) for k, v in self._history.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1:
            raise ValueError(f"curriculum state: unsupported version {state.get('version')!r}")
        if state["fingerprint"] != self._fingerprint():
            raise ValueError("curriculum state: it was saved for a different prompt set (fingerprint mismatch)")
        for key, mine in (("name", self.name), ("seed", self.seed), ("threshold", self.threshold)):
            if state[key] != mine:
                raise ValueError(f"curriculum state: {key}={state[key]!r} but this curriculum has {mine!r}")
        self.epoch = int(state["epoch"])
        self._order = list(state["order"])
        self._pos = int(state["pos"])
        self._removed = set(state["removed"])
        self._history = {k: list(v) for k, v in state["history"].items()}
