"""Tokenizer coverage of environment messages (episodes/coverage.py): an environment message with characters the
tokenizer lacks is spliced as `<unk>` ids; the run warns once with the first example, counts them per step
(`episode/unknown_ids`) and the dump's `seen` holds what the model saw beside the messages' text. Hand-worked on
the synthetic task's character tokenizer: " no box " has two characters outside it (b, x)."""

from __future__ import annotations

import logging

import pytest

from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer
from scalerl_mega.episodes.coverage import UnknownIds
from scalerl_mega.episodes.env import EnvRunner
from scalerl_mega.episodes.records import episode_lines, episode_metrics
from scalerl_mega.types import Group, ScoredCompletion

TOK = build_arith_tokenizer()
UNK = TOK.unk_token_id
COVERAGE_LOG = "scalerl_mega.episodes.coverage"


def test_unknown_ids_are_counted_warned_once_and_rendered(caplog):
    ids = TOK(" no box ", add_special_tokens=False)["input_ids"]
    by_hand = [TOK.convert_tokens_to_ids(c) for c in " no "] + [UNK, TOK.convert_tokens_to_ids("o"), UNK] + \
        [TOK.convert_tokens_to_ids(" ")]
    assert ids == by_hand
    cov = UnknownIds(TOK)
    with caplog.at_level(logging.WARNING, logger=COVERAGE_LOG):
        assert cov.count(ids, [{"role": "user", "content": " no box "}]) == 2
        assert cov.count(ids, [{"role": "user", "content": " no box "}]) == 2  # counted again, not warned
        assert cov.count(TOK("no", add_special_tokens=False)["input_ids"], [{"role": "user", "content": "no"}]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == COVERAGE_LOG]
    assert len(warnings) == 1
    assert "maps to 2 unknown id(s) of the tokenizer (id 3" in warnings[0]
    assert "'user:  no box ' is seen by the model as ' no <unk>o<unk> '" in warnings[0]
    assert cov.seen(ids) == " no <unk>o<unk> "


def test_a_tokenizer_without_an_unknown_id_counts_none():
    class ByteLevel:  # every text maps (byte-level BPE): no unk_token_id
        unk_token_id = None

    assert UnknownIds(ByteLevel()).count([0, 1, 2, 3], [{"role": "user", "content": "x"}]) == 0


@pytest.mark.usefixtures("one_torch_thread")
def test_the_driver_counts_warns_and_dumps_what_the_model_saw(caplog):
    from test_episodes import _prompt, _run, _spans

    runner = EnvRunner(target="tests.support.episode_envs.ScriptedEnv", kwargs={"turns": 3, "feedback": " no box "})
    with caplog.at_level(logging.WARNING, logger=COVERAGE_LOG):
        episodes, _ = _run(runner, [_prompt(47, 38), _prompt(5, 9)])
    assert len([r for r in caplog.records if r.name == COVERAGE_LOG]) == 1  # once per run (one driver)
    spliced_total = 0
    for ep in episodes:
        env_spans = [(s, e) for s, e, m in _spans(ep.mask()) if m == 0]
        spliced_total += len(env_spans)
        assert ep.unknown_ids == 2 * len(env_spans)  # b and x of each spliced feedback; none in the question
        question = ep.messages[0]["content"]
        assert ep.seen[0] == "<bos>" + question  # the opening
        assert len(ep.seen) == 1 + len(env_spans)
        for (s, e), seen in zip(env_spans, ep.seen[1:]):
            assert seen == TOK.decode(ep.output_ids[s:e], skip_special_tokens=False)
            assert seen.endswith(" no <unk>o<unk> " + question)  # (after an <eos> when the turn stopped on a digit)
        # the text, as the environment wrote it (a last message that did not fit the budget is not spliced)
        feedback = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
        assert feedback[:len(env_spans)] == [" no box " + question] * len(env_spans)
    assert spliced_total >= 1
    groups = [Group(prompt=_prompt(0, 0), samples=[ScoredCompletion(completion=ep, reward=0.0, passed=False)
                                                   for ep in episodes])]
    assert episode_metrics(groups)["episode/unknown_ids"] == 2.0 * spliced_total
    lines = episode_lines(groups, step=1)
    assert [line["seen"] for line in lines] == [ep.seen for ep in episodes]
    assert all("box" in " ".join(m["content"] for m in line["messages"]) for line in lines
               if len(line["seen"]) > 1)
