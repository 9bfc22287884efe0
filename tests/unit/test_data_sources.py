"""Data sources: JSONL / Parquet / HF datasets, schemas, column mapping, malformed rows with file:line."""

from __future__ import annotations

import json
import re
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


# ---------------------------------------------------------------- hostile rows

DEEP = '{"problem": "a", "answer": "1", "x": ' + "[" * 5000 + "]" * 5000 + "}"


@pytest.mark.parametrize(
    "line,kind,reason",
    [
        ('{"problem": "a", "answer": NaN}', "bad_number", "non-finite number NaN"),
        ('{"problem": "a", "answer": Infinity}', "bad_number", "non-finite number Infinity"),
        ('{"problem": "a", "answer": 1e400}', "bad_number", "out of range"),
        ('{"problem": "a", "answer": ' + "9" * 5000 + "}", "bad_number", "5000 digits is too large"),
        (DEEP, "too_deep", "nesting deeper than"),
        ('{"problem": "a", "answer": ' + "[" * 70 + "]" * 70 + "}", "too_deep", "nesting deeper than 64"),
        ('{"problem": "a\\ud800b", "answer": "1"}', "bad_unicode", "invalid Unicode"),
        ('{"problem": "a", "answer": "\\udc00"}', "bad_unicode", "invalid Unicode"),
        ('{"problem": "a", "answer": null}', "missing_field", "missing field 'answer'"),
    ],
)
def test_hostile_values_are_row_errors_in_both_modes(tmp_path, line, kind, reason):
    good = json.dumps({"problem": "ok", "answer": "7"})
    f = write(tmp_path / "h.jsonl", good + "\n" + line + "\n" + good.replace("ok", "ok2") + "\n")
    with pytest.raises(ValueError) as e:
        load_prompts(f, schema=POLARIS)
    assert str(e.value).startswith(f"{f}:2: ") and reason in str(e.value), str(e.value)
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    assert [p.gold for p in res.prompts] == ["7", "7"]
    assert res.counts == {kind: 1} and res.errors[0].startswith(f"{f}:2: ")


def test_numbers_load_with_their_exact_value(tmp_path):
    f = write(tmp_path / "n.jsonl", jl({"problem": "a", "answer": 12345678901234567890123}, {"problem": "b", "answer": 1e-7},
                                       {"problem": "c", "answer": -0.25}))
    assert [p.gold for p in load_prompts(f, schema=POLARIS).prompts] == ["12345678901234567890123", "1e-07", "-0.25"]


CODE_BAD = [
    ({"inputs": ["1\n"], "outputs": [None]}, "null output"),
    ([{"input": "1\n", "output": None}], "null output"),
    ([{"input": None, "output": "1"}], "null output"),
    ({"fn_name": "f", "inputs": ["abc"], "outputs": [["x"]]}, "call arguments must be a list"),
    ({"fn_name": "f", "inputs": [[1]], "outputs": [[None]]}, "null expected output"),
    ({"inputs": "12", "outputs": "12"}, "must be lists"),
    ([{"fn_name": "f", "args": [1]}], "null expected output"),
    ([{"input": {"a": 1}, "output": "1"}], "expected text"),
    ('[{"input": "1", "output": NaN}]', "non-finite"),
    ([{"input": "[1]\n2", "output": "NaN", "testtype": "functional", "metadata": {"func_name": "f"}}], "non-finite"),
]


@pytest.mark.parametrize("tests,reason", CODE_BAD, ids=[r for _, r in CODE_BAD])
def test_code_tests_that_would_be_wrong_are_reported(tmp_path, tests, reason):
    raw = tests if isinstance(tests, str) else json.dumps(tests)
    f = write(tmp_path / "c.jsonl", jl({"problem": "good", "tests": json.dumps([{"input": "1", "output": "1"}])},
                                       {"problem": "bad", "tests": raw}))
    res = load_prompts(f, schema=DEEPCODER, on_error="skip")
    assert len(res.prompts) == 1 and len(res.errors) == 1
    assert res.errors[0].startswith(f"{f}:2: field 'tests': ") and reason in res.errors[0], res.errors[0]


