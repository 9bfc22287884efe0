"""PPO-off-policy-k phases in the RL loop (paper Sec. 3.1): by default all k*B prompts of a phase are generated
on fixed weights before any of the phase's k optimizer steps, and nothing is generated while they run;
`off_policy.overlap=true` trains as soon as the oldest B groups are complete. Validation always sees the
trainer's current weights. A scripted engine returns one completion per poll, so the interleaving of
generation and training is forced, not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.types import Prompt
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine, reward

REPO = Path(__file__).resolve().parents[2]
K, B, G, STEPS = 2, 2, 2, 4


def _cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs, validate

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "experiment=demo", f"output_dir={tmp_path}", "off_policy=ppo_off_policy", f"off_policy.k={K}",
            f"train.prompts_per_step={B}", f"train.generations_per_prompt={G}", f"train.steps={STEPS}",
            "train.val_every=1", "train.save_every=0", "data.val_samples=1", "metrics.tensorboard=false",
            "metrics.progress_every=0", "length=penalty", *overrides])
    c = OmegaConf.to_object(cfg)
    validate(c)
    return c


def _run(tmp_path, *overrides, engine: ScriptedEngine | None = None) -> list[tuple]:
    cfg = _cfg(tmp_path, *overrides)
    engine = engine or ScriptedEngine()
    comps = LoopComponents(engine=engine, trainer=RecordingTrainer(engine), reward_fn=reward, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2],
                           stop_token_ids=[7])
    run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    return engine.log


def _phases(log):
    trains = [i for i, e in enumerate(log) if e[0] == "train"]
    assert len(trains) == STEPS
    return trains


def test_strict_phases_generate_k_batches_then_train_with_generators_idle(tmp_path):
    log = _run(tmp_path)
    trains = _phases(log)
    for phase in range(STEPS // K):
        first, last = trains[phase * K], trains[phase * K + K - 1]
        # every completion of the phase's k*B prompts was delivered before its first step ...
        assert log[first][1] == 0
        delivered = [e for e in log[:first] if e[0] == "deliver" and not e[1].startswith("v")]
        assert len(delivered) == (phase + 1) * K * B * G
        # ... all generated on the phase's fixed weights (version phase*k) ...
        assert {e[2] for e in delivered[phase * K * B * G:]} == {phase * K}
        # ... and no training prompt is submitted or generated while its k steps run
        assert not [e for e in log[first:last] if e[0] in ("submit", "deliver") and not e[1].startswith("v")]


def test_overlap_trains_while_the_phase_is_still_generating(tmp_path):
    log = _run(tmp_path, "off_policy.overlap=true")
    trains = _phases(log)
    assert log[trains[0]][1] > 0  # the first step ran with the phase's later samples still queued
    # the phase still generates on fixed weights
    phase0 = [e for e in log if e[0] == "deliver" and not e[1].startswith("v")][: K * B * G]
    assert {e[2] for e in phase0} == {0}


@pytest.mark.parametrize("overlap", ["false", "true"])
def test_validation_runs_on_the_current_weights(tmp_path, overlap):
    log = _run(tmp_path, f"off_policy.overlap={overlap}")
    val = [(i, e) for i, e in enumerate(log) if e[0] == "deliver" and e[1].startswith("v")]
    # step 0 validation + one after each of the 4 steps, each on the weights of that step
    assert [e[2] for _, e in val] == [0, 1, 2, 3, 4]
    # a mid-phase weight push waits for the phase's generation: no training sample is generated after it
    for i, e in enumerate(log):
        if e == ("update", 1):
            assert not [x for x in log[i:] if x[0] == "deliver" and not x[1].startswith("v") and x[2] < 2]


def test_overlap_needs_ppo_off_policy(tmp_path):
    with pytest.raises(ValueError, match="off_policy.overlap"):
        _cfg(tmp_path, "off_policy=pipeline_rl", "off_policy.overlap=true")


def test_sync_steps_record_sync_fields(tmp_path):
    """A step that pushes weights carries sync/senders, sync/bytes, sync/max_sender_bytes and
    sync/seconds in its train record (one sender: the engine's send stats); a step without a push (PPO-k
    mid-phase) carries none."""
    import json

    from scalerl_mega.weight_sync import SendStats

    class CountingEngine(ScriptedEngine):
        last_sync_stats = None

        def update_weights(self, named_tensors, *, version):
            super().update_weights(named_tensors, version=version)
            self.last_sync_stats = SendStats(version=version, buckets=1, tensors=1, bytes=1000 + version)

    _run(tmp_path, engine=CountingEngine())
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in recs if r["kind"] == "train"}
    assert sorted(train) == [1, 2, 3, 4]
    for step in (2, 4):  # k = 2: pushes after steps 2 and 4
        r = train[step]
        assert (r["sync/senders"], r["sync/bytes"], r["sync/max_sender_bytes"]) == (1.0, 1000.0 + step, 1000.0 + step)
        assert r["sync/seconds"] == r["weight_sync_s"] >= 0.0
    assert not any(k.startswith("sync/") for k in train[1]) and not any(k.startswith("sync/") for k in train[3])
