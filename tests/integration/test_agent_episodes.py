"""`env=agent` (episodes/agent.py): agent code written against the real `openai` client runs on the episodes' own
threads and talks to the per-episode endpoint; its calls are bridged to the local engine from the loop's `poll` and
stitched into one sample per episode with the engine's exact ids (decode-free checks); a raising agent, or one past
its own-time deadline, is dropped (or scored like a raising reward); a call longer than the engine's sequence gets
a 400 and the run goes on."""

from __future__ import annotations

import pytest

pytest.importorskip("scalerl_mega.episodes.agent_server")
pytest.importorskip("openai")

from scalerl_mega.episodes.agent import AgentEngine, AgentSettings  # noqa: E402
from scalerl_mega.episodes.failures import EpisodeFailures  # noqa: E402
from scalerl_mega.episodes.pool import EpisodePool  # noqa: E402
from scalerl_mega.episodes.template import FIXED_TEMPLATES  # noqa: E402
from scalerl_mega.types import SamplingParams  # noqa: E402
from tests.unit.test_episodes import EOS, TOK, Recording, _prompt, _spans  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Held(Recording):
    """The engine, whose answers the test holds back (`hold`) while it moves the deadline clock."""

    hold = False

    def poll(self, timeout_s=0.0):
        return [] if self.hold else super().poll(timeout_s)


def _agent_engine(target: str, *, on_error: str = "drop", max_seq_len: int = 0, clock=None):
    import copy
    import time

    tok = copy.copy(TOK)
    tok.chat_template = FIXED_TEMPLATES["arith"]
    rec = Held()
    return AgentEngine(rec, tokenizer=tok, target=target, pool=EpisodePool(size=4), stop_token_ids=[EOS],
                       settings=AgentSettings(correct=1.0, max_turns=4, budget=60, step_timeout_s=10.0,
                                              episode_timeout_s=1e6, clock=clock or time.monotonic),
                       failures=EpisodeFailures(on_error=on_error, failure_reward=-1.0), max_seq_len=max_seq_len), rec


def _collect(eng, n):
    """Poll (the loop's role: it answers the agents' calls) until `n` episodes finished; 300 s is a hang guard."""
    import time

    out, deadline = [], time.monotonic() + 300
    while len(out) < n and time.monotonic() < deadline:
        out += eng.poll(0.05)
    assert len(out) == n, f"{len(out)} of {n} agent episodes finished"
    return out


def _two_prompts_twice(target: str, *, version: int):
    """The agent `target` on 2 prompts x 2 episodes each, run to their end: (episodes, recording engine, prompts)."""
    eng, rec = _agent_engine(target)
    prompts = [_prompt(47, 38), _prompt(5, 9)]
    try:
        for i, p in enumerate(prompts):
            eng.submit(p, SamplingParams(max_new_tokens=16, seed=10 * i, stop_token_ids=[EOS]), n=2, version=version)
        return _collect(eng, 4), rec, prompts
    finally:
        eng.close()


def test_openai_client_agent_episodes_keep_the_engines_ids():
    episodes, rec, prompts = _two_prompts_twice("tests.support.episode_envs.retry_agent", version=3)
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


@pytest.mark.parametrize("on_error", ["drop", "score_incorrect"])
def test_a_raising_agent_is_dropped_or_scored_like_a_raising_reward(on_error):
    eng, _ = _agent_engine("tests.support.episode_envs.raising_agent", on_error=on_error)
    try:
        eng.submit(_prompt(1, 2), SamplingParams(max_new_tokens=8, seed=0, stop_token_ids=[EOS]), n=1, version=0)
        (ep,) = _collect(eng, 1)
    finally:
        eng.close()
    if on_error == "drop":
        assert ep.episode_result[:2] == (0.0, False)
        assert ep.episode_result[2].startswith("dropped: agent_error: error: KeyError at episode_envs.py")
    else:
        assert ep.episode_result[:2] == (-1.0, False)
        assert ep.episode_result[2].startswith("error: KeyError at episode_envs.py")
    assert ep.output_ids == [] and ep.turns == 0


def test_an_agent_past_its_own_time_is_dropped_while_waiting_for_generation_is_not_its_time():
    """On a manual deadline clock (step deadline 10 s): while the agent's call waits in the engine (held back), the
    clock passes 1000 s and the episode goes on; once the call is answered and the agent blocks in its own code,
    11 s more drop it."""
    from tests.support.episode_envs import BLOCKED, RELEASE, ManualClock

    RELEASE.clear()
    BLOCKED.clear()
    clock = ManualClock()
    eng, rec = _agent_engine("tests.support.episode_envs.hanging_agent", clock=clock)
    rec.hold = True
    try:
        eng.submit(_prompt(1, 2), SamplingParams(max_new_tokens=4, seed=0, stop_token_ids=[EOS]), n=1, version=0)
        for _ in range(20000):  # a hang guard: until the agent's call reached the engine
            assert eng.poll(0.01) == []
            if rec.submitted:
                break
        clock.advance(1000.0)
        for _ in range(3):
            assert eng.poll(0.0) == []  # waiting for generation: not the agent's own time
        rec.hold = False
        for _ in range(20000):
            assert eng.poll(0.01) == []
            if BLOCKED.is_set():
                break
        clock.advance(11.0)
        (ep,) = _collect(eng, 1)
    finally:
        RELEASE.set()
        eng.close()
    assert ep.episode_result == (0.0, False, "dropped: step_timeout: tests.support.episode_envs.hanging_agent ran past "
                                             "env.step_timeout_s=10 s of its own time")
    assert ep.turns == 1 and len(rec.returned) == 1  # its one call was answered before the deadline fired


