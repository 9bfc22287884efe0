"""The names a `scalerl-train` command line may use, checked before Hydra composes: a misspelled key
of the typed config (`train.stepz=3`, also with Hydra's `+`, which would silently add it), a misspelled group
(`los=cispo`) or group option (`loss=cispoo`) is one line naming the closest valid name, instead of Hydra's advice
to append the typo with `+`.

    override_problem("train.stepz=3")   -> "unknown key 'train.stepz' (did you mean train.steps?)"
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from pathlib import Path
from typing import Any

from scalerl_mega.suggest import closest, did_you_mean

OPEN = "*"
"""A field whose value is free-form (typed Any, e.g. `reward.custom`): any key below it is valid."""


@functools.cache
def schema_tree(cls: type | None = None) -> dict[str, Any]:
    """The typed config's keys as a tree: dataclass fields become subtrees, free-form fields `OPEN`, the rest None."""
    if cls is None:
        from scalerl_mega.config.tree import TrainConfig

        cls = TrainConfig
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        if dataclasses.is_dataclass(t):
            out[f.name] = schema_tree(t)
        else:
            out[f.name] = OPEN if t is Any else None
    return out


def group_options(conf: Path) -> dict[str, list[str]]:
    """Config group -> its options: every `conf/<group>/**.yaml` as a path without `.yaml`."""
    return {d.name: sorted(str(p.relative_to(d).with_suffix("")) for p in d.rglob("*.yaml"))
            for d in sorted(conf.iterdir()) if d.is_dir()}


def _key_problem(key: str, tree: dict[str, Any]) -> str | None:
    node: Any = tree
    parts = key.split(".")
    for i, part in enumerate(parts):
        if node is OPEN:
            return None
        if not isinstance(node, dict):
            return f"'{'.'.join(parts[:i])}' has no keys below it (it is a value): {key!r}"
        if part not in node:
            best = closest(part, node)
            if best is not None:
                hint = f" (did you mean {'.'.join([*parts[:i], best, *parts[i + 1:]])}?)"
            else:
                hint = f"; the keys of {'.'.join(parts[:i]) or 'the config'}: {', '.join(sorted(node))}"
            return f"unknown key {key!r}{hint}"
        node = node[part]
    return None


def override_problem(arg: str, *, conf: Path | None = None) -> str | None:
    """What is wrong with the name in one command-line override (`key=value`, `+key=value`, `group=option`), or
    None: a key of the typed config, a config group and one of its options, or Hydra's own (`hydra.*`)."""
    if "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    key = key.lstrip("~+")
    if not key or key.startswith(("hydra.", "hydra/")) or key == "hydra":
        return None
    if conf is None:
        from scalerl_mega.conf_path import conf_dir

        conf = conf_dir()
    groups = group_options(conf)
    tree = schema_tree()
    if "." not in key and "/" not in key and key in groups:
        for option in value.split(","):  # one option, or a multirun sweep's list (`-m loss=cispo,dapo`)
            simple = re.fullmatch(r"[\w/.-]+", option) is not None
            if simple and option != "null" and option not in groups[key]:
                return (f"{key}={value}: no option {option!r} in conf/{key}/{did_you_mean(option, groups[key])}; "
                        f"options: {', '.join(groups[key])}")
        return None
    if "." not in key and key not in tree:
        hint = did_you_mean(key, [*groups, *tree])
        return f"unknown key or group {key!r}{hint}"
    return _key_problem(key, tree)
