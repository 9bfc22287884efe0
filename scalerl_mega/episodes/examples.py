"""Environments of the multi-turn demo (`experiment=demo_multiturn`) and of docs/extending.md."""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\{(-?\d+)\}")
SUM_PROMPT = re.compile(r"Q:(\d+)\+(\d+)=")


def final_answer(reply: str) -> str | None:
    """The reply's answer: the last `\\boxed{N}` after `</think>` (like the single-turn reward's `require_think`);
    None when it has none."""
    answer = BOXED.findall(reply.split("</think>", 1)[1]) if "</think>" in reply else []
    return answer[-1] if answer else None


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
        if final_answer(reply) == self.gold:
            return [], self.correct, True
        if self.tries >= self.attempts:
            return [], self.incorrect, True
        return [{"role": "user", "content": self.feedback + self.question}], 0.0, False


class LookupArithmetic:
    """Addition whose second number only the environment knows (the multi-turn demo): the opening shows
    `Q:47+k=`; a reply that holds the request word (`ask`) and no answer gets the message `k=38`, and only then
    can the sum be known. A reply with an answer (`\\boxed{N}` after `</think>`) ends the episode, `correct`
    when N is the sum, else `incorrect`; a reply with neither, or a request beyond `asks`, ends it `incorrect`.
    An answer given blind (before the lookup) passes only when it guesses the hidden number: for one opening,
    exactly one of the possible hidden numbers makes a given blind answer pass.

    Reads only `prompt` (the synthetic task's `Q:<a>+<b>=`) and `gold` of the row. Every message is in the
    synthetic tokenizer's alphabet (digits, `+`, `=`, `:`, `Q` and lower-case letters of its phrase)."""

    def __init__(self, *, placeholder: str = "k", request: str = "ask", asks: int = 1, correct: float = 1.0,
                 incorrect: float = -1.0) -> None:
        if asks < 1:
            raise ValueError(f"env.custom.kwargs.asks={asks} must be >= 1")
        if not placeholder or not request or any(ch.isdigit() for ch in placeholder + request):
            raise ValueError(f"env.custom.kwargs placeholder={placeholder!r} and request={request!r} must be "
                             "non-empty and hold no digit")
        self.placeholder, self.request, self.asks = placeholder, request, asks
        self.correct, self.incorrect = correct, incorrect
        self.a = self.b = self.gold = ""
        self.asked = 0

    def reset(self, task: dict) -> list[dict]:
        m = SUM_PROMPT.fullmatch(str(task["prompt"]).strip())
        if m is None:
            raise ValueError(f"LookupArithmetic: the row's prompt {task['prompt']!r} is not 'Q:<a>+<b>=' "
                             "(data=synthetic)")
        self.a, self.b, self.gold, self.asked = m.group(1), m.group(2), str(task["gold"]), 0
        return [{"role": "user", "content": f"Q:{self.a}+{self.placeholder}="}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        answer = final_answer(reply)
        if answer is not None:
            return [], self.correct if answer == self.gold else self.incorrect, True
        if self.request in reply and self.asked < self.asks:
            self.asked += 1
            return [{"role": "user", "content": f"{self.placeholder}={self.b}"}], 0.0, False
        return [], self.incorrect, True

    def reference_replies(self, task: dict) -> list[str]:
        """The replies of the protocol for `task` (the warm start's traces, episodes/demonstrations.py): the
        request, then the synthetic task's column-by-column trace for the sum."""
        from scalerl_mega.data.tasks.arith import target_text

        m = SUM_PROMPT.fullmatch(str(task["prompt"]).strip())
        if m is None:
            raise ValueError(f"LookupArithmetic: the row's prompt {task['prompt']!r} is not 'Q:<a>+<b>='")
        return [self.request, target_text(int(m.group(1)), int(m.group(2)))]


class PythonTool:
    """A sandboxed Python tool for chat models (the SmolLM2 example, docs/extending.md): a reply holding a
    ```python block is run in the code reward's sandbox (rewards/sandbox.py: no network, no host files,
    time and memory limits) and its output comes back as a `tool` message; a reply without one is the final
    answer, scored `correct` when its last number equals the task's `gold`, else `incorrect`. `system`: the
    system message that opens every episode."""

    CODE = re.compile(r"```(?:python|py)\n(.*?)```", re.S)
    NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

    SYSTEM = ("You can run Python: write a ```python block and you will get its output. Give the final answer as a "
              "number without code.")

    def __init__(self, *, time_limit_s: float = 5.0, max_output_chars: int = 400, correct: float = 1.0,
                 incorrect: float = -1.0, system: str = SYSTEM) -> None:
        self.time_limit_s, self.max_output_chars, self.system = time_limit_s, max_output_chars, system
        self.correct, self.incorrect, self.gold, self.question = correct, incorrect, "", ""

    def reset(self, task: dict) -> list[dict]:
        self.gold, self.question = str(task["gold"]), str(task["prompt"])
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.question}]

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        code = self.CODE.findall(reply)
        if code:
            from scalerl_mega.rewards.sandbox import SandboxLimits, run_python

            res = run_python({"main.py": code[-1]}, ["main.py"], limits=SandboxLimits(time_limit_s=self.time_limit_s))
            out = (res.stdout or res.stderr).decode("utf-8", "replace")[-self.max_output_chars:]
            if res.timed_out:
                out = f"timed out after {self.time_limit_s:g} s"
            return [{"role": "tool", "content": out}], 0.0, False
        numbers = self.NUMBER.findall(reply)
        ok = bool(numbers) and float(numbers[-1]) == float(self.gold)
        return [], self.correct if ok else self.incorrect, True
