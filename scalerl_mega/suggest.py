""""Did you mean ...?" for the command lines: a misspelled config key, group option or flag names the
closest valid one. Standard library only.

    did_you_mean("stepz", ["steps", "save_every"])      -> " (did you mean steps?)"
    SuggestingArgumentParser                              argparse, with the suggestion on an unknown flag or choice
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable
from typing import NoReturn


def closest(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice most like `word` (difflib's ratio, case-insensitive, at least `cutoff`), or None."""
    pool = {c.lower(): c for c in choices}
    best = difflib.get_close_matches(word.lower(), list(pool), n=1, cutoff=cutoff)
    return pool[best[0]] if best else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest choice, else an empty string."""
    best = closest(word, choices)
    return f" (did you mean {best}?)" if best else ""


class SuggestingArgumentParser(argparse.ArgumentParser):
    """argparse whose errors for an unknown option or an invalid choice name the closest valid one."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            flags = list(self._option_string_actions)
            hints = [f"{tok}{did_you_mean(tok.split('=', 1)[0], flags)}" if tok.startswith("-") else tok
                     for tok in message.split(":", 1)[1].split()]
            if any("did you mean" in h for h in hints):
                message = f"unrecognized arguments: {' '.join(hints)}"
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)) or m.group(2).split(", "))
        super().error(message)
