"""metrics/: compute accounting, rollout statistics, truncation alarm, jsonl writer, progress line."""

from __future__ import annotations

import json
import warnings

import pytest

from scalerl_mega.metrics.alarms import TruncationAlarm, TruncationRateWarning
from scalerl_mega.metrics.compute import ComputeCounter, gpu_utilization
from scalerl_mega.metrics.progress import progress_line
from scalerl_mega.metrics.rollout_stats import rollout_metrics, staleness_histogram, tokens_per_version
from scalerl_mega.metrics.writer import MetricsWriter, read_metrics
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, ScoredCompletion


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_compute_counter_gpu_hours_are_wall_times_devices():
    clock = FakeClock()
    c = ComputeCounter(devices=80, on_gpu=True, clock=clock)
    clock.t += 1800.0  # half an hour on 80 GPUs = 40 GPU-hours
    f = c.fields()
    assert f["compute_gpu_hours"] == pytest.approx(40.0)
    assert f["compute_device_hours"] == pytest.approx(40.0)
    assert f["wall_hours"] == pytest.approx(0.5)


def test_compute_counter_cpu_counts_process_hours_and_resumes():
    clock = FakeClock()
    c = ComputeCounter(devices=2, on_gpu=False, clock=clock)
    clock.t += 900.0  # 0.25 h x 2 processes
    assert c.fields() == pytest.approx({"compute_gpu_hours": 0.0, "compute_device_hours": 0.5, "wall_hours": 0.25})
    state = c.state_dict()
    # A new incarnation (after kill -9) starts later on another clock reading; time while dead is not counted.
    clock.t += 5000.0
    c2 = ComputeCounter(devices=2, on_gpu=False, clock=clock)
    c2.load_state_dict(state)
    clock.t += 360.0  # +0.1 h
    assert c2.fields()["compute_device_hours"] == pytest.approx((0.25 + 0.1) * 2)


def test_gpu_utilization_is_none_without_gpus():
    assert gpu_utilization() is None


def _sample(*, reward, passed, versions, submitted, finish=FinishReason.STOP, idx=0, pid="p"):
    n = len(versions)
    comp = Completion(prompt_id=pid, sample_index=idx, prompt_ids=[1, 2], output_ids=list(range(n)),
                      gen_logprobs=[-0.5] * n, weight_versions=list(versions), finish_reason=finish,
                      submitted_version=submitted)
    return ScoredCompletion(completion=comp, reward=reward, passed=passed)


def _prompt(pid):
    return Prompt(prompt_id=pid, text="q", task="synthetic", gold="1")


def test_rollout_metrics_hand_worked():
    # Step 5. Prompt a: admitted at 3; prompt b: admitted at 5.
    a = Group(prompt=_prompt("a"), samples=[
        _sample(reward=1.0, passed=True, versions=[3, 3, 4, 4], submitted=3),          # 4 tokens, 2 versions
        _sample(reward=-1.0, passed=False, versions=[3] * 6, submitted=3, finish=FinishReason.LENGTH),
    ])
    b = Group(prompt=_prompt("b"), samples=[
        _sample(reward=1.0, passed=True, versions=[5, 5], submitted=5),
        _sample(reward=1.0, passed=True, versions=[5, 5, 5, 5], submitted=5, finish=FinishReason.INTERRUPTED),
    ])
    assert staleness_histogram([a, b], step=5) == {0: 2, 2: 2}
    assert tokens_per_version([a, b]) == {3: 8, 4: 2, 5: 6}
    m = rollout_metrics([a, b], step=5)
    assert m["reward_mean"] == pytest.approx(0.5)        # (1 - 1 + 1 + 1) / 4
    assert m["pass_rate"] == pytest.approx(0.75)
    assert m["truncation_rate"] == pytest.approx(0.25)
    assert m["interruption_rate"] == pytest.approx(0.25)
    assert m["response_length_mean"] == pytest.approx(16 / 4)
    assert m["generated_tokens"] == 16
    assert m["staleness_max"] == 2 and m["staleness_mean"] == pytest.approx(1.0)
    # token lags: [2,2,1,1] + [2]*6 + [0,0] + [0]*4 = 18 over 16 tokens
    assert m["token_lag_mean"] == pytest.approx(18 / 16)
    assert m["samples_multi_version"] == 1


