"""Multi-turn episodes on a real SGLang 0.5.23 server on CPU: an episode continues from its
full id list (turn 1 generated, an environment span appended, turn 2 submitted as every id so far), the radix
cache reuses the prefix (SGLang's `meta_info.cached_tokens`), and the generated ids' log-probs agree with the
trainer-side transformers forward over the whole episode; then the agent endpoint (episodes/agent_server.py)
backed by the project's SGLang engine, driven by the real `openai` client, stitches one sample of exact ids.

The server keeps SGLang's default radix cache (`pause_mode="retract"`; in_place launches disable it).
"""

from __future__ import annotations

import pytest

from scalerl_mega.rollout.sglang import SGLangClient
from scalerl_mega.rollout.sglang.generate import parse_generate_response
from tests.sglang_support.oracle import full_logprobs, max_diff, weights

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("one_torch_thread")]
TOL = 1e-4  # as the single-turn tests (measured there: 4.8e-7 between SGLang's FP32 CPU path and transformers)
CHAT = ("{% for m in messages %}{{ '<s>' + m.role + ': ' + m.content + '</s>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}")


@pytest.fixture(scope="module")
def server(llama_dir):
    from tests.sglang_support.real_server import launch

    s = launch(llama_dir, pause_mode="retract")  # SGLang's default: the radix cache on
    try:
        yield s
    finally:
        s.stop()


def _turn(client, ids, *, n, seed):
    body = client.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 1.0,
                                                           "sampling_seed": seed})
    return parse_generate_response(body), body["meta_info"]["cached_tokens"]


def test_an_episode_continues_from_its_full_ids_with_the_prefix_cached(server, llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    client = SGLangClient(server.url, timeout_s=300)
    client.flush_cache()  # nothing cached: turn 1 computes its whole prompt
    prompt = [1] + tok.encode("the model learn the sum of 12+30=", add_special_tokens=False)
    t1, cached1 = _turn(client, prompt, n=12, seed=5)
    env = tok.encode(" reward is 0. try again:", add_special_tokens=False)
    t2, cached2 = _turn(client, prompt + t1.output_ids + env, n=12, seed=6)
    assert cached1 == 0 and len(t1.output_ids) == 12 == len(t2.output_ids)
    # turn 2 reuses the KV of turn 1's prompt and generated ids (all but the last, which had no forward yet)
    assert cached2 == len(prompt) + len(t1.output_ids) - 1, (cached2, len(prompt), len(t1.output_ids), len(env))
    # the trainer's log-probs of every generated id, in one forward over the whole episode
    outputs = t1.output_ids + env + t2.output_ids
    ref = full_logprobs(weights(0), prompt, outputs)
    generated = list(range(len(t1.output_ids))) + list(range(len(t1.output_ids) + len(env), len(outputs)))
    assert max_diff([ref[j] for j in generated], t1.logprobs + t2.logprobs) < TOL


def test_the_agent_endpoint_on_the_sglang_engine_stitches_exact_ids(server, llama_dir):
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    from scalerl_mega.episodes.agent_server import AgentEndpoint
    from scalerl_mega.episodes.stitch import stitch_calls
    from tests.sglang_support.real_server import engine_for
    from tests.support.agent_engine import EngineGenerate

    tok = AutoTokenizer.from_pretrained(llama_dir)
    tok.chat_template = CHAT
    engine = engine_for(server, pause_mode="retract")
    try:
        with AgentEndpoint(tokenizer=tok, generate=EngineGenerate(engine), stop_token_ids=[tok.eos_token_id]) as ep:
            client = openai.OpenAI(base_url=ep.open_episode("sg"), api_key="unused", max_retries=0, timeout=300)
            messages = [{"role": "user", "content": "the sum of 12+30"}]
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=8, seed=3)
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
            client.chat.completions.create(model="m", messages=messages, max_tokens=8, seed=4)
            calls = ep.close_episode("sg")
    finally:
        engine.close()
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 0 and len(res.samples) == 1
    s = res.samples[0]
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert s.prompt_ids == enc("<s>user: the sum of 12+30</s>\n<s>assistant: ")
    out1 = calls[0].output_ids
    stopped = bool(out1) and out1[-1] == tok.eos_token_id
    env = enc(("\n" if stopped else "</s>\n") + "<s>user: again</s>\n<s>assistant: ")
    assert s.output_ids == out1 + env + calls[1].output_ids
    assert s.loss_mask == [1] * len(out1) + [0] * len(env) + [1] * len(calls[1].output_ids)
    ref = full_logprobs(weights(0), s.prompt_ids, s.output_ids)
    gen = [j for j, m in enumerate(s.loss_mask) if m]
    assert max_diff([ref[j] for j in gen], [s.gen_logprobs[j] for j in gen]) < TOL
