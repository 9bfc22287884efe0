"""Environments used by the episode tests (importable by the reward pool's spawned workers)."""

from __future__ import annotations

import time


class ScriptedEnv:
    """Feedback `' no '` + the question for `turns - 1` turns (reward 0.25 each), then done with 1.0. The task's
    `mode` makes a call misbehave: `raise_reset`, `raise_step` (on the 2nd step), `sleep_step` (sleeps 30 s)."""

    def __init__(self, *, turns: int = 3, feedback: str = " no ") -> None:
        self.turns, self.feedback, self.n, self.mode, self.question = turns, feedback, 0, "", ""

    def reset(self, task: dict) -> list[dict]:
        self.mode, self.question = task.get("mode", ""), task["prompt"]
        if self.mode == "raise_reset":
            raise RuntimeError("reset failed on purpose")
        return [{"role": "user", "content": self.question}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        self.n += 1
        if self.mode == "raise_step" and self.n == 2:
            raise ValueError("step failed on purpose")
        if self.mode == "sleep_step":
            time.sleep(30)
        if self.n >= self.turns:
            return [], 1.0, True
        return [{"role": "user", "content": self.feedback + self.question}], 0.25, False
