"""Which files, columns and template a dataset run reads (`data.*` keys; conf/data/*.yaml).

    data=polaris    problem / answer columns, math reward (paper Sec. 2: Polaris-53K)
    data=deepcoder  problem / tests columns, code reward (paper Sec. 5)
    data=math_code  both: `data.train_files` Polaris-schema, `data.code_files` Deepcoder-schema
    data=jsonl      your own files: `data.task` (math | code) picks the reward family, and
                    `data.prompt_key` / `data.answer_key` name the columns

`data.prompt_key` / `data.answer_key` rename the columns of `data.train_files` for every dataset;
`data.template` (must contain `{problem}`) replaces the task's plain prompt template, and is also the
user turn when the tokenizer's chat template is used. Example (conf/data/jsonl.yaml documents it):

    scalerl-train model=hf init_from_hf=/ckpt data=jsonl data.train_files=[/data/qa.jsonl] \\
        data.prompt_key=question data.answer_key=final 'data.template="Q: {problem}\\nA:"'
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from scalerl_mega.data.sources import SCHEMAS, SourceSchema

if TYPE_CHECKING:
    from scalerl_mega.config import DataConfig

DATASET_SCHEMAS = {"polaris": ("polaris",), "deepcoder": ("deepcoder",), "math_code": ("polaris", "deepcoder"),
                   "jsonl": (None,)}
"""data.name -> the schema of `data.train_files` (and, for math_code, of `data.code_files`); None:
built from `data.task` and the column keys."""

TASK_SCHEMA = {"math": "polaris", "code": "deepcoder"}


def train_schema(data: DataConfig) -> SourceSchema:
    """The `SourceSchema` of `data.train_files` after the column / template keys are applied."""
    name = str(data.name)
    if name not in DATASET_SCHEMAS:
        raise ValueError(f"data.name={name!r} is unknown; expected synthetic or one of {sorted(DATASET_SCHEMAS)}")
    base_name = DATASET_SCHEMAS[name][0]
    if base_name is None:
        task = str(getattr(data, "task", "math") or "math")
        if task not in TASK_SCHEMA:
            raise ValueError(f"data.task={task!r} must be one of {sorted(TASK_SCHEMA)} (the reward family)")
        base_name = TASK_SCHEMA[task]
    changes = {}
    if str(getattr(data, "prompt_key", "") or ""):
        changes["prompt_key"] = str(data.prompt_key)
    if str(getattr(data, "answer_key", "") or ""):
        changes["gold_key"] = str(data.answer_key)
    return _with_template(dataclasses.replace(SCHEMAS[base_name], **changes), data)


def _with_template(schema: SourceSchema, data: DataConfig) -> SourceSchema:
    template = str(getattr(data, "template", "") or "")
    if not template:
        return schema
    check_template(template)
    return dataclasses.replace(schema, template=template)


def check_template(template: str, *, key: str = "data.template") -> None:
    """ValueError (key, value, rule) unless `template` is a format string with exactly `{problem}`."""
    try:
        template.format(problem="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{key}={template!r}: must be a format string whose only field is {{problem}} "
                         f"(write literal braces as {{{{ }}}}); {type(exc).__name__}: {exc}") from None
    if "{problem}" not in template:
        raise ValueError(f"{key}={template!r}: must contain {{problem}}")


def data_sources(data: DataConfig) -> list[tuple[str, list[str], SourceSchema]]:
    """(config key, files, schema) for every file list the run reads."""
    out = [("data.train_files", list(data.train_files), train_schema(data))]
    if str(data.name) == "math_code":
        out.append(("data.code_files", list(data.code_files), _with_template(SCHEMAS["deepcoder"], data)))
    return out


def check_data_files(data: DataConfig) -> list[tuple[str, list[str], SourceSchema]]:
    """`data_sources(data)` after checking every list is non-empty and every file exists."""
    from pathlib import Path

    sources = data_sources(data)
    for key, files, _ in sources:
        if not files:
            raise ValueError(f"{key} is empty: data.name={data.name!r} needs at least one file")
        for f in files:
            if not Path(f).exists():
                raise ValueError(f"{key}: {f!r}: no such file or directory")
    return sources


def check_data_rows(data: DataConfig) -> int:
    """Read every row of every data file once, as the run will (`sources.load_prompts`, which raises on the first
    bad row: `file:line: reason`, e.g. bad JSON or a missing column), and check the held-out split leaves prompts
    to train on. ValueError naming the key; returns the number of distinct prompts. Prompt texts are formatted
    without the tokenizer's chat template here (it changes the text, not which rows load)."""
    from scalerl_mega.data.sources import load_prompts
    from scalerl_mega.data.split import check_held_out

    ids: set[str] = set()
    for key, files, schema in check_data_files(data):
        for f in files:
            try:
                ids.update(p.prompt_id for p in load_prompts(f, schema=schema).prompts)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
    check_held_out(len(ids), num_val=int(data.val_prompts))
    return len(ids)


def check_data_keys(data: DataConfig) -> None:
    """Compose-time checks of the data keys (no file is opened)."""
    if str(data.name) != "synthetic":
        train_schema(data)
    elif str(getattr(data, "template", "") or ""):
        check_template(str(data.template))


__all__ = ["DATASET_SCHEMAS", "check_data_files", "check_data_keys", "check_data_rows", "data_sources",
           "train_schema"]
