"""Where a run's files go: everything of a run under its output directory.

`output_dir` holds the run's checkpoints, metrics, report.md and run_config.yaml; Hydra writes the run's
`train.log` and `.hydra/` to its own run directory (`hydra.run.dir`, by default `outputs/<run_name>/seed<seed>`,
which is also `output_dir`'s default). A command line that sets `output_dir=X` alone would leave those two in
the default folder, where a later run appends to another run's train.log and overwrites its `.hydra/`; so
`output_dir=X` sets `hydra.run.dir=X` too (`follow_output_dir`), and two different folders are refused.
Messages that point at the log name its real path (`log_file`).
"""

from __future__ import annotations

import logging
import os

RUN_DIR_KEY = "hydra.run.dir"
MULTIRUN_FLAGS = ("-m", "--multirun")


def override_value(argv: list[str], key: str) -> str | None:
    """The (last) value text of `key=VALUE` on a Hydra command line, also written `+key=` / `++key=`."""
    value = None
    for a in argv:
        name, eq, rest = a.partition("=")
        if eq and name.lstrip("+") == key:
            value = rest
    return value


def follow_output_dir(argv: list[str]) -> list[str]:
    """`argv` with `hydra.run.dir` following `output_dir=X` (appended as the same value text, so Hydra's quoting
    rules apply alike); unchanged for a multirun (each point has its own folder) or without `output_dir=`.
    ValueError when both are given and name different folders."""
    out = override_value(argv, "output_dir")
    if out is None or any(a in MULTIRUN_FLAGS for a in argv):
        return list(argv)
    run = override_value(argv, RUN_DIR_KEY)
    if run is None:
        return [*argv, f"{RUN_DIR_KEY}={out}"]
    if os.path.normpath(run.strip("'\"")) != os.path.normpath(out.strip("'\"")):
        raise ValueError(f"output_dir={out} and {RUN_DIR_KEY}={run} name different folders: the run's train.log "
                         f"and .hydra/ would go to {run}, its checkpoints and report.md to {out}; give output_dir "
                         "alone (hydra.run.dir follows it)")
    return list(argv)


def log_file() -> str | None:
    """The file this process logs to (the first file handler of the root logger: Hydra's `<run dir>/train.log`),
    None when it logs to no file."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None


def in_log_file(what: str = "logged above") -> str:
    """`what`, naming the log file when there is one: 'logged above and in /runs/x/train.log'."""
    path = log_file()
    return f"{what} and in {path}" if path else what
