"""Validation spread over a window (`train.val_mode=window`, metrics/val_window.py): the held-out prompts of one
point are generated one slice per step, on that step's weights, and the point is drawn at the window's centre.
Hand-worked slicing and metrics; the loop on a scripted engine (one completion per poll: the interleaving is
forced) whose validation samples pass exactly when the weight version that delivered them is odd, so every
point's expected value is computed from the engine's own log, not from the code under test; resume mid-window
after a checkpoint, after a preemption without one (the lost slice is generated again) and during a
validation (the point is recorded by the resumed run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalerl_mega.loop as loop_mod
import scalerl_mega.heldout as validation_mod
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.metrics.val_window import center_step, val_metrics, window_slice
from scalerl_mega.scaling.io import read_series
from scalerl_mega.types import Prompt
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine
from tests.unit.test_loop_phases import _cfg

W, N_VAL, SAMPLES, B, G, STEPS = 2, 4, 2, 2, 2, 4


def test_window_slices_cover_every_prompt_once():
    assert [list(window_slice(10, width=4, position=j)) for j in range(4)] == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert [list(window_slice(3, width=5, position=j)) for j in range(5)] == [[], [0], [], [1], [2]]
    with pytest.raises(ValueError, match="position 4 outside a window of width 4"):
        window_slice(10, width=4, position=4)
    assert center_step(end=20, width=20) == 10 and center_step(end=7, width=1) == 7 and center_step(end=9, width=3) == 8


def test_val_metrics_by_hand():
    # [index, domain, passed, reward, truncated, mean version]
    got = val_metrics([[0, "math", 1, 1.0, 0, 3.0], [0, "math", 0, -1.0, 1, 4.0],
                       [1, "code", 1, 1.0, 0, 4.0], [1, "code", 1, 1.0, 0, 5.0]], expected_prompts=3)
    assert got == {"val/code_pass_rate": 1.0, "val/code_samples": 2.0, "val/math_pass_rate": 0.5,
                   "val/math_samples": 2.0, "val_pass_rate": 0.75, "val_reward_mean": 0.5,
                   "val_truncation_rate": 0.25, "val_prompts": 2.0, "val_samples_per_prompt": 2.0,
                   "val_version_mean": 4.0, "val_prompts_missing": 1.0}
    with pytest.raises(ValueError, match="no validation samples"):
        val_metrics([])


def _reward(prompts, texts):
    out = []
    for p, t in zip(prompts, texts):
        ok = (ord(t[1]) - 100) % 2 == 1 if p.prompt_id.startswith("v") else t.startswith("\x01")
        out.append((1.0 if ok else 0.0, ok, ""))
    return out


def _launch(tmp_path, saved, *overrides, stop_at=None, stop_after_save_at=None, stop_during_val_at=None):
    """One launch of the loop; a stop request (SIGTERM) at the end of step `stop_at`, just after the
    checkpoint of step `stop_after_save_at` was written, or once step `stop_during_val_at`'s validation waits
    for a slice still in flight (the engine's next poll)."""
    cfg = _cfg(tmp_path, "off_policy=pipeline_rl", "off_policy.k=1", "length=interruption", "train.val_mode=window",
               f"train.val_every={W}", f"data.val_samples={SAMPLES}", *overrides)
    engine = ScriptedEngine(stamp_version=True)
    comps = LoopComponents(engine=engine, trainer=RecordingTrainer(engine, saved), reward_fn=_reward, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id=f"v{i}", text="v", task="synthetic", gold="") for i in range(N_VAL)],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2], stop_token_ids=[7])
    flag = {"stop": False, "step": 0}

    def on_step(step, rec):
        flag["stop"], flag["step"] = step == stop_at, step

    save = comps.trainer.save

    def save_then_stop(path, *, step=None, extra_state=None):
        save(path, step=step, extra_state=extra_state)
        flag["stop"] = step == stop_after_save_at

    comps.trainer.save = save_then_stop
    real_collect = loop_mod.collect

    def collect_then_stop(router, comps_, cfg_):  # the loop's wait for the window's last slices
        if flag["step"] == stop_during_val_at and any(len(c) < SAMPLES for c in router.val.values()):
            flag["stop"] = True
        return real_collect(router, comps_, cfg_)

    loop_mod.collect = validation_mod.collect = collect_then_stop  # window mode waits in the loop, point in validate

    try:
        state = run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False), on_step=on_step,
                       stop_requested=lambda: flag["stop"])
    finally:
        loop_mod.collect = validation_mod.collect = real_collect
    return engine.log, state


