"""`metrics.weights_digest`: the engine's weights are digested only after the steps in
`metrics.weights_digest_steps` (all steps when empty), and the digest's pass is outside every step's wall time
(tools/gpu_check.sh's RL stage: a 1 GB SHA-256 per step used to land in the next step's time). The loop's clock
is a fake one that only the digest advances, so a digest on the clock would show as 100 s in a step."""

from __future__ import annotations

import time

import pytest

import scalerl_mega.loop as loop_mod
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from scalerl_mega.metrics.writer import read_metrics
from scalerl_mega.types import Prompt
from tests.support.scripted_loop import RecordingTrainer, Sampler, ScriptedEngine, reward
from tests.unit.test_loop_phases import _cfg

DIGEST_S = 100.0


class DigestEngine(ScriptedEngine):
    def __init__(self, clock: list[float]):
        super().__init__()
        self.clock = clock

    def decode_stats(self):  # reports counters like the local engine, so consecutive steps tile the clock
        return {"busy_s": 0.0, "decode_steps": 0.0, "decode_tokens": 0.0}

    def weights_digest(self):
        self.clock[0] += DIGEST_S  # a slow digest, on the fake clock
        self.log.append(("digest", self.version))
        return {"weights_sha256": f"sha-of-v{self.version}", "version": self.version}


@pytest.mark.parametrize("steps,digested", [("[2,3]", [2, 3]), ("[]", [1, 2, 3, 4])])
def test_digest_only_at_the_listed_steps_and_off_the_step_clock(tmp_path, monkeypatch, steps, digested):
    clock = [0.0]
    real = time.monotonic
    monkeypatch.setattr(loop_mod.time, "monotonic", lambda: real() + clock[0])
    cfg = _cfg(tmp_path, "metrics.weights_digest=true", f"metrics.weights_digest_steps={steps}", "train.val_every=0")
    engine = DigestEngine(clock)
    comps = LoopComponents(engine=engine, trainer=RecordingTrainer(engine), reward_fn=reward, sampler=Sampler(),
                           val_prompts=[Prompt(prompt_id="v0", text="v", task="synthetic", gold="")],
                           decode=lambda ids: "".join(chr(i) for i in ids), encode=lambda s: [1, 2],
                           stop_token_ids=[7])
    run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    recs = read_metrics(tmp_path / "metrics.jsonl", kind="train")
    assert [r["step"] for r in recs if "gen/weights_sha256" in r] == digested
    # the digest after a step holds that step's pushed weights (k=2: pushed at steps 2 and 4)
    assert {r["step"]: r["gen/weights_sha256"] for r in recs if "gen/weights_sha256" in r} == {
        s: f"sha-of-v{s if s % 2 == 0 else s - 1}" for s in digested}
    assert all(r["step_s"] < DIGEST_S / 2 for r in recs), [r["step_s"] for r in recs]
    assert clock[0] == DIGEST_S * len(digested)


def test_digest_steps_are_one_based(tmp_path):
    with pytest.raises(ValueError, match=r"metrics.weights_digest_steps=\[0, 2\]: steps are 1-based, got \[0\]"):
        _cfg(tmp_path, "metrics.weights_digest=true", "metrics.weights_digest_steps=[0,2]")
