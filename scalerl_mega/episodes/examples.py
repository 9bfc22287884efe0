"""Environments of the multi-turn demo (`experiment=demo_multiturn`) and of docs/extending.md."""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\{(-?\d+)\}")


class RetryArithmetic:
    """The synthetic addition task with a second try: a wrong answer gets the feedback `no` and the question
    again; a correct one ends the episode with `correct`, the last wrong one with `incorrect` (the episode's
    reward is their sum: `correct` when solved within `attempts`, else `incorrect`). An answer counts only
    after `</think>` (like the single-turn reward's `require_think`)."""

    def __init__(self, *, attempts: int = 2, correct: float = 1.0, incorrect: float = -1.0,
                 feedback: str = " no ") -> None:
        if attempts < 1:
            raise ValueError(f"env.custom.kwargs.attempts={attempts} must be >= 1")
        self.attempts, self.correct, self.incorrect, self.feedback = attempts, correct, incorrect, feedback
        self.question, self.gold, self.tries = "", "", 0

    def reset(self, task: dict) -> list[dict]:
        self.question, self.gold, self.tries = str(task["prompt"]), str(task["gold"]), 0
        return [{"role": "user", "content": self.question}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        self.tries += 1
        answer = BOXED.findall(reply.split("</think>", 1)[1]) if "</think>" in reply else []
        if answer and answer[-1] == self.gold:
            return [], self.correct, True
        if self.tries >= self.attempts:
            return [], self.incorrect, True
        return [{"role": "user", "content": self.feedback + self.question}], 0.0, False
