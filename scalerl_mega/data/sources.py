"""Load prompts from JSONL, Parquet or Hugging Face `datasets` (local paths) (paper App. A.3:
Polaris-53K for math, Deepcoder for code).

A `SourceSchema` names the columns: Polaris-53K has `problem` / `answer`; Deepcoder has `problem` /
`tests`, where `tests` is a JSON string in the released dataset (LiveCodeBench, PrimeIntellect and
TACO variants; see `jsonvalue.normalize_tests`). Other datasets map their own column names.
Each row becomes a `Prompt` whose text is formatted for the model: through the tokenizer's chat
template when it has one, else through the task's plain template.

Every row either loads with its exact value or is reported as `file:line: reason`: bad JSON, not
UTF-8, over-long line, not an object, missing/null field, wrong type, empty value, non-finite or
too-large numbers, nesting deeper than `jsonvalue.MAX_DEPTH`, invalid Unicode (lone surrogates),
malformed or null tests (see `jsonvalue.normalize_tests`), and the same prompt appearing with two
different answers ("conflicting_duplicate": every row of that prompt is reported, none is loaded).
`on_error="raise"` raises the first such RowError (a ValueError); `on_error="skip"` never raises for a
row and reports the messages in `LoadResult.errors` and the counts per reason in
`LoadResult.counts`. File-level problems (missing, empty, a directory that is not a dataset, a file
that is not the format it claims) raise ValueError naming the path, either way.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl_mega.jsonvalue import BadValue, check_value, loads_strict, normalize_tests
from scalerl_mega.data.split import prompt_id_for
from scalerl_mega.interfaces import Tokenizer
from scalerl_mega.types import Prompt

MATH_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CODE_TEMPLATE = (
    "{problem}\n\nWrite a Python 3 solution. Read from standard input and write to standard output unless the "
    "problem names a function to implement. Put the final program in a single ```python code block."
)
DEFAULT_TEMPLATES = {"math": MATH_TEMPLATE, "code": CODE_TEMPLATE, "synthetic": "{problem}"}


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceSchema:
    """Which columns hold the problem and the reference, and which reward family scores them."""

    task: str
    prompt_key: str
    gold_key: str
    template: str | None = None
    """Plain prompt template with `{problem}`; None = the task's default (used without chat template)."""

    def __post_init__(self) -> None:
        if self.task not in DEFAULT_TEMPLATES:
            raise ValueError(f"schema.task={self.task!r} must be one of {sorted(DEFAULT_TEMPLATES)}")
        if self.template is not None and "{problem}" not in self.template:
            raise ValueError(f"schema.template must contain '{{problem}}', got {self.template!r}")


POLARIS = SourceSchema(task="math", prompt_key="problem", gold_key="answer")
DEEPCODER = SourceSchema(task="code", prompt_key="problem", gold_key="tests")
SCHEMAS = {"polaris": POLARIS, "deepcoder": DEEPCODER}


@dataclass(kw_only=True)
class LoadResult:
    prompts: list[Prompt]
    errors: list[str] = field(default_factory=list)
    """One message per skipped row (`file:line: reason`), only with on_error="skip"."""
    counts: dict[str, int] = field(default_factory=dict)
    """Skipped rows per reason kind (e.g. {"bad_json": 2, "conflicting_duplicate": 2})."""

    @property
    def num_skipped(self) -> int:
        return len(self.errors)


class RowError(ValueError):
    """A malformed row; the message starts with `file:line:`; `kind` names the reason class."""

    def __init__(self, msg: str, *, kind: str = "malformed") -> None:
        super().__init__(msg)
        self.kind = kind


def format_prompt(problem: str, *, task: str, tokenizer: Tokenizer | None = None, template: str | None = None) -> str:
    """The model's prompt text: chat template (one user turn + generation prompt) when the tokenizer
    has one, else the plain template of the task."""
    body = (template or DEFAULT_TEMPLATES[task]).format(problem=problem)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": body}], tokenize=False, add_generation_prompt=True
        )
    return body


# ------------------------------------------------------------------------------------ readers


