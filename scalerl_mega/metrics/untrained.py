"""Steps that trained nothing, said where a user looks: the zero-variance filter (paper Sec. 3.2 "Zero-Variance
Filtering") drops every prompt whose samples all got the same reward; when it drops all of a step's prompts the
optimizer does not step (the loop's `skipped_no_signal`), which a run of a random model (every sample wrong) does
at every step. The console's line for such a step, report.md's count, and the warning that ends a run where no
step trained anything. Pure text from the step's numbers and the run's metrics records (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

UNTRAINED_KEY = "skipped_no_signal"
"""The metrics-line key the loop sets to 1.0 on a step whose batch kept no prompt."""


def untrained_step_line(step: int, *, prompts: int, kept_prompts: int, zero_variance: bool) -> str | None:
    """The console line of a step (1-based) whose batch kept none of its `prompts`; None when it trained."""
    if kept_prompts:
        return None
    why = "filtered (zero variance)" if zero_variance else "without a trainable sample"
    return f"step {step}: all {prompts} prompts {why}: nothing trained"


def untrained_steps(train: Sequence[Mapping[str, float]]) -> list[int]:
    """The steps of the run's train metrics records (one per step, `step` 1-based) that trained nothing."""
    return [int(r["step"]) for r in train if r.get(UNTRAINED_KEY)]


def no_training_warning(steps: int) -> str:
    """The line that ends a run of `steps` RL steps none of which trained anything."""
    return (f"no RL step trained anything: the zero-variance filter dropped every prompt of all {steps} steps "
            "(each prompt's samples all got the same reward, e.g. all wrong), so the policy is unchanged; a warm "
            "start (sft.steps) or easier prompts give samples that differ (filter=none trains on them with zero "
            "advantages, a zero loss)")


def report_lines(train: Sequence[Mapping[str, float]]) -> list[str]:
    """report.md's "- ..." lines: how many steps trained nothing (which ones), and the warning when none trained;
    [] when every step trained."""
    skipped = untrained_steps(train)
    if not skipped:
        return []
    shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
    lines = [f"- steps that trained nothing (every prompt filtered): {len(skipped)} of {len(train)} (step {shown})"]
    if len(skipped) == len(train):
        lines.append(f"- WARNING: {no_training_warning(len(train))}")
    return lines
