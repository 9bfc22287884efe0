"""Episodes on a TP2 trainer: `torchrun --nproc-per-node 2 -m scalerl_mega.train env=custom parallel.tp=2` trains the
same episodes (prompts, samples, rewards, turns, environment ids) as the 1-rank run, with per-step loss and grad
norm within `multirank_util.REL_TOL`: the episode samples (loss mask 0 on environment ids) are broadcast to the
follower rank and sharded like single-turn ones. PPO-off-policy-1 makes generation a function of the weights and
the seeds, so both runs see the same episodes; the scripted environment (tests/support/episode_envs.py) gives
rewards that vary with the number of turns even for a random model, and `filter=none` trains every step."""

from __future__ import annotations

from multirank_util import COMMON, assert_same_run, records, run_job

DENSE = ["model=demo_dense"]
EPISODES = ["sft.steps=0", "train.steps=2", "train.save_every=0", "filter=none", "env=custom",
            "env.chat_template=arith", "env.max_turns=3", "env.max_tokens=90",
            "env.custom._target_=tests.support.episode_envs.ScriptedEnv", "+env.custom.kwargs.turns=3",
            "length.max_new_tokens=24", "length.interruption_min=12", "length.interruption_max=16",
            "length.answer_budget=4"]


def test_tp2_trains_the_same_episodes_as_one_rank(tmp_path):
    run_job(tmp_path / "one", [*COMMON, *DENSE, *EPISODES])
    run_job(tmp_path / "tp2", [*COMMON, *DENSE, *EPISODES, "parallel.tp=2", "parallel.sequence_parallel=true"],
            nproc=2)
    single, multi = records(tmp_path / "one"), records(tmp_path / "tp2")
    assert_same_run(single, multi)
    for a, b in zip(single, multi):
        for key in ("episode/turns", "episode/env_tokens", "episode/length"):
            assert a[key] == b[key]
    assert max(r["episode/turns"] for r in single) > 1.0 and max(r["episode/env_tokens"] for r in single) > 0
