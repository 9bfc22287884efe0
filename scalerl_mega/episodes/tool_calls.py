"""Hermes / Qwen3 tool calls <-> OpenAI `tool_calls`. Pure: no I/O.

Qwen2.5/Qwen3 (and Hermes) chat templates list the tools in the system turn and have the model answer a call as

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

one block per call, possibly after some text. `parse_tool_calls` turns a reply into (content, OpenAI
`tool_calls`); a block that is not a JSON object with a string `name` stays in the content (the agent sees
what the model wrote). `template_tool_calls` goes back: an OpenAI assistant message's `tool_calls` (arguments
as a JSON string) in the form chat templates render (`{"name", "arguments": dict}`), and `format_tool_calls`
writes the Hermes text itself.
"""

from __future__ import annotations

import hashlib
import json
import re

from scalerl_mega.jsonvalue import JSON

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def parse_tool_calls(text: str, *, id_seed: str = "") -> tuple[str | None, list[dict[str, JSON]]]:
    """(content, tool_calls) of a generated reply. Content is the text outside the parsed blocks, stripped,
    None when it is empty and there are calls (OpenAI's convention). Call ids are `call_` + a hash of
    `id_seed`, the block's index and its text (stable for the same reply)."""
    calls: list[dict[str, JSON]] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _one_call(m.group(1))
        if call is None:
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        digest = hashlib.sha256(f"{id_seed}/{len(calls)}/{m.group(1)}".encode()).hexdigest()[:24]
        calls.append({"id": f"call_{digest}", "type": "function",
                      "function": {"name": call[0], "arguments": json.dumps(call[1], ensure_ascii=False)}})
    if not calls:
        return text, []
    kept.append(text[pos:])
    return "".join(kept).strip() or None, calls


def _one_call(body: str) -> tuple[str, JSON] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return obj["name"], args


def template_tool_calls(tool_calls: list[dict[str, JSON]], *, where: str) -> list[dict[str, JSON]]:
    """OpenAI `tool_calls` -> `[{"type": "function", "function": {"name", "arguments": dict}}]` as chat templates
    render them (Qwen's accepts either; a dict renders the same bytes as the model's JSON). ValueError
    naming `where` for a malformed entry."""
    out = []
    for i, tc in enumerate(tool_calls):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{where}.tool_calls[{i}] must be an object with function.name (a string)")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ValueError(f"{where}.tool_calls[{i}].function.arguments is not valid JSON: {args[:80]!r}"
                                 ) from None
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def format_tool_calls(tool_calls: list[dict[str, JSON]]) -> str:
    """The Hermes text of OpenAI `tool_calls` (one block per call, joined by newlines)."""
    blocks = []
    for tc in template_tool_calls(tool_calls, where="tool_calls"):
        fn = tc["function"]
        body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
        blocks.append(f"{OPEN}\n{body}\n{CLOSE}")
    return "\n".join(blocks)


def same_calls(a: list[dict[str, JSON]], b: list[dict[str, JSON]]) -> bool:
    """Two `tool_calls` lists name the same functions with equal (parsed) arguments, in order (ids ignored)."""
    try:
        ta, tb = template_tool_calls(a, where="a"), template_tool_calls(b, where="b")
    except ValueError:
        return False
    return [(t["function"]["name"], t["function"]["arguments"]) for t in ta] == [
        (t["function"]["name"], t["function"]["arguments"]) for t in tb]