def test_truncation_alarm_fires_once_per_excursion():
    alarm = TruncationAlarm(0.10)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fired = [alarm.check(step=s, truncation_rate=r) for s, r in enumerate([0.05, 0.12, 0.15, 0.08, 0.11])]
    assert fired == [False, True, False, False, True]
    assert sum(issubclass(w.category, TruncationRateWarning) for w in rec) == 2
    assert "12.0%" in str(rec[0].message)
    with pytest.raises(ValueError, match="truncation_alarm"):
        TruncationAlarm(0.0)


def test_writer_lines_and_resume_truncation(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(1, 5):
            w.write("train", step, {"loss": 0.5 * step, "nan": float("nan"), "compute_gpu_hours": 0.0})
        w.write("validation", 4, {"val_pass_rate": 0.25, "compute_gpu_hours": 0.0, "compute_device_hours": 0.1})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5
    first = json.loads(lines[0])
    assert first == {"kind": "train", "step": 1, "loss": 0.5, "nan": None, "compute_gpu_hours": 0.0}
    val = read_metrics(tmp_path / "metrics.jsonl", kind="validation")
    assert val == [{"kind": "validation", "step": 4, "val_pass_rate": 0.25, "compute_gpu_hours": 0.0,
                    "compute_device_hours": 0.1}]
    # A torn last line (kill -9) and steps after the checkpoint (step 2) are dropped on resume.
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "st')
    with MetricsWriter(tmp_path, resume_step=2) as w:
        w.write("train", 3, {"loss": 9.0})
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3]


def test_writer_tensorboard_events(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as w:
        w.write("train", 1, {"loss": 1.0, "note": "text is skipped"})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_progress_line():
    line = progress_line(step=5, total_steps=20, metrics={
        "reward_mean": 0.25, "pass_rate": 0.625, "truncation_rate": 0.03125, "staleness_mean": 1.5,
        "staleness_max": 2.0, "tokens_per_s": 1234.4})
    assert line == ("[#####...............] step  5/20 | reward 0.250 | pass 0.625 | trunc 3.1% | "
                    "stale 1.50/2 | tok/s 1234")
    assert "pass -" in progress_line(step=0, total_steps=3, metrics={})


def test_progress_line_has_elapsed_time_and_eta():
    """The progress lines had no elapsed time or ETA. Launch started at t=0, resuming at step 20 of 80;
    the first step (it carries the loop's start) ends at t=150, step 30 at t=204: 6 s per step since, 50 steps
    left -> ETA 300 s."""
    from scalerl_mega.metrics.progress import ProgressClock, format_duration

    t = [100.0]
    clock = ProgressClock(first_step=20, started=0.0, now=lambda: t[0])
    assert clock.timing(step=20, total_steps=80) == (100.0, None)
    t[0] = 150.0
    assert clock.timing(step=21, total_steps=80) == (150.0, None)
    t[0] = 204.0
    elapsed, eta = clock.timing(step=30, total_steps=80)
    assert (elapsed, eta) == (204.0, 300.0)
    line = progress_line(step=30, total_steps=80, metrics={}, elapsed_s=elapsed, eta_s=eta)
    assert line.endswith(" | 3m24s elapsed, ETA 5m00s")
    assert progress_line(step=0, total_steps=3, metrics={}, elapsed_s=5.0, eta_s=None).endswith("5s elapsed, ETA -")
    assert [format_duration(s) for s in (0, 59.9, 60, 3599, 3600, 7620)] == ["0s", "59s", "1m00s", "59m59s", "1h00m",
                                                                         "2h07m"]