def iter_jsonl(path: str | os.PathLike, *, max_line_bytes: int = 64 << 20) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) per non-blank line; raises RowError (file:line) on bad lines.
    A UTF-8 BOM at the start is accepted. Lines longer than `max_line_bytes` are errors and are not
    held in memory whole."""
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # skip the rest of the line
                    raw = f.readline(1 << 20)
                yield lineno, RowError(f"{path}:{lineno}: line longer than {max_line_bytes} bytes", kind="line_too_long")
                continue
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                # without its line break: a row cut short is then bad at its end, not "at column 1" of the next line
                yield lineno, loads_strict(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as e:
                yield lineno, RowError(f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start})", kind="not_utf8")
            except BadValue as e:
                yield lineno, RowError(f"{path}:{lineno}: {e}", kind=e.kind)


def iter_parquet(path: str | os.PathLike, *, columns: list[str] | None = None,
                 required: Sequence[str] = ()) -> Iterator[tuple[int, Any]]:
    """(row number starting at 1, row dict) of a Parquet file, read in record batches: `columns` (None: all of
    them, as episodes receive the whole row); `required` columns must exist."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    missing = [c for c in [*(columns or []), *required] if c not in pf.schema_arrow.names]
    if missing:
        raise RowError(f"{path}: missing column(s) {missing}; columns are {pf.schema_arrow.names}")
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=columns):
        for rec in batch.to_pylist():
            row += 1
            yield row, rec


def iter_hf(path: str | os.PathLike, *, split: str = "train") -> Iterator[tuple[int, Any]]:
    """Rows of a Hugging Face dataset on local disk: a `save_to_disk` directory
    (`datasets.load_from_disk`), or JSON/JSONL/Parquet files through `datasets.load_dataset`."""
    import datasets

    p = Path(path)
    if p.is_dir():
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise RowError(f"{path}: no split {split!r}; splits are {list(ds)}")
            ds = ds[split]
    else:
        builder = "parquet" if p.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(builder, data_files={split: str(p)}, split=split)
    for i, rec in enumerate(ds, start=1):
        yield i, rec


