"""`env=single` as an episode: one prompt, one completion, scored by the reward group. It runs through the same
episode engine as `env=custom` and `env=agent` (`episodes.driver.EpisodeEngine`), so a run has one rollout path:
`OneTurn` is its runner, with no environment object, no opening messages (the driver opens on the prompt's own
ids, the task's tokenisation; no chat template is applied), and a `step` that ends the episode after its turn with
no reward of its own (`EpisodeSettings.reward_group`: the reward group scores the reply). Its calls do no I/O, so
they run inline (`episodes.pool.InlinePool`), never on a thread.
"""

from __future__ import annotations

from scalerl_mega.types import Prompt


class OneTurn:
    """The episode runner of `env=single` (see the module doc)."""

    target = "env=single"

    def task(self, prompt: Prompt) -> None:
        """Nothing for `reset`: the single-turn sample is the prompt itself (the dataset row is not looked at)."""
        return None

    def reset(self, task: None) -> tuple[None, list[dict]]:
        """No environment and no messages: the episode opens on the prompt's own ids."""
        return None, []

    def step(self, env: None, reply: str) -> tuple[list[dict], float, bool]:
        """Done after the one turn, with no reward of its own (the reward group's scores it)."""
        return [], 0.0, True