def _val_deliveries(log):
    return [e for e in log if e[0] == "deliver" and e[1].startswith("v")]


def _lines(tmp_path, kind):
    rows = [json.loads(x) for x in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_each_step_generates_its_slice_and_the_point_is_their_mean(tmp_path):
    log, state = _launch(tmp_path, None)
    trains = [i for i, e in enumerate(log) if e[0] == "train"]
    subs = [(i, e) for i, e in enumerate(log) if e[0] == "submit" and e[1].startswith("v")]
    point0, window = subs[: N_VAL * SAMPLES], subs[N_VAL * SAMPLES:]
    assert all(i < trains[0] and e[2] == 0 for i, e in point0)  # step 0: the whole set, version 0
    for s in range(STEPS):  # then at the start of step s: the slice of position s % W, on weights s
        mine = [(i, e) for i, e in window if (trains[s - 1] if s else 0) < i < trains[s]]
        assert sorted(e[1] for _, e in mine) == sorted(f"v{j}#s{k}" for j in window_slice(N_VAL, width=W, position=s % W)
                                                       for k in range(SAMPLES))
        assert {e[2] for _, e in mine} == {s}
    # expected points from the engine's log: deliveries in submission order, passed <=> odd delivering version
    deliv = _val_deliveries(log)
    per_point = N_VAL * SAMPLES
    lines = _lines(tmp_path, "validation")
    assert [r["step"] for r in lines] == [0, 2, 4]
    trains_by_step = {r["step"]: r for r in _lines(tmp_path, "train")}
    for k, r in enumerate(lines):
        chunk = deliv[k * per_point:(k + 1) * per_point]
        assert r["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in chunk) / per_point)
        assert r["val_version_mean"] == pytest.approx(sum(e[2] for e in chunk) / per_point)
        assert r["val_prompts"] == N_VAL and r["val_samples_per_prompt"] == SAMPLES
        if k:  # window points carry the centre step's compute
            centre = r["step"] - W // 2
            assert r["val_center_step"] == centre and r["val_window_steps"] == W
            assert r["compute_device_hours"] == trains_by_step[centre]["compute_device_hours"]
    assert 0 < lines[2]["val_pass_rate"] < 1  # versions 3 and 4 deliver it: a mixed window, not a constant
    s = read_series(tmp_path, x="sum:samples")  # cumulative x at the centre: B*G samples per step
    assert s.compute.tolist() == [0.0, 1.0 * B * G, 3.0 * B * G]
    assert [p[0] for p in state.val_points] == [0, 2, 4]


def test_resume_mid_window_after_a_checkpoint_keeps_the_whole_window(tmp_path):
    saved: dict = {}
    log1, st1 = _launch(tmp_path, saved, "train.save_every=1", stop_after_save_at=3)
    assert st1.preempted and st1.step == 3
    log2, _ = _launch(tmp_path, saved, "train.save_every=1")
    last = _lines(tmp_path, "validation")[-1]
    assert last["step"] == 4 and last["val_prompts"] == N_VAL and "val_prompts_missing" not in last
    # slice of step 2 (delivered by the first launch) + slice of step 3 (the second launch)
    chunk = _val_deliveries(log1)[2 * N_VAL * SAMPLES:] + _val_deliveries(log2)
    assert len(chunk) == N_VAL * SAMPLES
    assert last["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in chunk) / len(chunk))


def test_preemption_without_checkpoint_generates_the_lost_slice_again(tmp_path):
    """SIGTERM after step 3 with no checkpoint since the window began: the slice of step 3 (submitted at its
    start) is in flight and lost with the first launch; the resumed launch generates it again, on weights 3,
    before step 4, and the point at 4 has every prompt."""
    saved: dict = {}
    log1, st1 = _launch(tmp_path, saved, "train.save_every=0", stop_at=3)
    assert st1.preempted and st1.step == 3 and not st1.val_due
    log2, _ = _launch(tmp_path, saved, "train.save_every=0")
    last = _lines(tmp_path, "validation")[-1]
    assert last["step"] == 4 and last["val_prompts"] == N_VAL and "val_prompts_missing" not in last
    subs = [e for e in log2 if e[0] == "submit" and e[1].startswith("v")]
    first_train = next(i for i, e in enumerate(log2) if e[0] == "train")
    again = {e[1] for e in log2[:first_train] if e[0] == "submit" and e[1].startswith("v") and e[2] == 3}
    assert again >= {f"v{j}#s{k}" for j in window_slice(N_VAL, width=W, position=0) for k in range(SAMPLES)}
    assert len(subs) == N_VAL * SAMPLES  # the regenerated slice + step 3's own slice: the whole point
    chunk = _val_deliveries(log2)
    assert last["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in chunk) / len(chunk))


def test_stop_during_a_window_end_validation_records_that_point_on_resume(tmp_path):
    """SIGTERM while the loop waits for the last slices of a window (step 2's validation; checkpoints every step,
    so the window's first slice was scored at step 1's): the run stops with the point due, and the resumed run
    records it first, from the scored slice plus the others generated again, then a clean next window. (Before,
    the point was lost and its scored slice leaked into the next window's point: 1.5x its samples.)"""
    saved: dict = {}
    log1, st1 = _launch(tmp_path, saved, "train.save_every=1", stop_during_val_at=2)
    assert st1.preempted and st1.step == 2 and st1.val_due
    assert [r["step"] for r in _lines(tmp_path, "validation")] == [0]
    log2, _ = _launch(tmp_path, saved, "train.save_every=1")
    lines = _lines(tmp_path, "validation")
    assert [r["step"] for r in lines] == [0, 2, 4]
    for r in lines:
        assert r["val_prompts"] == N_VAL and r["val_samples_per_prompt"] == SAMPLES and "val_prompts_missing" not in r
    # step 2's point: the slice scored at step 1's checkpoint (first launch) + every prompt not scored, generated
    # again by the second launch before its first step (the rest of the first launch's deliveries were lost)
    first = set(window_slice(N_VAL, width=W, position=0))
    kept = [e for e in _val_deliveries(log1)[N_VAL * SAMPLES:] if int(e[1][1:].split("#")[0]) in first]
    redone = _val_deliveries(log2)[: N_VAL * SAMPLES - len(kept)]
    assert len(kept) == len(first) * SAMPLES and {int(e[1][1:].split("#")[0]) for e in redone} == set(range(N_VAL)) - first
    chunk = kept + redone
    assert lines[1]["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in chunk) / len(chunk))
    assert lines[1]["val_center_step"] == 1
    # step 4's point: only the second window's slices
    second = _val_deliveries(log2)[len(redone):]
    assert len(second) == N_VAL * SAMPLES
    assert lines[2]["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in second) / len(second))


def test_stop_during_a_point_validation_redoes_it_on_the_same_weights(tmp_path):
    """train.val_mode=point: the interrupted validation of step 2 is run again by the resumed launch, on the
    checkpoint's weights (version 2), before step 3."""
    saved: dict = {}
    _, st1 = _launch(tmp_path, saved, "train.val_mode=point", "train.save_every=1", stop_during_val_at=2)
    assert st1.preempted and st1.step == 2 and st1.val_due
    log2, _ = _launch(tmp_path, saved, "train.val_mode=point", "train.save_every=1")
    lines = _lines(tmp_path, "validation")
    assert [r["step"] for r in lines] == [0, 2, 4]
    redone = _val_deliveries(log2)[: N_VAL * SAMPLES]
    first_train = next(i for i, e in enumerate(log2) if e[0] == "train")
    assert all(log2.index(e) < first_train and e[2] == 2 for e in redone)  # before step 3, on weights 2
    assert lines[1]["val_pass_rate"] == pytest.approx(sum(e[2] % 2 for e in redone) / len(redone)) == 0.0
    assert lines[1]["val_version_mean"] == 2.0


def test_val_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="train.val_mode"):
        _cfg(tmp_path, "train.val_mode=spread")