def _guarded(rows: Iterable[tuple[int, Any]], path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """Re-raise reader failures (pyarrow, `datasets`, OS errors) as ValueError naming the path."""
    it = iter(rows)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except RowError:
            raise
        except Exception as e:  # noqa: BLE001 - any reader failure is a file-level problem of `path`
            raise ValueError(f"{path}: cannot read as {fmt}: {type(e).__name__}: {str(e)[:300]}") from e
        yield item


def _detect_format(path: Path) -> str:
    if path.is_dir():
        return "hf"
    if path.suffix == ".parquet":
        return "parquet"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise ValueError(f"{path}: cannot tell the format from the name; pass fmt='jsonl'|'parquet'|'hf'")


# ------------------------------------------------------------------------------------ rows


def _gold_from_row(value: object, *, task: str, where: str, key: str) -> Any:
    """The gold answer: normalized tests (code), else a non-empty string. Numbers are converted
    (`str(int)` exactly; floats by `repr`); null, booleans and containers are rejected, so no gold
    ever reaches the math reward as a non-string."""
    if task == "code":
        try:
            tests = normalize_tests(value)
            check_value(tests)
        except BadValue as e:
            raise RowError(f"{where}: field {key!r}: {e}", kind=e.kind) from None
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise RowError(f"{where}: field {key!r}: {e}", kind="bad_tests") from None
        if not tests:
            raise RowError(f"{where}: field {key!r}: no tests", kind="bad_tests")
        return tests
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(f"{where}: field {key!r} must be a string or number, got {type(value).__name__}",
                       kind="wrong_type")
    try:
        check_value(value)
        gold = value.strip() if isinstance(value, str) else repr(value)
    except BadValue as e:
        raise RowError(f"{where}: field {key!r}: {e}", kind=e.kind) from None
    except ValueError as e:  # int over sys.get_int_max_str_digits() (Parquet/HF rows)
        raise RowError(f"{where}: field {key!r}: {e}", kind="bad_number") from None
    if not gold:
        raise RowError(f"{where}: field {key!r} is empty", kind="empty_field")
    return gold


def row_to_prompt(row: object, *, schema: SourceSchema, where: str, tokenizer: Tokenizer | None = None) -> Prompt:
    """One dataset row -> Prompt; RowError naming `where` (file:line) and the field on bad rows."""
    if not isinstance(row, dict):
        raise RowError(f"{where}: expected a JSON object, got {type(row).__name__}", kind="not_object")
    for key in (schema.prompt_key, schema.gold_key):
        if key not in row or row[key] is None:
            raise RowError(f"{where}: missing field {key!r} (row has {sorted(map(str, row))[:10]})",
                           kind="missing_field")
    problem = row[schema.prompt_key]
    if not isinstance(problem, str):
        raise RowError(f"{where}: field {schema.prompt_key!r} must be a string, got {type(problem).__name__}",
                       kind="wrong_type")
    try:
        check_value(problem)
    except BadValue as e:
        raise RowError(f"{where}: field {schema.prompt_key!r}: {e}", kind=e.kind) from None
    if not problem.strip():
        raise RowError(f"{where}: field {schema.prompt_key!r} is empty", kind="empty_field")
    gold = _gold_from_row(row[schema.gold_key], task=schema.task, where=where, key=schema.gold_key)
    return Prompt(
        prompt_id=prompt_id_for(schema.task, problem),
        text=format_prompt(problem, task=schema.task, tokenizer=tokenizer, template=schema.template),
        task=schema.task,
        gold=gold,
        meta={"source": where.rsplit(":", 1)[0], "row": where.rsplit(":", 1)[-1]},
        row=dict(row),
    )


def load_prompts(
    path: str | os.PathLike,
    *,
    schema: SourceSchema | str,
    fmt: str = "auto",
    on_error: str = "raise",
    tokenizer: Tokenizer | None = None,
    split: str = "train",
    max_line_bytes: int = 64 << 20,
) -> LoadResult:
    """Load every row of `path` as a Prompt (see module docstring for errors)."""
    if isinstance(schema, str):
        if schema not in SCHEMAS:
            raise ValueError(f"data schema {schema!r} unknown; choose one of {sorted(SCHEMAS)} or pass a SourceSchema")
        schema = SCHEMAS[schema]
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory")
    fmt = _detect_format(p) if fmt == "auto" else fmt
    if fmt in ("jsonl", "parquet") and not p.is_file():
        raise ValueError(f"{p}: is a directory, not a {fmt} file (a local HF dataset directory needs fmt='hf')")
    if fmt == "jsonl":
        rows = iter_jsonl(p, max_line_bytes=max_line_bytes)
    elif fmt == "parquet":
        rows = iter_parquet(p, required=[schema.prompt_key, schema.gold_key])
    elif fmt == "hf":
        rows = iter_hf(p, split=split)
    else:
        raise ValueError(f"fmt={fmt!r} must be 'auto', 'jsonl', 'parquet' or 'hf'")
    unit = "line" if fmt == "jsonl" else "row"
    loaded: list[tuple[str, Prompt]] = []  # (where, prompt)
    errors: list[RowError] = []
    n_rows = 0
    for lineno, row in _guarded(rows, p, fmt):
        n_rows += 1
        try:
            if isinstance(row, RowError):
                raise row
            where = f"{p}:{lineno}"
            loaded.append((where, row_to_prompt(row, schema=schema, where=where, tokenizer=tokenizer)))
        except RowError as e:
            if on_error == "raise":
                raise
            errors.append(e)
    prompts, dup_errors = _drop_conflicting_duplicates(loaded)
    if dup_errors and on_error == "raise":
        raise dup_errors[0]
    errors += dup_errors
    if n_rows == 0:
        raise ValueError(f"{p}: empty (no {unit}s with data)")
    if not prompts:
        raise ValueError(f"{p}: all {n_rows} {unit}s are malformed; first: {errors[0]}")
    return LoadResult(prompts=prompts, errors=[str(e) for e in errors], counts=dict(Counter(e.kind for e in errors)))


def _drop_conflicting_duplicates(loaded: list[tuple[str, Prompt]]) -> tuple[list[Prompt], list[RowError]]:
    """Rows with the same prompt and the same gold are kept (the split collapses them); a prompt seen
    with different golds is ambiguous, so all its rows are dropped, each reported naming the others."""
    by_id: dict[str, list[tuple[str, Prompt]]] = {}
    for where, prompt in loaded:
        by_id.setdefault(prompt.prompt_id, []).append((where, prompt))
    bad = {pid for pid, rows in by_id.items() if any(pr.gold != rows[0][1].gold for _, pr in rows)}
    errors = []
    for where, prompt in loaded:
        if prompt.prompt_id in bad:
            others = [w.rsplit(":", 1)[-1] for w, _ in by_id[prompt.prompt_id] if w != where]
            errors.append(RowError(f"{where}: conflicting duplicate: the same prompt has a different answer on "
                                   f"line(s) {', '.join(others[:5])} (this one: {str(prompt.gold)[:60]!r})",
                                   kind="conflicting_duplicate"))
    return [pr for _, pr in loaded if pr.prompt_id not in bad], errors
