"""Splicing environment messages into an episode's ids (the issue's "exact ids"): the opening is templated
once; every assistant turn keeps the ids the engine generated; every environment message becomes the ids the
chat template adds for it: the difference between templating the history with it and without it. That is
only sound when the template is prefix-preserving (templating a longer history never changes the ids of a
shorter one); `ChatSplicer` checks it once per tokenizer on probe conversations and refuses a template that is
not (e.g. Qwen3's, which strips the `<think>` blocks of earlier turns), naming it. A fixed template
(`FIXED_TEMPLATES`, or any Jinja file) replaces the tokenizer's own through `env.chat_template`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scalerl_mega.interfaces import Tokenizer
from scalerl_mega.jsonvalue import JSON

FIXED_TEMPLATES: dict[str, str] = {
    "arith": ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
              "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"),
    # The arithmetic tokenizer's (data/tasks/tokenizer.py): messages back to back, an assistant turn ends with
    # <eos>, no generation prompt; the opening of a one-message episode is the single-turn prompt's ids.
    "chatml": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # ChatML without any rewriting of earlier turns (SmolLM2-Instruct, Qwen2.5, Qwen3 without think-stripping).
}

Tools = list[dict[str, JSON]] | None
PROBE_USER = "1+2="
PROBE_REPLIES = ("3", "<think>1+2</think>3")
PROBE_ENV = "again"
_SENTINEL = "\u2063scalerl-sentinel\u2063"


class TemplateError(ValueError):
    """A chat template that cannot splice episodes exactly (message names the template and the fix)."""


def resolve_template(spec: str, tokenizer: Tokenizer) -> tuple[str, str]:
    """(Jinja source, its name for messages) of `env.chat_template`: empty -> the tokenizer's own, a name of
    `FIXED_TEMPLATES`, or a path to a Jinja file."""
    if not spec:
        source = getattr(tokenizer, "chat_template", None)
        if not source:
            raise TemplateError("the tokenizer has no chat template: set env.chat_template to one of "
                                f"{sorted(FIXED_TEMPLATES)} or to a Jinja file")
        return str(source), f"the tokenizer's chat template ({getattr(tokenizer, 'name_or_path', '') or 'unnamed'})"
    if spec in FIXED_TEMPLATES:
        return FIXED_TEMPLATES[spec], f"env.chat_template={spec!r}"
    path = Path(spec)
    if not path.is_file():
        raise TemplateError(f"env.chat_template={spec!r} is neither one of {sorted(FIXED_TEMPLATES)} nor a file")
    return path.read_text(), f"env.chat_template={spec!r}"


class ChatSplicer:
    """Templating for one tokenizer and template: the opening ids, and the environment ids that follow an
    assistant turn. Used by the episode driver and by the agent endpoint (`agent_server.py`), so both splice
    the same ids. Construction runs the prefix-preserving check (`check`) unless `check=False` (the endpoint
    checks each call and templates a call afresh when its template does not extend the previous one).
    `source` (Jinja text) replaces `template`."""

    def __init__(self, tokenizer: Tokenizer, *, template: str = "", stop_token_ids: Sequence[int] = (),
                 source: str | None = None, check: bool = True) -> None:
        self.tokenizer = tokenizer
        if source is not None:
            self.source, self.name = source, "the endpoint's chat_template"
        else:
            self.source, self.name = resolve_template(template, tokenizer)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        if check:
            self.check()

    def ids(self, messages: list[dict[str, JSON]], *, generation_prompt: bool, tools: Tools = None) -> list[int]:
        """The template's ids of `messages` (rendered as text, then tokenised without added specials)."""
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.source, tokenize=False, tools=tools,
                                                  add_generation_prompt=generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def opening(self, messages: list[dict[str, JSON]], *, tools: Tools = None) -> list[int]:
        """The episode's opening: its messages templated once, with the generation prompt."""
        return self.ids(messages, generation_prompt=True, tools=tools)

    def stop_id(self, output_ids: Sequence[int]) -> int | None:
        """The stop id a turn's generated ids end with (one of `stop_token_ids`), None when they were cut."""
        return int(output_ids[-1]) if output_ids and int(output_ids[-1]) in self.stop_token_ids else None

    def environment_ids(self, history: list[dict[str, JSON]], new: list[dict[str, JSON]], *,
                        stopped_with: int | None, tools: Tools = None) -> list[int]:
        """The ids to append after an assistant turn (the last message of `history`) for the environment's
        messages `new`: the rest of the assistant turn's closing (`closing_rest`), then the difference between
        templating `history + new` (with the generation prompt) and `history`. `stopped_with`: the stop id the
        engine's turn ended with, None when a length limit cut it. TemplateError when `history`'s ids are not
        a prefix."""
        before = self.ids(history, generation_prompt=False, tools=tools)
        after = self.ids([*history, *new], generation_prompt=True, tools=tools)
        self._require_prefix(before, after, what=f"appending {', '.join(m.get('role', '?') for m in new)} messages")
        return self.closing_rest(history[:-1], stopped_with=stopped_with, tools=tools) + after[len(before):]

    def closing(self, messages: list[dict[str, JSON]], *, tools: Tools = None) -> list[int]:
        """The ids the template puts after the content of an assistant message that follows `messages` (ChatML:
        `<|im_end|>` + newline; the arith template: `<eos>`)."""
        text = self.tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": _SENTINEL}],
                                                  chat_template=self.source, tokenize=False, tools=tools,
                                                  add_generation_prompt=False)
        at = text.rfind(_SENTINEL)
        tail = text[at + len(_SENTINEL):] if at >= 0 else ""
        return list(self.tokenizer(tail, add_special_tokens=False)["input_ids"]) if tail else []

    def closing_rest(self, messages: list[dict[str, JSON]], *, stopped_with: int | None,
                     tools: Tools = None) -> list[int]:
        """What follows a generated assistant turn (after `messages`) before the next message: the closing
        without its first id when the engine stopped on that id (it is among the generated ids), else the
        whole closing: after a length cut (max_tokens, an interruption's answer budget) and after a stop on
        another id (e.g. a stop string), which stays a generated id the template's closing follows."""
        closing = self.closing(messages, tools=tools)
        if stopped_with is not None and closing[:1] == [stopped_with]:
            return closing[1:]
        return closing

    def check(self) -> None:
        """The once-per-tokenizer check on probe conversations: the generation prompt is a prefix of the
        templated assistant turn, and an assistant-ended history is a prefix of it with an environment
        message appended (for a plain reply and one with a `<think>` block, with `user` and `tool` messages)."""
        user = [{"role": "user", "content": PROBE_USER}]
        for reply in PROBE_REPLIES:
            history = [*user, {"role": "assistant", "content": reply}]
            self._require_prefix(self.ids(user, generation_prompt=True), self.ids(history, generation_prompt=False),
                                 what="the assistant's reply after the generation prompt")
            for role in ("user", "tool"):
                try:
                    after = self.ids([*history, {"role": role, "content": PROBE_ENV}], generation_prompt=True)
                except Exception:  # noqa: BLE001 - a template without the tool role: checked when one is used
                    if role == "tool":
                        continue
                    raise
                self._require_prefix(self.ids(history, generation_prompt=False), after,
                                     what=f"appending a {role} message after an assistant reply {reply!r}")

    def _require_prefix(self, before: list[int], after: list[int], *, what: str) -> None:
        if after[:len(before)] == before:
            return
        at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        raise TemplateError(
            f"{self.name} is not prefix-preserving: {what} changes the ids of the earlier history at position {at} "
            f"(e.g. a template that strips earlier <think> blocks), so an episode cannot keep the engine's ids; "
            f"set env.chat_template to a fixed template ({', '.join(sorted(FIXED_TEMPLATES))}, or a Jinja file)")
