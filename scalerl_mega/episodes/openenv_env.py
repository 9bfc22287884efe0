"""An OpenEnv environment (`openenv` 0.10, the optional extra `[openenv]`) as an `env=custom` environment.

OpenEnv environments are servers reached over a WebSocket session with gym-style `reset(**kwargs)` /
`step(action)`, each answering an observation (a JSON object with `done` and `reward`). The trainer generates, so
an OpenEnv environment fits the `reset(task)` / `step(reply)` seam (episodes/env.py) as it is: one episode is one
session of openenv's own client (`openenv.core.GenericEnvClient(...).sync()`, dictionaries, no environment
package needed).

    scalerl-train env=custom env.custom._target_=scalerl_mega.episodes.openenv_env.OpenEnvEnvironment \
        +env.custom.kwargs.base_url=http://127.0.0.1:8000 +env.custom.kwargs.action_field=message \
        +env.custom.kwargs.observation_field=message

- `reset(task)`: opens a session and resets it with the task row's `reset_fields` as keyword arguments (default
  none: the server picks its own task); the observation's `observation_field` opens the episode as a user message.
- `step(reply)`: sends `{action_field: reply}`; the observation's `observation_field` is the next user message
  (none when it is done), its `reward` this turn's reward (None: 0), its `done` the end; the session closes when
  the episode ends.

The session's calls are blocking; they run on the episodes' own threads like any environment.
"""

from __future__ import annotations

from typing import Any


class OpenEnvEnvironment:
    """One episode = one session of an OpenEnv server at `base_url` (module doc)."""

    def __init__(self, *, base_url: str, action_field: str = "message", observation_field: str = "message",
                 reset_fields: tuple[str, ...] | list[str] = (), role: str = "user") -> None:
        if role not in ("user", "tool"):
            raise ValueError(f"env.custom.kwargs.role={role!r} must be 'user' or 'tool'")
        self.base_url, self.action_field, self.observation_field = base_url, action_field, observation_field
        self.reset_fields, self.role = tuple(reset_fields), role
        self.client: Any = None

    def reset(self, task: dict) -> list[dict]:
        from openenv.core import GenericEnvClient

        missing = [k for k in self.reset_fields if k not in task]
        if missing:
            raise KeyError(f"env.custom.kwargs.reset_fields names {missing}, which the task row does not have "
                           f"(it has {sorted(task)})")
        self.client = GenericEnvClient(base_url=self.base_url).sync()
        self.client.connect()
        result = self.client.reset(**{k: task[k] for k in self.reset_fields})
        return [{"role": "user", "content": self._text(result.observation)}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        result = self.client.step({self.action_field: reply})
        done = bool(result.done)
        reward = 0.0 if result.reward is None else float(result.reward)
        if done:
            self.close()
            return [], reward, True
        return [{"role": self.role, "content": self._text(result.observation)}], reward, False

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, dict) or self.observation_field not in observation:
            raise ValueError(f"the OpenEnv observation {observation!r} has no field {self.observation_field!r} "
                             f"(env.custom.kwargs.observation_field)")
        return str(observation[self.observation_field])
