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
    assert m.env.custom["_target_"] == "scalerl_mega.episodes.examples.RetryArithmetic"
    assert episode_budget(m.env, max_new_tokens=m.length.max_new_tokens) == 110
    assert m.data.max_prompt_tokens + 110 <= m.model.max_position_embeddings
    # everything else is the single-turn demo's
    for group in ("model", "optim", "loss", "off_policy", "length", "train", "sft"):
        assert getattr(m, group) == getattr(c, group)
    assert episode_budget(dataclasses.replace(m.env, max_tokens=0), max_new_tokens=48) == 96


@pytest.mark.parametrize(("overrides", "key"), [
    (["env.max_turns=0"], "env.max_turns"),
    (["env.max_turns=3"], "env.max_turns=3 with env.name=single"),
    (["env=custom", "env.custom._target_="], "env.custom._target_"),
    (["env=agent"], "env.agent._target_"),
    (["env=custom", "env.step_timeout_s=0"], "env.step_timeout_s"),
    (["env=custom", "env.max_tokens=-1"], "env.max_tokens"),
    (["env=custom", "env.max_tokens=200"], "the episode budget"),
])
def test_bad_env_settings_name_the_key(overrides, key):
    from scalerl_mega.config import validate

    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("=", "=")):
        validate(_compose("experiment=demo", *overrides))
