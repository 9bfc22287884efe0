"""The `env` group (config/env.py, conf/env/): single-turn stays the default, episodes compose and validate, and
each bad setting is refused naming its key."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.test_config import _compose


def test_single_is_the_default_and_the_multiturn_demo_composes():
    from scalerl_mega.config import episode_budget, validate

    c = _compose("experiment=demo")
    assert (c.env.name, c.env.max_turns) == ("single", 1)
    m = _compose("experiment=demo_multiturn")
    validate(m)
    assert (m.env.name, m.env.max_turns, m.env.chat_template) == ("custom", 2, "arith")
    assert m.env.custom["_target_"] == "scalerl_mega.episodes.examples.LookupArithmetic"
    assert episode_budget(m.env, max_new_tokens=m.length.max_new_tokens) == 64
    assert m.data.max_prompt_tokens + 64 <= m.model.max_position_embeddings
    # `ask` + <eos>, the longest lookup `k=999` and a whole 48-token turn fit the episode's budget
    assert 4 + 5 + m.length.max_new_tokens <= 64
    # everything else is the single-turn demo's (the warm start traces 4,000 prompts' episodes, not 20,000)
    for group in ("model", "optim", "loss", "off_policy", "length"):
        assert getattr(m, group) == getattr(c, group)
    assert dataclasses.replace(m.train, steps=c.train.steps) == c.train and m.train.steps == 30
    assert dataclasses.replace(m.sft, synthetic_num_prompts=c.sft.synthetic_num_prompts) == c.sft
    assert episode_budget(dataclasses.replace(m.env, max_tokens=0), max_new_tokens=48) == 96


@pytest.mark.parametrize(("overrides", "key"), [
    (["env.max_turns=0"], "env.max_turns"),
    (["env.max_turns=3"], "env.max_turns=3 with env.name=single"),
    (["env=custom", "env.custom._target_="], "env.custom._target_"),
    (["env=agent"], "env.agent._target_"),
    (["env=custom", "env.step_timeout_s=0"], "env.step_timeout_s"),
    (["env=custom", "env.max_tokens=-1"], "env.max_tokens"),
    (["env=custom", "env.max_tokens=200"], "the episode budget"),
    (["env=custom", "env.concurrency=-1"], "env.concurrency=-1 must be an integer >= 0"),
    (["env=custom", "env.on_error=ignore"], "env.on_error='ignore' is not one of"),
    (["env=custom", "env.episode_timeout_s=0"], "env.episode_timeout_s"),
    (["env=custom", "env.step_timeout_s=30", "env.episode_timeout_s=20"], "env.episode_timeout_s=20 must be >= "
                                                                          "env.step_timeout_s=30"),
])
def test_bad_env_settings_name_the_key(overrides, key):
    from scalerl_mega.config import validate

    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("=", "=")):
        validate(_compose("experiment=demo", *overrides))


def test_the_episode_pool_defaults_to_every_episode_of_a_step():
    """`env.concurrency=0`: prompts_per_step x generations_per_prompt threads (768 at the paper's 48 x 16, 256 in the
    multi-turn demo: the figures docs/extending.md states); a set value is taken as is."""
    from scalerl_mega.config.env import EnvConfig, episode_concurrency

    assert episode_concurrency(EnvConfig(), prompts_per_step=48, generations_per_prompt=16) == 768
    assert episode_concurrency(EnvConfig(concurrency=5), prompts_per_step=48, generations_per_prompt=16) == 5
    c = _compose("experiment=demo_multiturn")
    assert (c.env.concurrency, c.env.on_error, c.env.episode_timeout_s) == (0, "drop", 3600.0)
    assert episode_concurrency(c.env, prompts_per_step=c.train.prompts_per_step,
                               generations_per_prompt=c.train.generations_per_prompt) == 256
