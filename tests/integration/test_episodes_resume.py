"""A stop (SIGTERM / Ctrl-C: the loop's `stop_requested`) with episodes in flight loses nothing: the checkpoint
re-admits the prompts of the unfinished episodes, and the resumed run (a fresh engine and environment pool, as
after a restart) trains the same prompt sequence as an uninterrupted run. Episodes are held in flight by
construction (`rollout.inflight_hold_tokens`: requests that cannot be trained before the next update stop after
2 tokens until it arrives), and the stop is requested by a hook after step 1 (no timing)."""

from __future__ import annotations

import pytest

from scalerl_mega.build import build_sampler, build_task, episode_engine
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.loop import run_rl
from scalerl_mega.metrics.compute import ComputeCounter
from tests.integration.test_loop_pipeline import HF_CONFIG, TorchPolicy, _cfg, _loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DIGITS = list(range(7, 17))  # the arithmetic tokenizer's ids of 0-9 (data/tasks/tokenizer.py)

MULTITURN = ["env=custom", "env.chat_template=arith", "env.max_turns=2", "env.max_tokens=96",
             "env.custom._target_=scalerl_mega.episodes.examples.RetryArithmetic", "+env.custom.kwargs.attempts=2",
             "data.synthetic_num_prompts=300", "data.val_prompts=4", "train.prompts_per_step=2",
             "train.generations_per_prompt=4", "off_policy.k=1", "train.val_every=0", "rollout.inflight_hold_tokens=2",
             "sft.steps=0", "reward.num_workers=1"]


def _components(cfg):
    """The loop's components over the in-process engine; turns also stop at a digit (a random model rarely
    samples <eos>), so that episodes reach their second turn."""
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec

    task = build_task(cfg)
    inner = InProcessRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="llama", config=HF_CONFIG, init_seed=0),
                                                     core=CoreConfig(max_batch=16, max_seq_len=128), seed=cfg.seed))
    trainer = TorchPolicy(_loss(cfg), lr=1e-3)

    def no_reward(prompts, texts):
        raise AssertionError("episodes are scored by their environment")

    return LoopComponents(engine=episode_engine(cfg, task, inner), trainer=trainer, reward_fn=no_reward,
                          sampler=build_sampler(cfg, task), val_prompts=list(task.val_prompts), decode=task.decode,
                          encode=task.encode, stop_token_ids=[*task.stop_token_ids, *DIGITS],
                          interruption_ids=list(task.interruption_ids))


def test_a_stop_with_episodes_in_flight_resumes_the_same_prompt_sequence(tmp_path):
    full_cfg = _cfg(tmp_path / "full", *MULTITURN, "train.steps=3")
    comps = _components(full_cfg)
    try:
        full = run_rl(full_cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    finally:
        comps.engine.close()
    assert full.step == 3 and len(full.trained_prompt_ids) == 6

    cfg = _cfg(tmp_path / "part", *MULTITURN, "train.steps=3")
    comps = _components(cfg)
    seen = {}

    def stop_requested():  # after step 1, once an episode is between turns (generating its second)
        if 1 in seen and any(t >= 1 for t in comps.engine.in_flight_turns):
            seen["stopped_with"] = comps.engine.episodes_in_flight
        return "stopped_with" in seen

    try:
        part = run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False),
                      on_step=lambda step, rec: seen.setdefault(step, True), stop_requested=stop_requested)
    finally:
        comps.engine.close()
    assert part.preempted and part.step < 3 and seen["stopped_with"] > 0  # stopped mid-run, episodes mid-turn
    comps = _components(cfg)
    try:
        resumed = run_rl(cfg, comps, compute=ComputeCounter(devices=1, on_gpu=False))
    finally:
        comps.engine.close()
    assert resumed.step == 3 and resumed.trained_prompt_ids == full.trained_prompt_ids
