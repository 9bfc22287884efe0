"""`env=agent` (episodes/agent.py): agent code written against the real `openai` client runs in the reward pool and
talks to the per-episode endpoint; its calls are bridged to the local engine from the loop's `poll` and stitched
into one sample per episode with the engine's exact ids (decode-free checks); a raising agent is scored like a
raising reward. Needs developer 57b's endpoint (episodes/agent_server.py) and the openai client."""

from __future__ import annotations

import pytest

pytest.importorskip("scalerl_mega.episodes.agent_server")
pytest.importorskip("openai")

from scalerl_mega.episodes.agent import AgentEngine  # noqa: E402
from scalerl_mega.episodes.template import FIXED_TEMPLATES  # noqa: E402
from scalerl_mega.types import SamplingParams  # noqa: E402
from tests.unit.test_episodes import EOS, TOK, Recording, _prompt, _spans  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _agent_engine(target: str):
    import copy

    tok = copy.copy(TOK)
    tok.chat_template = FIXED_TEMPLATES["arith"]
    rec = Recording()
    return AgentEngine(rec, tokenizer=tok, target=target, timeout_s=60.0, num_workers=2, failure_reward=-1.0,
                       correct=1.0, max_turns=4, budget=60, stop_token_ids=[EOS]), rec


def _collect(eng, n):
    """Poll (the loop's role: it answers the agents' calls) until `n` episodes finished; 300 s is a hang guard."""
    import time

    out, deadline = [], time.monotonic() + 300
    while len(out) < n and time.monotonic() < deadline:
        out += eng.poll(0.05)
    assert len(out) == n, f"{len(out)} of {n} agent episodes finished"
    return out


def test_openai_client_agent_episodes_keep_the_engines_ids():
    eng, rec = _agent_engine("tests.support.episode_envs.retry_agent")
    prompts = [_prompt(47, 38), _prompt(5, 9)]
    try:
        for i, p in enumerate(prompts):
            eng.submit(p, SamplingParams(max_new_tokens=16, seed=10 * i, stop_token_ids=[EOS]), n=2, version=3)
        episodes = _collect(eng, 4)
    finally:
        eng.close()
    assert sorted((c.prompt_id, c.sample_index) for c in episodes) == sorted(
        (p.prompt_id, i) for p in prompts for i in range(2))
    for ep in episodes:
        p = next(p for p in prompts if p.prompt_id == ep.prompt_id)
        assert ep.turns == 2 and ep.broken_prefixes == 0 and ep.submitted_version == 3
        assert ep.episode_result[0] in (1.0, -1.0) and ep.episode_result[2] == "agent"
        assert ep.prompt_ids == TOK(p.text)["input_ids"]  # the arith template's opening: <bos> + the question
        calls = [rec.returned[k] for k in sorted(rec.returned) if k.startswith(f"{p.prompt_id}#")
                 and rec.returned[k].sample_index == ep.sample_index
                 and rec.submitted[k][:len(ep.prompt_ids) + len(ep.output_ids)] == rec.submitted[k]
                 and rec.submitted[k] == (ep.prompt_ids + ep.output_ids)[:len(rec.submitted[k])]]
        calls.sort(key=lambda c: len(c.prompt_ids))
        gen = [s for s in _spans(ep.mask()) if s[2] == 1]
        env = [s for s in _spans(ep.mask()) if s[2] == 0]
        assert len(calls) == 2 and len(gen) == 2 and len(env) == 1
        for (s, e, _), c in zip(gen, calls):  # the generated spans are the engine's ids, log-probs, versions
            assert ep.output_ids[s:e] == c.output_ids and ep.gen_logprobs[s:e] == c.gen_logprobs
            assert c.weight_versions == ep.weight_versions[s:e] == [0] * (e - s)
        s, e, _ = env[0]
        feedback = [TOK.convert_tokens_to_ids(ch) for ch in " no " + p.text]
        assert ep.output_ids[s:e][-len(feedback):] == feedback  # the template's ids of the user message
        assert ep.env_tokens == e - s


def test_a_raising_agent_is_scored_like_a_raising_reward():
    eng, _ = _agent_engine("tests.support.episode_envs.raising_agent")
    try:
        eng.submit(_prompt(1, 2), SamplingParams(max_new_tokens=8, seed=0, stop_token_ids=[EOS]), n=1, version=0)
        (ep,) = _collect(eng, 1)
    finally:
        eng.close()
    assert ep.episode_result[:2] == (-1.0, False)
    assert ep.episode_result[2].startswith("error: KeyError at episode_envs.py")
    assert ep.output_ids == [] and ep.turns == 0
