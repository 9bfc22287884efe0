"""A tiny verifiers 0.4 taskset for the verifiers bridge test (tests/integration/test_verifiers_rollouts.py), run
by `.venv-verifiers`' interpreter, never by the trainer's: one addition question per task, the trainer's own
prompt and gold; offline (no dataset download). Its two `@vf.reward` functions give a graded reward the test
recomputes from the engine's ids: `correct` (1 when the gold sum is in the reply) and `digits` (weight 0.5: the
share of the reply's characters that are digits)."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["AdditionTaskset"]


class AdditionData(vf.TaskData):
    gold: str = ""


class AdditionTask(vf.Task[AdditionData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: AdditionData, trace: vf.Trace) -> float:
        return 1.0 if task.gold and task.gold in trace.last_reply else 0.0

    @vf.reward(weight=0.5)
    async def digits(self, task: AdditionData, trace: vf.Trace) -> float:
        reply = trace.last_reply
        return sum(ch.isdigit() for ch in reply) / len(reply) if reply else 0.0


class AdditionTaskset(vf.Taskset[AdditionTask, vf.TasksetConfig]):
    def load(self):
        yield AdditionTask(AdditionData(prompt="Q:1+2=", gold="3"), self.config.task)
