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


def retry_agent(base_url: str, task: dict, *, feedback: str = " no ") -> float:
    """Agent code written against the OpenAI client (`env=agent`): asks, then asks again after the feedback `no`
    with the history sent back unchanged; the reward 1 when the second reply contains the answer, else -1."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": feedback + task["prompt"]}]
    second = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    return 1.0 if str(task["gold"]) in (second.choices[0].message.content or "") else -1.0


def box_retry_agent(base_url: str, task: dict) -> float:
    """`retry_agent` whose feedback is " no box ": b and x are outside the arith tokenizer's vocabulary."""
    return retry_agent(base_url, task, feedback=" no box ")


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


BARRIER: list[threading.Barrier] = []
"""The barrier `BarrierEnv` and `barrier_agent` wait on (set by the test; its timeout is a safety net)."""
GATE = threading.Event()
"""`GatedEnv`'s `wait` episodes block in their step until a `go` episode reaches its second step."""


class BarrierEnv:
    """Its one step blocks until every episode of the test is inside a step (`BARRIER[0]`): serial environment calls
    could never get there (the barrier breaks at its safety timeout and the step raises)."""

    def reset(self, task: dict) -> list[dict]:
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        BARRIER[0].wait()
        return [], 1.0, True


class GatedEnv:
    """Two turns. A `wait` episode's first step blocks on `GATE`; a `go` episode's second step opens it: it can only
    get there when its second generation ran while the other episode's tool call was blocked."""

    def __init__(self) -> None:
        self.n, self.mode, self.question = 0, "", ""

    def reset(self, task: dict) -> list[dict]:
        self.mode, self.question = task["mode"], task["prompt"]
        return [{"role": "user", "content": self.question}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        self.n += 1
        if self.mode == "wait":
            GATE.wait(120)  # a safety net only
            return [], 1.0, True
        if self.n == 2:
            GATE.set()
            return [], 1.0, True
        return [{"role": "user", "content": " no " + self.question}], 0.0, False


def barrier_agent(base_url: str, task: dict) -> float:
    """One call with the sync `openai` client, then blocking code (`BARRIER[0]`) that returns only when every
    agent of the test is inside it."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                   max_tokens=4)
    BARRIER[0].wait()
    return 1.0


class RowEnv:
    """Reads the dataset row's own column `final` (the row contract): reward 1 when it is "yes"."""

    def reset(self, task: dict) -> list[dict]:
        self.final = task["final"]
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        return [], 1.0 if self.final == "yes" else -1.0, True


def row_agent(base_url: str, task: dict) -> float:
    """The agent's view of the row contract: its own column `final`, no call needed."""
    return 1.0 if task["final"] == "yes" else -1.0


VERIFIERS_RECORD_VAR = "SCALERL_TEST_VERIFIERS_RECORD"
"""A file the verifiers agent appends what verifiers reported for each episode to (one JSON line)."""


def verifiers_addition_agent(base_url: str, task: dict) -> float:
    """A verifiers 0.4 taskset (`tests/support/verifiers_plugins/scalerl_vf_addition.py`) as `env=agent`, through
    `run_verifiers_episode`; what verifiers reported is appended to `$SCALERL_TEST_VERIFIERS_RECORD` under the
    endpoint's episode id (from the url)."""
    import dataclasses
    import json
    import os
    from pathlib import Path

    from scalerl_mega.episodes.verifiers_agent import run_verifiers_episode

    plugins = Path(__file__).resolve().parent / "verifiers_plugins"
    got = run_verifiers_episode(base_url, task, taskset="scalerl_vf_addition", plugin_path=[str(plugins)])
    episode_id = base_url.rstrip("/").split("/")[-2]
    with open(os.environ[VERIFIERS_RECORD_VAR], "a") as f:
        f.write(json.dumps({"episode_id": episode_id, **dataclasses.asdict(got)}) + "\n")
    return got.reward
