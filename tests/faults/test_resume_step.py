"""After a damaged newest checkpoint the load falls back to the previous one, and the step that
load takes is the one the start banner, provenance.jsonl and the finished-run check report (they used to read the
`latest` pointer: "resuming at step 4" while step 2 was loaded).

Checkpoints here are directories in the checkpoint module's own layout (tests/support/fake_checkpoint.py), damaged
by a bit flip; that `loadable_step` agrees with the real Megatron load on every kind of damage is tested on real
checkpoints in test_checkpoint_faults.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.metrics.provenance import read_segments
from scalerl_mega.trainer.megatron.checkpoint import latest_step, loadable_step
from scalerl_mega.types import Prompt
from tests.support.fake_checkpoint import flip_a_bit, save_fake_checkpoint
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine, reward


def _two_checkpoints(out: Path, *, damage_newest: bool) -> Path:
    root = out / "checkpoints"
    save_fake_checkpoint(root, 2)
    newest = save_fake_checkpoint(root, 4)
    if damage_newest:
        flip_a_bit(newest)
    return root


def test_loadable_step_is_the_previous_checkpoint_when_the_newest_is_damaged(tmp_path):
    root = _two_checkpoints(tmp_path, damage_newest=False)
    assert latest_step(root) == loadable_step(root) == 4
    flip_a_bit(root / "step_00000004")
    assert (latest_step(root), loadable_step(root)) == (4, 2)  # `latest` still names 4; the load takes 2
    flip_a_bit(root / "step_00000002")
    assert loadable_step(root) is None
    assert loadable_step(tmp_path / "nothing") is None


def test_start_banner_reports_the_step_the_load_takes(tmp_path):
    from tests.unit.test_rerun_finished import _config

    from scalerl_mega.run_dir import start_banner

    _two_checkpoints(tmp_path, damage_newest=True)
    line = start_banner(_config(tmp_path, 80)).splitlines()[3]
    assert line.startswith("  steps   resuming at step 2 (the newest checkpoint, step 4, is damaged) of 80 RL"), line
    flip_a_bit(tmp_path / "checkpoints" / "step_00000002")
    line = start_banner(_config(tmp_path, 80)).splitlines()[3]
    assert "no checkpoint verifies" in line and "resuming at step" not in line, line


def test_finished_run_check_uses_the_loadable_step(tmp_path):
    from tests.unit.test_rerun_finished import _config

    from scalerl_mega.train import _finished_run

    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4}))
    root = _two_checkpoints(tmp_path, damage_newest=False)
    assert _finished_run(_config(tmp_path, 4), out=tmp_path) == {"steps": 4, "exit_status": 0}
    flip_a_bit(root / "step_00000004")  # the resume would load step 2: two steps are left to train
    assert _finished_run(_config(tmp_path, 4), out=tmp_path) is None


class _FallbackTrainer(RecordingTrainer):
    """Keeps every save's extra state by step; `load` returns the state of step `loads`, as
    `load_checkpoint` does when the newest checkpoint is damaged."""

    def __init__(self, engine, *, loads: int | None = None):
        super().__init__(engine, saved={})
        self.by_step: dict[int, dict] = {}
        self.loads = loads

    def save(self, path, *, step=None, extra_state=None):
        self.by_step[step] = copy.deepcopy(extra_state)
        save_fake_checkpoint(Path(path), step)

    def load(self, path):
        return copy.deepcopy(self.by_step[self.loads])


def _launch(out: Path, trainer: _FallbackTrainer, *, steps: int) -> dict:
    from tests.unit.test_loop_phases import _cfg

    from scalerl_mega.preemption import Preemption
    from scalerl_mega.train import _run_rl

    cfg = _cfg(out, f"train.steps={steps}", "train.save_every=2")
    comps = LoopComponents(engine=trainer.engine, trainer=trainer, reward_fn=reward, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2],
                           stop_token_ids=[7])
    summary: dict = {}
    state = _run_rl(cfg, comps, summary, out=out, world=1, preemption=Preemption(), started=0.0)
    summary["state_step"] = state.step
    return summary


def test_provenance_records_the_step_the_loop_loaded(tmp_path):
    engine = ScriptedEngine()
    first = _FallbackTrainer(engine)
    assert _launch(tmp_path, first, steps=4)["from_step"] == 0
    assert sorted(first.by_step) == [2, 4] and latest_step(tmp_path / "checkpoints") == 4
    flip_a_bit(tmp_path / "checkpoints" / "step_00000004")
    second = _FallbackTrainer(ScriptedEngine(), loads=2)
    second.by_step = first.by_step
    summary = _launch(tmp_path, second, steps=6)
    assert summary["from_step"] == 2 and summary["state_step"] == 6
    assert [seg["steps"] for seg in read_segments(tmp_path)] == [[0, 4], [2, 6]]
