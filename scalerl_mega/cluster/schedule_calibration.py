"""Calibrating the schedule simulator (`cluster/schedule_sim.py`) on a measured run: per-step timings of its
metrics.jsonl -> the simulator's decode, prefill, training and sync parameters (least squares, `linfit`), and the
idle fractions the run measured, to compare with the simulation."""

from __future__ import annotations

import json
from typing import Any, Iterable

from scalerl_mega.cluster.linfit import fit_linear
from scalerl_mega.cluster.schedule_sim import LengthDist, SimConfig

CALIBRATION_KEYS = {
    "decode_base_s": "seconds per decode step independent of batch (weights read)",
    "decode_per_seq_s": "additional seconds per decode step per active sequence",
    "train_fixed_s": "seconds per optimizer step independent of tokens",
    "train_per_token_s": "seconds per (prompt + completion) token in the step's batch",
    "sync_s": "seconds per weight sync (trainer export + engine load)",
    "prompt_len": "mean prompt tokens",
    "gen_lengths": "list of observed completion lengths (tokens); drawn from empirically",
    "batch_samples": "sequences per optimizer step (prompts_per_step * generations_per_prompt)",
    "num_generators": "engine processes / servers",
    "gpus_per_generator": "devices per engine",
    "trainer_gpus": "trainer devices",
    "max_concurrency": "max concurrent sequences per engine",
    "mode": "pipeline_rl | ppo_off_policy",
    "k": "off-policy k",
}


def calibration_from_records(records: Iterable[dict[str, Any]], *, skip_steps: int = 1) -> dict[str, Any]:
    """Build a calibration dict from ``metrics.jsonl`` step records (format in tools/cluster_sim.py doc).

    Decode: ``gen/busy_s = decode_base_s * gen/decode_steps + decode_per_seq_s * gen/decode_tokens``
    fitted over records; training: ``trainer_busy_s = train_fixed_s + train_per_token_s *
    batch/tokens`` (see :func:`trainer_busy_s`); sync: mean of ``timing/sync_s``."""
    recs = [r for r in records if "timing/train_step_s" in r and r.get("kind", "train") == "train"]
    recs = recs[skip_steps:] if len(recs) > skip_steps else recs
    if not recs:
        raise ValueError("calibration: no records with 'timing/train_step_s'")
    meta = next((r for r in recs if "sim/batch_samples" in r), recs[0])
    missing = [k for k in ("sim/batch_samples", "sim/num_generators", "sim/trainer_gpus") if k not in meta]
    if missing:
        raise ValueError(f"calibration: record lacks {missing}")
    dec = [r for r in recs if r.get("gen/decode_steps", 0) > 0]
    if not dec:
        raise ValueError("calibration: no record with gen/decode_steps > 0")
    base, per_seq = fit_linear([[r["gen/decode_steps"], r["gen/decode_tokens"]] for r in dec],
                               [r["gen/busy_s"] for r in dec])
    fixed, per_tok = fit_linear([[1.0, r["batch/tokens"]] for r in recs], [trainer_busy_s(r) for r in recs])
    lengths: list[int] = []
    for r in recs:
        lengths.extend(int(x) for x in r.get("batch/gen_lengths", []))
    if not lengths:
        raise ValueError("calibration: no 'batch/gen_lengths' in records")
    prompt = [r["batch/prompt_tokens_mean"] for r in recs if "batch/prompt_tokens_mean" in r]
    return {
        "decode_base_s": base,
        "decode_per_seq_s": per_seq,
        "train_fixed_s": fixed,
        "train_per_token_s": per_tok,
        "sync_s": sum(r.get("timing/sync_s", 0.0) for r in recs) / len(recs),
        "prompt_len": int(round(sum(prompt) / len(prompt))) if prompt else 0,
        "gen_lengths": lengths,
        "batch_samples": int(meta["sim/batch_samples"]),
        "num_generators": int(meta["sim/num_generators"]),
        "gpus_per_generator": int(meta.get("sim/gpus_per_generator", 1)),
        "trainer_gpus": int(meta["sim/trainer_gpus"]),
        "max_concurrency": int(meta.get("sim/max_concurrency", 256)),
        "mode": str(meta.get("sim/mode", "pipeline_rl")),
        "k": int(meta.get("sim/k", 8)),
        "measured": measured_from_records(recs),
    }


def trainer_busy_s(rec: dict[str, Any]) -> float:
    """Seconds of one step record the trainer worked: with the loop's ``trainer_idle_s`` (time
    blocked waiting for completions), the step's wall time minus that wait and the weight sync --
    scoring, batching and the optimizer step, the simulator's "trainer step" (on the CPU run the
    reward computation is a large share of it); without it, ``timing/train_step_s``."""
    if "trainer_idle_s" in rec and "timing/step_wall_s" in rec:
        return max(0.0, rec["timing/step_wall_s"] - rec["trainer_idle_s"] - rec.get("timing/sync_s", 0.0))
    return float(rec["timing/train_step_s"])


def measured_from_records(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Idle fractions of the measured run over the given records (same definitions as SimResult:
    sync counts as idle; trainer work per :func:`trainer_busy_s`)."""
    wall = sum(r.get("timing/step_wall_s", 0.0) for r in recs)
    if wall <= 0:
        return {}
    out = {"trainer_idle_fraction": 1.0 - sum(trainer_busy_s(r) for r in recs) / wall}
    n_gen = int(recs[0].get("sim/num_generators", 1))
    if all("gen/busy_s" in r for r in recs):
        out["generator_idle_fraction"] = 1.0 - sum(r["gen/busy_s"] for r in recs) / (wall * n_gen)
    out["samples_per_hour"] = len(recs) * int(recs[0].get("sim/batch_samples", 0)) * 3600.0 / wall
    return out


def config_from_calibration(cal: dict[str, Any], **overrides: Any) -> SimConfig:
    """SimConfig from a calibration dict (keys: :data:`CALIBRATION_KEYS`); ``overrides`` win."""
    unknown = set(cal) - set(CALIBRATION_KEYS) - {"measured", "source"}
    if unknown:
        raise ValueError(f"calibration: unknown keys {sorted(unknown)}")
    kw = {k: v for k, v in cal.items() if k in CALIBRATION_KEYS and k != "gen_lengths"}
    if "gen_lengths" in cal:
        vals = tuple(int(x) for x in cal["gen_lengths"])
        kw["lengths"] = LengthDist(kind="empirical", values=vals, max_len=max(vals))
    kw.update(overrides)
    return SimConfig(**kw)


def load_calibration(path: str) -> dict[str, Any]:
    """A calibration JSON file, or a metrics.jsonl (one JSON record per line) to calibrate from."""
    with open(path) as f:
        text = f.read()
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            return obj
    except json.JSONDecodeError:
        pass
    recs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from exc
    return calibration_from_records(recs)


