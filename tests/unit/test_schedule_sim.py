"""Simulator: deterministic cases whose idle fractions, throughput and staleness are derived by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scalerl_mega.cluster.linfit import fit_linear
from scalerl_mega.cluster.schedule_calibration import calibration_from_records, config_from_calibration
from scalerl_mega.cluster.schedule_sim import LengthDist, SimConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
L, C, S, Y, B = 100, 0.01, 0.3, 0.2, 8


def _base(**kw) -> SimConfig:
    cfg = SimConfig(mode="pipeline_rl", k=1, batch_samples=B, num_generators=1, trainer_gpus=1,
                    max_concurrency=B, decode_base_s=C, decode_per_seq_s=0.0, prompt_len=0,
                    train_fixed_s=S, train_per_token_s=0.0, sync_s=Y, lengths=LengthDist(kind="fixed", mean=L),
                    steps=12, warmup_steps=4)
    return replace(cfg, **kw)


def test_pipeline_generation_bound():
    # One server decodes B sequences of L tokens together (L*C s); in steady state each batch also
    # loses Y to the in-flight sync pause, so one step per T = L*C + Y. The batch was admitted while
    # the trainer was on the previous step, so staleness is exactly 1.
    r = simulate(_base())
    T = L * C + Y
    assert r.mean_step_period_s == pytest.approx(T)
    assert r.trainer_idle_fraction == pytest.approx(1 - S / T)
    assert r.generator_idle_fraction == pytest.approx(Y / T)
    assert r.gpu_idle_fraction == pytest.approx((1 - S / T + Y / T) / 2)
    assert r.samples_per_hour == pytest.approx(B * 3600 / T)
    assert r.staleness == {1: 8 * B}


def test_pipeline_trainer_bound_staleness_is_k():
    # Trainer step 3 s > L*C: period S + Y; generators run ahead until the admission cap, so every
    # sequence is admitted right after a sync to version v and consumed by step v + k.
    k, S2 = 3, 3.0
    r = simulate(_base(k=k, train_fixed_s=S2, max_concurrency=100))
    T = S2 + Y
    assert r.mean_step_period_s == pytest.approx(T)
    assert r.trainer_idle_fraction == pytest.approx(Y / T)
    assert r.generator_idle_fraction == pytest.approx(1 - L * C / T)
    assert r.staleness == {k: 8 * B}


def test_ppo_off_policy_round():
    # Round: generate k*B at once (L*C), k steps (k*S), one sync (Y).
    k = 2
    r = simulate(_base(mode="ppo_off_policy", k=k, max_concurrency=100))
    T = L * C + k * S + Y
    assert r.mean_step_period_s == pytest.approx(T / k)
    assert r.trainer_idle_fraction == pytest.approx(1 - k * S / T)
    assert r.generator_idle_fraction == pytest.approx(1 - L * C / T)
    assert r.staleness == {0: 4 * B, 1: 4 * B}


def test_batch_dependent_decode_time():
    # decode step = base + per_seq * n; B sequences together -> L * (base + per_seq * B) per batch.
    base, per = 0.004, 0.001
    r = simulate(_base(decode_base_s=base, decode_per_seq_s=per))
    T = L * (base + per * B) + Y
    assert r.mean_step_period_s == pytest.approx(T)


def test_staleness_never_exceeds_k_with_random_lengths():
    for k in (1, 2, 4):
        cfg = _base(k=k, num_generators=3, max_concurrency=16, batch_samples=12, train_fixed_s=0.5,
                    lengths=LengthDist(kind="lognormal", mean=80, sigma=1.0, max_len=400), steps=30,
                    warmup_steps=0, seed=k)
        r = simulate(cfg)
        assert max(r.staleness) <= k
        assert sum(r.staleness.values()) == 30 * 12
    # and PipelineRL beats PPO-off-policy on idle time in the same setting
    cfg = _base(k=4, num_generators=3, max_concurrency=16, batch_samples=12, train_fixed_s=0.5,
                lengths=LengthDist(kind="lognormal", mean=80, sigma=1.0, max_len=400), steps=32, warmup_steps=8)
    pipe, ppo = simulate(cfg), simulate(replace(cfg, mode="ppo_off_policy"))
    assert pipe.gpu_idle_fraction < ppo.gpu_idle_fraction
    assert pipe.samples_per_hour > ppo.samples_per_hour


def test_validation():
    with pytest.raises(ValueError, match="mode='x'"):
        simulate(_base(mode="x"))
    with pytest.raises(ValueError, match="multiples of k=5"):
        simulate(_base(mode="ppo_off_policy", k=5))
    with pytest.raises(ValueError, match="kind='weird'"):
        LengthDist(kind="weird")


def test_fit_linear_exact():
    xs = [[10.0, 30.0], [20.0, 100.0], [5.0, 5.0]]
    ys = [0.5 * x0 + 0.01 * x1 for x0, x1 in xs]
    a, b = fit_linear(xs, ys)
    assert a == pytest.approx(0.5) and b == pytest.approx(0.01)


def _records():
    recs = []
    for i, (steps, toks, ntok) in enumerate([(40, 300, 2000), (50, 800, 2600), (30, 90, 1500), (60, 1000, 3000)]):
        recs.append({
            "step": i,
            "timing/train_step_s": 0.2 + 1e-4 * ntok,
            "timing/sync_s": 0.05,
            "timing/step_wall_s": 1.0,
            "batch/tokens": ntok,
            "batch/gen_lengths": [10, 20, 30],
            "batch/prompt_tokens_mean": 8,
            "gen/busy_s": 0.003 * steps + 0.0005 * toks,
            "gen/decode_steps": steps,
            "gen/decode_tokens": toks,
            "sim/batch_samples": 3, "sim/num_generators": 1, "sim/trainer_gpus": 1,
            "sim/max_concurrency": 64, "sim/mode": "pipeline_rl", "sim/k": 2,
        })
    return recs


def test_calibration_from_records_recovers_coefficients():
    cal = calibration_from_records(_records(), skip_steps=0)
    assert cal["decode_base_s"] == pytest.approx(0.003)
    assert cal["decode_per_seq_s"] == pytest.approx(0.0005)
    assert cal["train_fixed_s"] == pytest.approx(0.2)
    assert cal["train_per_token_s"] == pytest.approx(1e-4)
    assert cal["sync_s"] == pytest.approx(0.05)
    assert cal["prompt_len"] == 8 and cal["k"] == 2 and cal["batch_samples"] == 3
    # measured idle: 1 - sum(train_step_s)/sum(wall)
    recs = _records()
    assert cal["measured"]["trainer_idle_fraction"] == pytest.approx(
        1 - sum(r["timing/train_step_s"] for r in recs) / 4.0)
    cfg = config_from_calibration(cal, steps=6, warmup_steps=2)
    assert cfg.lengths.kind == "empirical" and cfg.mode == "pipeline_rl"
    simulate(cfg)


def test_calibration_rejects_unknown_and_missing():
    with pytest.raises(ValueError, match="unknown keys"):
        config_from_calibration({"decode_base": 1})
    recs = _records()
    for r in recs:
        del r["sim/trainer_gpus"]
    with pytest.raises(ValueError, match="sim/trainer_gpus"):
        calibration_from_records(recs)


def test_cli_with_metrics_jsonl(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    r = subprocess.run([sys.executable, str(ROOT / "tools/cluster_sim.py"), "--calibration", str(path), "--steps", "8",
                        "--warmup-steps", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["mode"] for x in out["results"]] == ["pipeline_rl", "ppo_off_policy"]
    assert "trainer_idle_fraction" in out["measured"]
