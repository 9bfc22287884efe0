"""Environments and agents used by the episode tests (they run on the episodes' own threads, in the test's
process: module-level events let a test hold them where it wants)."""

from __future__ import annotations

import threading

RELEASE = threading.Event()
"""`sleep_step` (and `hanging_agent`) block until a test sets this (their deadline must fire first)."""
BLOCKED = threading.Event()
"""Set by `sleep_step` / `hanging_agent` when they start blocking on `RELEASE`."""


class ManualClock:
    """A deadline clock that moves only when the test says (`advance`)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class ScriptedEnv:
    """Feedback `' no '` + the question for `turns - 1` turns (reward 0.25 each), then done with 1.0. The task's
    `mode` makes a call misbehave: `raise_reset`, `raise_step` (on the 2nd step), `sleep_step` (blocks until
    `RELEASE` is set)."""

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
            BLOCKED.set()
            RELEASE.wait(300)  # a safety net only: the test sets RELEASE
        if self.n >= self.turns:
            return [], 1.0, True
        return [{"role": "user", "content": self.feedback + self.question}], 0.25, False


def retry_agent(base_url: str, task: dict) -> float:
    """Agent code written against the OpenAI client (`env=agent`): asks, then asks again after the feedback `no`
    with the history sent back unchanged; the reward 1 when the second reply contains the answer, else -1."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": " no " + task["prompt"]}]
    second = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    return 1.0 if str(task["gold"]) in (second.choices[0].message.content or "") else -1.0


def raising_agent(base_url: str, task: dict) -> float:
    raise KeyError("agent failed on purpose")


def hanging_agent(base_url: str, task: dict) -> float:
    """Makes one call, then blocks (its own time, not generation) until `RELEASE` is set."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                   max_tokens=4)
    BLOCKED.set()
    RELEASE.wait(300)  # a safety net only: the test sets RELEASE
    return 1.0


OVERSIZED_SEEN: dict[str, dict] = {}
"""What `oversized_agent`'s refused calls got back (status, code, param, message)."""


def oversized_agent(base_url: str, task: dict) -> float:
    """Asks for more than the engine's sequence holds (max_tokens=16), then sends a malformed body, records the
    errors the real `openai` client raised, then makes a call that fits (max_tokens=4): reward 1."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    for name, kwargs in (("too_long", {"messages": messages, "max_tokens": 16}),
                         ("malformed", {"messages": [{"role": "user", "content": 3}], "max_tokens": 4})):
        try:
            client.chat.completions.create(model="policy", **kwargs)
        except BadRequestError as e:
            err = e.body if isinstance(e.body, dict) else {}
            OVERSIZED_SEEN[name] = {"status": e.status_code, **{k: err.get(k) for k in ("code", "param", "message")}}
    client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    return 1.0
