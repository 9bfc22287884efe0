"""A step whose prompts the zero-variance filter all drops trains nothing, and the run says so: a console line per
such step (`step 3: all 8 prompts filtered (zero variance): nothing trained`), report.md's count, and a warning
line ending a run where no step trained anything (metrics/untrained.py). Driven through the RL loop with the
scripted engine and trainer (tests/support/scripted_loop.py): the reward decides which groups have variance."""

from __future__ import annotations

import logging

from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.metrics.untrained import no_training_warning, report_lines, untrained_step_line
from scalerl_mega.types import Prompt
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine, reward
from tests.unit.test_loop_phases import _cfg

B, STEPS = 8, 3
LOOP_LOG = "scalerl_mega.loop"


def all_wrong(prompts, texts):  # a random model: every sample fails, no group has variance
    return [(-1.0, False, "")] * len(texts)


def _run(tmp_path, reward_fn, caplog) -> tuple[list[tuple], list[str]]:
    cfg = _cfg(tmp_path, "off_policy=pipeline_rl", "off_policy.k=1", f"train.prompts_per_step={B}",
               f"train.steps={STEPS}", "train.val_every=0", "filter=zero_variance")
    engine = ScriptedEngine()
    comps = LoopComponents(engine=engine, trainer=RecordingTrainer(engine), reward_fn=reward_fn, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2],
                           stop_token_ids=[7])
    with caplog.at_level(logging.INFO, logger=LOOP_LOG):
        run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    return engine.log, [r.getMessage() for r in caplog.records if r.name == LOOP_LOG and r.levelno >= logging.WARNING]


def test_every_step_filtered_says_so_each_step_and_warns_at_the_end(tmp_path, caplog):
    log, warnings = _run(tmp_path, all_wrong, caplog)
    assert not [e for e in log if e[0] == "train"]  # the optimizer never stepped
    assert warnings == [f"step {s}: all 8 prompts filtered (zero variance): nothing trained" for s in (1, 2, 3)] + \
        [no_training_warning(3)]
    assert warnings[-1].startswith("no RL step trained anything: the zero-variance filter dropped every prompt of "
                                   "all 3 steps")
    from scalerl_mega.metrics.writer import read_metrics
    from scalerl_mega.report import write_report

    report = write_report(tmp_path).read_text()
    assert "- steps that trained nothing (every prompt filtered): 3 of 3 (step 1, 2, 3)" in report
    assert f"- WARNING: {no_training_warning(3)}" in report
    train = read_metrics(tmp_path / "metrics.jsonl", kind="train")
    assert [r["skipped_no_signal"] for r in train] == [1.0, 1.0, 1.0]


def test_a_run_whose_steps_train_says_nothing(tmp_path, caplog):
    log, warnings = _run(tmp_path, reward, caplog)  # sample 0 passes, sample 1 fails: every group has signal
    assert len([e for e in log if e[0] == "train"]) == STEPS and warnings == []
    from scalerl_mega.report import write_report

    assert "trained nothing" not in write_report(tmp_path).read_text()


def test_the_lines_by_hand():
    assert untrained_step_line(3, prompts=8, kept_prompts=0, zero_variance=True) == \
        "step 3: all 8 prompts filtered (zero variance): nothing trained"
    assert untrained_step_line(3, prompts=8, kept_prompts=1, zero_variance=True) is None
    records = [{"step": 1, "skipped_no_signal": 1.0}, {"step": 2}, {"step": 3, "skipped_no_signal": 1.0}]
    assert report_lines(records) == ["- steps that trained nothing (every prompt filtered): 2 of 3 (step 1, 3)"]
    assert report_lines([{"step": 1}]) == []
