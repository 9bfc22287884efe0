"""Data sources: JSONL / Parquet / HF datasets, schemas, column mapping, malformed rows with file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl_mega.data.sources import (
    DEEPCODER,
    POLARIS,
    SourceSchema,
    format_prompt,
    load_prompts,
)
from scalerl_mega.data.split import prompt_id_for


def write(path: Path, text: str | bytes) -> Path:
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def jl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def test_polaris_jsonl(tmp_path):
    f = write(tmp_path / "p.jsonl", jl({"problem": "What is 1+1?", "answer": "2"}, {"problem": "Half?", "answer": 0.5}))
    res = load_prompts(f, schema="polaris")
    assert [p.gold for p in res.prompts] == ["2", "0.5"]
    p = res.prompts[0]
    assert p.task == "math" and p.prompt_id == prompt_id_for("math", "What is 1+1?")
    assert p.text.startswith("What is 1+1?") and "\\boxed{}" in p.text
    assert p.meta == {"source": str(f), "row": "1"}


@pytest.mark.parametrize(
    "content,line,reason",
    [
        (jl({"problem": "a", "answer": "1"}, '{"problem": "b", "answer": '), 2, "bad JSON"),
        (jl({"problem": "a", "answer": "1"}, {"problem": "b"}), 2, "missing field 'answer'"),
        (jl({"problem": 5, "answer": "1"}), 1, "field 'problem' must be a string"),
        (jl({"problem": "a", "answer": ["1"]}), 1, "field 'answer' must be a string or number"),
        (jl({"problem": "a", "answer": True}), 1, "field 'answer' must be a string or number"),
        (jl({"problem": "  ", "answer": "1"}), 1, "field 'problem' is empty"),
        (jl({"problem": "a", "answer": ""}), 1, "field 'answer' is empty"),
        (jl({"problem": "a", "answer": "1"}, "\n", "[1, 2]"), 4, "expected a JSON object"),
        (b"{\"problem\": \"a\", \"answer\": \"\xff\"}\n", 1, "not UTF-8"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, content, line, reason):
    f = write(tmp_path / "bad.jsonl", content)
    with pytest.raises(ValueError) as e:
        load_prompts(f, schema=POLARIS)
    assert str(e.value).startswith(f"{f}:{line}: ")
    assert reason in str(e.value)


def test_skip_counts_and_reports(tmp_path):
    f = write(tmp_path / "mixed.jsonl",
              jl({"problem": "a", "answer": "1"}, "{oops", {"problem": "b"}, {"problem": "c", "answer": "3"}))
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    assert [p.gold for p in res.prompts] == ["1", "3"]
    assert res.num_skipped == 2
    assert res.errors[0].startswith(f"{f}:2: bad JSON") and res.errors[1].startswith(f"{f}:3: missing field")


def test_empty_file_and_blank_lines(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        load_prompts(write(tmp_path / "e.jsonl", ""), schema=POLARIS)
    with pytest.raises(ValueError, match="empty"):
        load_prompts(write(tmp_path / "b.jsonl", "\n  \n"), schema=POLARIS)
    with pytest.raises(ValueError, match="all 1 lines are malformed"):
        load_prompts(write(tmp_path / "m.jsonl", "{x\n"), schema=POLARIS, on_error="skip")


def test_bom_is_accepted(tmp_path):
    f = write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + jl({"problem": "a", "answer": "1"}).encode())
    assert load_prompts(f, schema=POLARIS).prompts[0].gold == "1"


def test_huge_line(tmp_path):
    big = json.dumps({"problem": "x" * 5000, "answer": "1"})
    f = write(tmp_path / "huge.jsonl", jl({"problem": "a", "answer": "1"}, big, {"problem": "c", "answer": "3"}))
    with pytest.raises(ValueError, match=f"{f}:2: line longer than 1000 bytes"):
        load_prompts(f, schema=POLARIS, max_line_bytes=1000)
    res = load_prompts(f, schema=POLARIS, max_line_bytes=1000, on_error="skip")
    assert [p.gold for p in res.prompts] == ["1", "3"] and res.num_skipped == 1


def test_deepcoder_schema_tests_json_string(tmp_path):
    tests = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])
    taco = json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})
    f = write(tmp_path / "dc.jsonl", jl({"problem": "Add.", "tests": tests}, {"problem": "Double.", "tests": taco},
                                        {"problem": "Bad.", "tests": "[{"}))
    res = load_prompts(f, schema=DEEPCODER, on_error="skip")
    assert [p.gold for p in res.prompts] == [[{"input": "1 2\n", "output": "3\n"}], [{"input": "2\n", "output": "4\n"}]]
    assert res.prompts[0].task == "code" and "```python" in res.prompts[0].text
    assert res.errors[0].startswith(f"{f}:3: field 'tests': tests: not valid JSON")


def test_column_mapping_and_template(tmp_path):
    schema = SourceSchema(task="math", prompt_key="question", gold_key="final", template="Solve: {problem}")
    f = write(tmp_path / "other.jsonl", jl({"question": "2+2", "final": 4}))
    p = load_prompts(f, schema=schema).prompts[0]
    assert (p.text, p.gold) == ("Solve: 2+2", "4")
    with pytest.raises(ValueError, match="template"):
        SourceSchema(task="math", prompt_key="q", gold_key="a", template="no placeholder")
    with pytest.raises(ValueError, match="schema.task"):
        SourceSchema(task="poetry", prompt_key="q", gold_key="a")


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "p.parquet"
    pq.write_table(pa.table({"problem": ["a", "b", None], "answer": ["1", "2", "3"]}), f)
    with pytest.raises(ValueError, match=f"{f}:3: missing field 'problem'"):
        load_prompts(f, schema=POLARIS)
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    assert [p.gold for p in res.prompts] == ["1", "2"] and res.num_skipped == 1


def test_hf_datasets_local(tmp_path):
    import datasets

    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert [p.gold for p in load_prompts(tmp_path / "saved", schema=POLARIS).prompts] == ["1", "2"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    assert len(load_prompts(tmp_path / "dd", schema=POLARIS, fmt="hf").prompts) == 2
    f = write(tmp_path / "p.jsonl", jl(*rows))
    assert [p.gold for p in load_prompts(f, schema=POLARIS, fmt="hf").prompts] == ["1", "2"]


def test_chat_template_when_the_tokenizer_has_one():
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    tok = build_arith_tokenizer()
    assert format_prompt("Q:1+2=", task="synthetic", tokenizer=tok) == "Q:1+2="  # no chat template
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}" \
                        "{% if add_generation_prompt %}[assistant]{% endif %}"
    assert format_prompt("2+2?", task="math", tokenizer=tok) == (
        "[user]2+2?\n\nPlease reason step by step, and put your final answer within \\boxed{}.[assistant]")


def test_unknown_schema_and_format(tmp_path):
    f = write(tmp_path / "p.txt", "x")
    with pytest.raises(ValueError, match="schema"):
        load_prompts(f, schema="nope")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_prompts(f, schema=POLARIS)
    with pytest.raises(ValueError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl", schema=POLARIS)
