"""One template difference for both paths (episodes/template.py `ChatSplicer`): after a turn cut by a length
limit, the episode driver (`EpisodeEngine`, turn cut inside an interruption's answer budget) and the agent endpoint
(`AgentEndpoint`, a `max_tokens` cut) append the same ids: the whole closing of the assistant turn (ChatML's
`<|im_end|>` + newline, none of it generated), then the template's ids of the user message. Both are compared with
ids written out by hand (the ChatML text of tests/support/agent_engine.py's template, encoded), and with each other;
a turn that stopped on `<|im_end|>` gets only the newline."""

from __future__ import annotations

import pytest

from scalerl_mega.types import Completion, FinishReason, Prompt, SamplingParams
from tests.support import agent_engine as ae

pytest.importorskip("openai")

QUESTION = "what is 2+3"
FEEDBACK = " no " + QUESTION  # tests/support/episode_envs.ScriptedEnv's feedback


@pytest.fixture(scope="module")
def tok():
    return ae.chat_tokenizer()


def _enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


class Scripted:
    """A RolloutEngine whose turns are given: each submit answers the next (output ids, finish reason)."""

    def __init__(self, turns):
        self.turns, self.submitted, self._done = list(turns), [], []

    def submit(self, prompt, sampling, *, n, version, first_index=0):
        out, finish = self.turns.pop(0)
        self.submitted.append(list(prompt.token_ids))
        self._done.append(Completion(prompt_id=prompt.prompt_id, sample_index=first_index,
                                     prompt_ids=list(prompt.token_ids), output_ids=list(out),
                                     gen_logprobs=[-0.5] * len(out), weight_versions=[version] * len(out),
                                     finish_reason=finish, submitted_version=version))

    def poll(self, timeout_s=0.0):
        done, self._done = self._done, []
        return done

    def close(self):
        pass


def _driver_second_turn_ids(tok, first):
    """The ids the episode driver submits for turn 2 after `first` = (output ids, finish reason)."""
    from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
    from scalerl_mega.episodes.env import EnvRunner
    from scalerl_mega.episodes.pool import EpisodePool
    from scalerl_mega.episodes.template import ChatSplicer

    eos = tok.eos_token_id
    engine = Scripted([first, ([eos], FinishReason.STOP)])
    runner = EnvRunner(target="tests.support.episode_envs.ScriptedEnv", kwargs={"turns": 2})
    eng = EpisodeEngine(engine, runner=runner, splicer=ChatSplicer(tok, stop_token_ids=[eos]),
                        decode=lambda ids: tok.decode(ids, skip_special_tokens=True), pool=EpisodePool(size=1),
                        settings=EpisodeSettings(max_turns=2, budget=200, correct=1.0))
    try:
        eng.submit(Prompt(prompt_id="p", text=QUESTION, task="synthetic", gold="5"),
                   SamplingParams(max_new_tokens=50, stop_token_ids=[eos]), n=1, version=0)
        done = []
        for _ in range(20000):  # a hang guard: each poll waits on the environment's thread or the engine
            done += eng.poll(0.01)
            if done:
                break
    finally:
        eng.close()
    assert len(done) == 1 and done[0].turns == 2
    return engine.submitted[1]


def _endpoint_second_call_ids(tok, first):
    """The ids the agent endpoint sends for an agent's second call after `first` (its reply fed back unchanged)."""
    from openai import OpenAI

    from scalerl_mega.episodes.agent_server import AgentEndpoint
    from scalerl_mega.episodes.calls import GenerateResult

    out, finish = first
    answers = [(out, finish), ([tok.eos_token_id], FinishReason.STOP)]

    def generate(req):
        ids, fin = answers.pop(0)
        return GenerateResult(output_ids=list(ids), gen_logprobs=[-0.5] * len(ids), weight_versions=[0] * len(ids),
                              finish_reason=fin)

    with AgentEndpoint(tokenizer=tok, generate=generate) as ep:
        client = OpenAI(base_url=ep.open_episode("e"), api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": QUESTION}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=len(out))
        assert r.choices[0].finish_reason == ("length" if finish == FinishReason.LENGTH else "stop")
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": FEEDBACK}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        calls = ep.close_episode("e")
    assert len(calls) == 2
    return calls[1].prompt_ids


@pytest.mark.parametrize("stopped", [False, True], ids=["cut", "stopped"])
def test_driver_and_endpoint_splice_the_same_ids_after_a_cut(tok, stopped):
    opening = _enc(tok, f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    reply = _enc(tok, "the sum answer 5")
    assert tok.eos_token_id not in reply
    # a cut turn ends inside its content; a stopped one with the closing's first id, generated
    out = reply + [tok.eos_token_id] if stopped else reply
    closing = "\n" if stopped else "<|im_end|>\n"
    want = opening + out + _enc(tok, f"{closing}<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n")
    driver = _driver_second_turn_ids(tok, (out, FinishReason.STOP if stopped else FinishReason.INTERRUPTED))
    endpoint = _endpoint_second_call_ids(tok, (out, FinishReason.STOP if stopped else FinishReason.LENGTH))
    assert driver == want
    assert endpoint == want