def test_taco_argument_forms_load_right():
    from scalerl_mega.rewards.code import normalize_tests

    taco = {"fn_name": "f", "inputs": [["abc"], [[1, 2], 3], []], "outputs": [["cba"], [[3, 4]], [7]]}
    assert normalize_tests(taco) == [
        {"fn_name": "f", "args": ["abc"], "expected": "cba"},
        {"fn_name": "f", "args": [[1, 2], 3], "expected": [3, 4]},
        {"fn_name": "f", "args": [], "expected": 7}]
    assert normalize_tests({"inputs": [["1", "2"], 3], "outputs": ["3", [4, 5]]}) == [
        {"input": "1\n2", "output": "3"}, {"input": "3", "output": "4\n5"}]


def test_conflicting_duplicates_are_reported_and_dropped(tmp_path):
    f = write(tmp_path / "d.jsonl", jl({"problem": "same", "answer": "1"}, {"problem": "other", "answer": "5"},
                                       {"problem": "same", "answer": "2"}, {"problem": "other", "answer": "5"}))
    with pytest.raises(ValueError, match=f"{f}:1: conflicting duplicate: .* line\\(s\\) 3"):
        load_prompts(f, schema=POLARIS)
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    # the identical duplicate of "other" loads (the split collapses it); both "same" rows are reported
    assert [p.gold for p in res.prompts] == ["5", "5"]
    assert res.counts == {"conflicting_duplicate": 2}
    assert res.errors[0].startswith(f"{f}:1:") and res.errors[1].startswith(f"{f}:3:")


def test_skip_mode_counts_per_reason(tmp_path):
    f = write(tmp_path / "m.jsonl", jl({"problem": "a", "answer": "1"}, "{oops", "{also bad", {"problem": "b"},
                                       '{"problem": "c", "answer": NaN}'))
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    assert res.counts == {"bad_json": 2, "missing_field": 1, "bad_number": 1} and res.num_skipped == 4


def test_file_level_problems_name_the_path(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cases = {
        write(tmp_path / "empty.parquet", b""): "cannot read as parquet",
        write(tmp_path / "json.parquet", jl({"problem": "a", "answer": "1"})): "cannot read as parquet",
        write(tmp_path / "binary.jsonl", b"PAR1\x00\xff\xfe" * 10): "not UTF-8|all 1 lines are malformed",
    }
    (tmp_path / "notds").mkdir()
    write(tmp_path / "notds" / "x.txt", "hi")
    cases[tmp_path / "notds"] = "cannot read as hf"
    (tmp_path / "dir.jsonl").mkdir()
    cases[tmp_path / "dir.jsonl"] = "cannot read as hf"  # a directory is taken for a local HF dataset
    pq.write_table(pa.table({"question": ["a"]}), tmp_path / "cols.parquet")
    cases[tmp_path / "cols.parquet"] = "missing column"
    for path, reason in cases.items():
        for mode in ("raise", "skip"):
            with pytest.raises(ValueError) as e:
                load_prompts(path, schema=POLARIS, on_error=mode)
            assert str(e.value).startswith(f"{path}") and re.search(reason, str(e.value)), (path, mode, str(e.value))
    with pytest.raises(ValueError, match=f"{tmp_path / 'notds'}: is a directory, not a jsonl file"):
        load_prompts(tmp_path / "notds", schema=POLARIS, fmt="jsonl")


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_bad_json_names_the_column_in_the_row(tmp_path, eol):
    """The column of a bad row is counted in that row: a row cut short is bad just past its last character
    (it said "at column 1", the next line's, when the line break was parsed with the row), a missing comma
    where the next key starts."""
    cut = '{"problem": "1+1", "answer": '  # 29 characters: nothing after the last colon and space
    missing = '{"problem": "x" "answer": "2"}'  # the second key starts at column 17
    good = json.dumps({"problem": "2+2", "answer": "4"})
    f = write(tmp_path / "bad.jsonl", (cut + eol + missing + eol + good + eol).encode())
    res = load_prompts(f, schema=POLARIS, on_error="skip")
    assert res.errors == [f"{f}:1: bad JSON (Expecting value at column {len(cut) + 1})",
                          f"{f}:2: bad JSON (Expecting ',' delimiter at column 17)"]
