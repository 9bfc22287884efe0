"""episodes/tool_calls.py: Hermes/Qwen3 `<tool_call>` blocks <-> OpenAI `tool_calls`."""

from __future__ import annotations

import json

import pytest

from scalerl_mega.episodes.tool_calls import format_tool_calls, parse_tool_calls, same_calls, template_tool_calls


def test_blocks_become_openai_tool_calls_and_the_rest_stays_content():
    text = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
            '<tool_call>{"name": "mul", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>')
    content, calls = parse_tool_calls(text, id_seed="ep")
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add", "mul"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 2, "b": 3}, {"x": [1, 2]}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert parse_tool_calls(text, id_seed="ep")[1] == calls  # ids are stable for the same reply


def test_only_calls_no_content_and_plain_text_untouched():
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>')[0] is None
    assert parse_tool_calls("  just text  ") == ("  just text  ", [])
    # not JSON / not an object with a string name: left in the content as the model wrote it
    bad = 'a <tool_call>{"name": 3}</tool_call> b <tool_call>oops</tool_call>'
    assert parse_tool_calls(bad) == (bad, [])
    content, calls = parse_tool_calls(bad + '<tool_call>{"name": "g"}</tool_call>')
    assert content == bad.strip() and calls[0]["function"] == {"name": "g", "arguments": "{}"}


def test_back_to_the_template_form_and_the_hermes_text():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert template_tool_calls(calls, where="m") == [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    text = format_tool_calls(calls)
    assert text == '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, back = parse_tool_calls(text)
    assert content is None and same_calls(back, calls)
    assert not same_calls(back, [{"function": {"name": "add", "arguments": '{"a": 2, "b": 4}'}}])
    with pytest.raises(ValueError, match=r"m.tool_calls\[0\].function.arguments is not valid JSON"):
        template_tool_calls([{"function": {"name": "f", "arguments": "{oops"}}], where="m")
    with pytest.raises(ValueError, match=r"m.tool_calls\[0\] must be an object with function.name"):
        template_tool_calls([{"function": {"arguments": "{}"}}], where="m")
