"""`python -m tests.support.openenv_server PORT`: a real OpenEnv 0.10 environment server (openenv's own FastAPI app
and WebSocket sessions, served by uvicorn) for the adapter's test: a guessing game. `reset(question=...)` answers
the question as the observation; `step(message)` is done with reward 1 when the message contains `<eos>`-free text
"4", else it answers " no " + the question with reward 0, done after `TRIES` steps with reward -1."""

from __future__ import annotations

import sys
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, create_fastapi_app
from openenv.core.env_server.types import State

TRIES = 2


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    message: str = ""


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.question, self.tries, self._state = "", 0, State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.question, self.tries = str(kwargs.get("prompt", "Q:2+2=")), 0
        return GuessObservation(message=self.question)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self.tries += 1
        if "4" in action.message:
            return GuessObservation(message="", done=True, reward=1.0)
        if self.tries >= TRIES:
            return GuessObservation(message="", done=True, reward=-1.0)
        return GuessObservation(message=" no " + self.question, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def main() -> None:
    import uvicorn

    app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=16)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")


if __name__ == "__main__":
    main()
