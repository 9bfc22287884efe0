"""verifiers 0.4's own model client against the agent endpoint (docs/extending.md).

verifiers 0.4 runs an episode itself (an async `Env.run_episode` drives a harness program whose model calls go
through its interception server to a `Client`), so it does not fit the reset/step environment interface; what
it does fit is the endpoint: its `EvalClient` relays each chat-completions request to a `base_url`, which can
be an episode's url. This test sends a two-call conversation through `EvalClient` + `ChatDialect` and checks
verifiers parses the replies and the calls stitch into one sample. verifiers pins openai<3 and is not in the
default environment: the test runs where it is installed (e.g. a separate venv with `verifiers==0.4.0`)."""

from __future__ import annotations

import asyncio

import pytest

from scalerl_mega.episodes.agent_server import AgentEndpoint
from scalerl_mega.episodes.stitch import stitch_calls
from tests.support import agent_engine as ae

pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_verifiers_eval_client_talks_to_an_episode_url():
    from verifiers.v1.clients.eval import EvalClient
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.dialects.chat import ChatDialect
    from verifiers.v1.types import SamplingConfig

    tok = ae.chat_tokenizer()

    async def two_turns(url):
        client = EvalClient(EvalClientConfig(base_url=url, api_key_var="SCALERL_UNUSED_KEY"))
        try:
            messages = [{"role": "user", "content": "what is 2+3"}]
            r1 = await client.get_response(ChatDialect(), {"model": "m", "messages": messages, "max_tokens": 5},
                                           SamplingConfig())
            messages += [{"role": "assistant", "content": r1.message.content}, {"role": "user", "content": "again"}]
            r2 = await client.get_response(ChatDialect(), {"model": "m", "messages": messages, "max_tokens": 5},
                                           SamplingConfig())
            return r1, r2
        finally:
            await client.close()

    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(ae.engine(seed=7))) as ep:
        r1, r2 = asyncio.run(two_turns(ep.open_episode("vf")))
        calls = ep.close_episode("vf")
    assert [r.usage.completion_tokens for r in (r1, r2)] == [len(c.output_ids) for c in calls]
    assert r1.message.content == tok.decode(calls[0].output_ids[:-1] if calls[0].output_ids[-1] == tok.eos_token_id
                                            else calls[0].output_ids)
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 0 and len(res.samples) == 1
