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

PROBE_USER = "1+2="
PROBE_REPLIES = ("3", "<think>1+2</think>3")
PROBE_ENV = "again"


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
    assistant turn. Construction runs the prefix-preserving check (`check`)."""

    def __init__(self, tokenizer: Tokenizer, *, template: str = "", stop_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.source, self.name = resolve_template(template, tokenizer)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.check()

    def ids(self, messages: list[dict[str, JSON]], *, generation_prompt: bool) -> list[int]:
        """The template's ids of `messages` (rendered as text, then tokenised without added specials)."""
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.source, tokenize=False,
                                                  add_generation_prompt=generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def opening(self, messages: list[dict[str, JSON]]) -> list[int]:
        """The episode's opening: its messages templated once, with the generation prompt."""
        return self.ids(messages, generation_prompt=True)

    def environment_ids(self, history: list[dict[str, JSON]], new: list[dict[str, JSON]], *,
                        ended_with_stop: bool) -> list[int]:
        """The ids to append after an assistant turn (the last message of `history`) for the environment's
        messages `new`: whatever the template closes the assistant turn with after its stop id (when the
        engine's turn ended with one), then the difference between templating `history + new` (with the
        generation prompt) and `history`. TemplateError when `history`'s ids are not a prefix."""
        before = self.ids(history, generation_prompt=False)
        after = self.ids([*history, *new], generation_prompt=True)
        self._require_prefix(before, after, what=f"appending {', '.join(m.get('role', '?') for m in new)} messages")
        return self.closing_tail(before, ended_with_stop=ended_with_stop) + after[len(before):]

    def closing_tail(self, ids: list[int], *, ended_with_stop: bool) -> list[int]:
        """The ids the template puts after the last stop id of an assistant-ended history (ChatML's newline
        after <|im_end|>): the engine stops at the stop id, so these are not among the generated ids."""
        if not ended_with_stop:
            return []
        for j in range(len(ids) - 1, -1, -1):
            if ids[j] in self.stop_token_ids:
                return ids[j + 1:]
        return []

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
