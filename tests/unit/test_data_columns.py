"""Your own data: `data=jsonl` with `data.prompt_key` / `data.answer_key` / `data.template`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from test_data_build import _tokenizer_dir


def _cfg(tmp_path, tok_dir, **data):
    base = dict(name="jsonl", task="math", train_files=[], code_files=[], tokenizer_path=str(tok_dir), val_prompts=1,
                split_seed=0, max_prompt_tokens=2048, use_chat_template=True, template="", prompt_key="",
                answer_key="")
    return SimpleNamespace(data=SimpleNamespace(**{**base, **data}), model=SimpleNamespace(vocab_size=512),
                           length=SimpleNamespace(interruption_phrase="</think>"))


def test_jsonl_with_own_columns_and_template(tmp_path):
    from scalerl_mega.build import build_task

    tok_dir, _ = _tokenizer_dir(tmp_path, chat=False)
    f = tmp_path / "qa.jsonl"
    f.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "final": i + 1, "x": 0}) + "\n"
                         for i in range(4)))
    task = build_task(_cfg(tmp_path, tok_dir, train_files=[str(f)], prompt_key="question", answer_key="final",
                           template="Q: {problem}\nA:"))
    prompts = sorted(task.train_prompts + task.val_prompts, key=lambda p: p.text)
    assert [p.text for p in prompts] == [f"Q: What is {i} + 1?\nA:" for i in range(4)]
    assert [p.gold for p in prompts] == ["1", "2", "3", "4"] and {p.task for p in prompts} == {"math"}
    with pytest.raises(ValueError, match=r"missing field 'problem'"):  # default columns do not exist here
        build_task(_cfg(tmp_path, tok_dir, train_files=[str(f)], answer_key="final"))


@pytest.mark.parametrize("data, match", [
    (dict(template="no field"), r"data.template='no field': must contain \{problem\}"),
    (dict(template="{question}"), r"data.template='\{question\}': must be a format string"),
    (dict(task="poetry"), r"data.task='poetry' must be one of \['code', 'math'\]"),
    (dict(name="gsm8k"), r"data.name='gsm8k' is unknown"),
])
def test_data_key_errors_name_key_and_value(data, match):
    from scalerl_mega.data.columns import check_data_keys

    base = dict(name="jsonl", task="math", template="", prompt_key="", answer_key="")
    with pytest.raises(ValueError, match=match):
        check_data_keys(SimpleNamespace(**{**base, **data}))


def test_data_jsonl_composes(tmp_path):
    from test_hf_model_config import _compose

    c = _compose("experiment=demo", "data=jsonl", "data.prompt_key=q")
    assert (c.data.name, c.data.prompt_key, c.data.answer_key, c.data.task) == ("jsonl", "q", "answer", "math")
