"""The cluster simulator's calibration from a measured CPU run.

A short real `scalerl-train` run (Megatron trainer in this process's child, HF engine in its own
process, PipelineRL-2) writes per-step timings, batch shapes and engine work counters to
metrics.jsonl; the simulator is calibrated on that file alone (`load_calibration`) and runs on it.
Checked here: the counters' consistency, the calibration's shape and a simulation from it.

How close the calibrated simulator's idle fractions come to the run's measured ones is a wall-clock
figure, so it is a benchmark, not a test (`bench/sim_calibration.py`): on a loaded machine the
fractions move with whatever else runs (a fresh-clone suite beside a sweep measured a generator idle
fraction of 0.159 where a quiet machine measures ~0.74), and no fixed bound made the assertion
independent of the load.

Also the engine counters themselves on a hand-worked schedule (GenerationCore.stats()).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUN = [
    "experiment=demo", "sft.steps=0", "filter=none", "train.steps=10", "train.prompts_per_step=16",
    "train.generations_per_prompt=8", "train.val_every=0", "train.save_every=0", "data.val_prompts=8",
    "data.synthetic_num_prompts=400", "metrics.tensorboard=false",
]


def test_engine_counters_hand_worked():
    """Three requests admitted by one prefill, output budgets 5, 3, 4 and no stop token: request i
    needs L_i - 1 decode forwards after its prefill token, so decode_steps = max(L) - 1 = 4 and
    decode_tokens = sum over decode steps of the batch size = 4 + 2 + 3 = 9; one prefill of
    3 + 4 + 2 prompt tokens."""
    import torch

    from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
    from scalerl_mega.rollout.local import LocalModelSpec, build_model
    from scalerl_mega.types import SamplingParams

    torch.manual_seed(0)
    model = build_model(LocalModelSpec(arch="llama", config=dict(
        vocab_size=31, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False), init_seed=0))
    core = GenerationCore(model, config=CoreConfig(max_batch=4, max_seq_len=32, admit_min_free=1))
    assert core.stats() == {"busy_s": 0.0, "decode_steps": 0, "decode_tokens": 0, "prefill_steps": 0,
                            "prefill_tokens": 0}
    for i, (prompt, budget) in enumerate([([1, 2, 3], 5), ([4, 5, 6, 7], 3), ([8, 9], 4)]):
        core.add(GenRequest(rid=str(i), prompt_id=str(i), sample_index=0, prompt_ids=prompt,
                            sampling=SamplingParams(max_new_tokens=budget, temperature=1.0), seed=i))
    done = core.run_until_done()
    assert sorted(len(c.output_ids) for c in done) == [3, 4, 5]
    st = core.stats()
    assert (st["decode_steps"], st["decode_tokens"]) == (4, 9)
    assert (st["prefill_steps"], st["prefill_tokens"]) == (1, 9)
    assert st["busy_s"] > 0
    before = core.stats()
    assert core.step() == [] and core.stats() == before  # an idle step does no work


def test_a_measured_run_calibrates_the_simulator(tmp_path):
    from scalerl_mega.cluster.schedule_calibration import config_from_calibration, load_calibration
    from scalerl_mega.cluster.schedule_sim import simulate

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "scalerl_mega.train", *RUN, f"output_dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"scalerl-train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 11))
    for r in train:  # the engine's counters are in every step record, consistent with each other
        assert r["gen/decode_steps"] > 0 and r["gen/decode_tokens"] >= r["gen/decode_steps"]
        assert 0 < r["gen/busy_s"] <= r["timing/step_wall_s"] + 0.5
        # one engine decodes at most max_batch_size sequences per forward
        assert r["gen/decode_tokens"] <= 256 * r["gen/decode_steps"]
    # every generated token but the one sampled at prefill comes from a decode forward; the
    # pipeline keeps (k+1)*B prompts in flight, so over the run decoded >= trained - in flight
    trained = sum(r["generated_tokens"] - r["batch_samples"] for r in train[1:])
    decoded = sum(r["gen/decode_tokens"] for r in train[1:])
    assert decoded >= 0.5 * trained

    cal = load_calibration(str(out / "metrics.jsonl"))
    measured = cal["measured"]
    assert cal["batch_samples"] == 128 and cal["k"] == 2 and cal["mode"] == "pipeline_rl"
    assert cal["decode_base_s"] + cal["decode_per_seq_s"] > 0 and cal["train_fixed_s"] + cal["train_per_token_s"] > 0
    for key in ("trainer_idle_fraction", "generator_idle_fraction"):
        assert 0.0 <= measured[key] <= 1.0, (key, measured[key])
    config = config_from_calibration(cal, steps=40, warmup_steps=8, seed=0)
    result = simulate(config)
    assert 0.0 <= result.trainer_idle_fraction <= 1.0 and 0.0 <= result.generator_idle_fraction <= 1.0
    again = simulate(config_from_calibration(cal, steps=40, warmup_steps=8, seed=0))
    assert (again.trainer_idle_fraction, again.generator_idle_fraction) == \
        (result.trainer_idle_fraction, result.generator_idle_fraction)  # a seeded simulation is reproducible