def test_a_call_longer_than_the_engines_sequence_gets_a_400_and_the_run_goes_on():
    """`max_seq_len` 20: the question (`<bos>Q:12+34=`, 9 ids) with max_tokens=16 is refused with an OpenAI-style
    400 (the real `openai` client raises BadRequestError carrying it); a malformed body too; the agent goes on, its
    refused calls are counted in the episode, and a call that fits is served."""
    eng, rec = _agent_engine("tests.support.episode_envs.oversized_agent", max_seq_len=20)
    try:
        eng.submit(_prompt(12, 34), SamplingParams(max_new_tokens=8, seed=0, stop_token_ids=[EOS]), n=1, version=0)
        (ep,) = _collect(eng, 1)
    finally:
        eng.close()
    from tests.support.episode_envs import OVERSIZED_SEEN

    too_long, malformed = OVERSIZED_SEEN["too_long"], OVERSIZED_SEEN["malformed"]
    assert too_long["status"] == 400 and too_long["code"] == "context_length_exceeded"
    assert "maximum context length is 20 tokens" in too_long["message"] and "9 tokens in the messages" in too_long["message"]
    assert malformed["status"] == 400 and malformed["param"] == "messages"
    assert ep.refused_calls == 2 and ep.turns == 1 and ep.episode_result == (1.0, True, "agent")
    assert len(rec.returned) == 1 and len(next(iter(rec.returned.values())).prompt_ids) == 9


def test_agent_messages_outside_the_vocabulary_are_counted_warned_once_and_dumped(caplog):
    """Tokenizer coverage on the endpoint's templating: the agent's feedback " no box " + the question has two
    characters outside the arith tokenizer's 47 tokens (b, x), so each episode's second call is spliced with two
    `<unk>` ids (hand-worked: ` no ` then `<unk> o <unk>` then ` ` then the question's characters, after the
    `<eos>` closing a turn the engine did not end itself). The run warns once (one endpoint), the count reaches the
    step's `episode/unknown_ids` (4 episodes x 2) and the dump's `seen` holds what the model saw."""
    import logging
    import re

    from scalerl_mega.episodes.records import episode_lines, episode_metrics
    from scalerl_mega.types import Group, ScoredCompletion

    log_name = "scalerl_mega.episodes.coverage"
    with caplog.at_level(logging.WARNING, logger=log_name):
        episodes, _, prompts = _two_prompts_twice("tests.support.episode_envs.box_retry_agent", version=0)
    warnings = [r.getMessage() for r in caplog.records if r.name == log_name]
    assert len(warnings) == 1, warnings
    assert re.search(r"maps to 2 unknown id\(s\) of the tokenizer \(id 3, .*'user:  no box (Q:47\+38=|Q:5\+9=)' is "
                     r"seen by the model as '(<eos>)? no <unk>o<unk> \1'", warnings[0]), warnings[0]
    unk, ch = TOK.unk_token_id, TOK.convert_tokens_to_ids
    for ep in episodes:
        p = next(p for p in prompts if p.prompt_id == ep.prompt_id)
        assert ep.turns == 2 and ep.broken_prefixes == 0
        (s, e, _), = [span for span in _spans(ep.mask()) if span[2] == 0]
        spliced = ep.output_ids[s:e]
        by_hand = [ch(c) for c in " no "] + [unk, ch("o"), unk, ch(" ")] + [ch(c) for c in p.text]
        assert spliced[-len(by_hand):] == by_hand and spliced[:-len(by_hand)] in ([], [EOS])
        assert ep.unknown_ids == 2
        assert ep.seen == ["<bos>" + p.text, TOK.decode(spliced, skip_special_tokens=False)]
        assert ep.seen[1].endswith(" no <unk>o<unk> " + p.text)
    groups = [Group(prompt=prompts[0], samples=[ScoredCompletion(completion=ep, reward=0.0, passed=False)
                                                for ep in episodes])]
    assert episode_metrics(groups)["episode/unknown_ids"] == 8.0
    lines = episode_lines(groups, step=1)
    assert [line["seen"] for line in lines] == [ep.seen for ep in episodes]
    assert all(line["messages"][2]["content"].startswith(" no box ") for line in lines)  # the text as written
