"""episodes/agent_server.py with the real `openai` client in front of a real tiny local engine:
a multi-call agent's calls stitch into one sample of exact ids (templated opening + generated ids + the
template's ids for each environment message, written out here by hand), a broken prefix starts a counted new
sample, Hermes tool calls come back as `tool_calls`, bad requests get OpenAI error bodies (fuzzed; none kills
the server), and the server leaves no thread behind."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading

import pytest
import torch

from scalerl_mega.episodes.agent_server import AgentEndpoint
from scalerl_mega.episodes.stitch import stitch_calls
from scalerl_mega.rollout.local import build_model
from tests.support import agent_engine as ae

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SYSTEM = "You add numbers."
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}}}]


@pytest.fixture(scope="module")
def tok():
    return ae.chat_tokenizer()


def _client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _oracle_logprobs(model, ids, start):
    """log p(ids[t] | ids[:t]) for t >= start, float64 over the whole sequence in one forward."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [logp[t - 1, ids[t]].item() for t in range(start, len(ids))]


def test_a_multi_call_agent_is_one_sample_of_exact_ids(tok):
    eng = ae.engine(seed=3)
    gen = ae.EngineGenerate(eng)
    users = ["what is 2+3", "try again", "the sum again"]

    def agent(base_url, task):
        client = _client(base_url)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["q"]}]
        replies = []
        for turn in range(3):
            r = client.chat.completions.create(model="policy", messages=messages, max_tokens=6 + 3 * turn,
                                               temperature=1.0, seed=11 + turn)
            replies.append(r)
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            if turn < 2:
                messages.append({"role": "user", "content": users[turn + 1]})
        return replies, messages

    with AgentEndpoint(tokenizer=tok, generate=gen, stop_token_ids=[tok.eos_token_id]) as ep:
        url = ep.open_episode("ep-0")
        assert url == f"http://127.0.0.1:{ep.port}/episodes/ep-0/v1"
        assert [m.id for m in _client(url).models.list().data] == ["scalerl-policy"]
        replies, messages = agent(url, {"q": users[0]})
        calls = ep.close_episode("ep-0")
    assert len(calls) == 3
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 0 and len(res.samples) == 1
    s = res.samples[0]
    # the opening, templated once, by hand
    opening = _enc(tok, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{users[0]}<|im_end|>\n"
                        "<|im_start|>assistant\n")
    assert s.prompt_ids == opening
    want, mask = [], []
    for k, c in enumerate(calls):
        out = c.output_ids
        # each reply is the decoded generated ids (the stop token dropped); usage counts the exact ids
        stopped = bool(out) and out[-1] == tok.eos_token_id
        assert replies[k].choices[0].message.content == tok.decode(out[:-1] if stopped else out)
        assert replies[k].choices[0].finish_reason == ("stop" if stopped else "length")
        assert replies[k].usage.completion_tokens == len(out) and replies[k].usage.prompt_tokens == len(
            opening) + len(want)
        want += out
        mask += [1] * len(out)
        if k < 2:  # the rest of the assistant turn's closing, the user turn, the next assistant header
            env = _enc(tok, ("\n" if stopped else "<|im_end|>\n") + f"<|im_start|>user\n{users[k + 1]}<|im_end|>\n"
                            "<|im_start|>assistant\n")
            want += env
            mask += [0] * len(env)
    assert s.output_ids == want and s.loss_mask == mask
    assert s.weight_versions == [0] * len(want) and s.submitted_version == 0
    # the generated ids are the engine's under this context: its log-probs = an HF forward over the whole sample
    ids = s.prompt_ids + s.output_ids
    ref = _oracle_logprobs(build_model(eng.config.model), ids, len(s.prompt_ids))
    gen_pos = [j for j, m in enumerate(mask) if m]
    assert max(abs(s.gen_logprobs[j] - ref[j]) for j in gen_pos) < 1e-4
    assert all(s.gen_logprobs[j] == 0.0 for j, m in enumerate(mask) if not m)
    # re-templating the final conversation (what a naive server sends) does not give these ids
    assert _enc(tok, tok.apply_chat_template(messages, tokenize=False)) != ids[:len(ids)]


def test_an_edited_history_is_a_broken_prefix_and_a_new_sample(tok):
    gen = ae.EngineGenerate(ae.engine(seed=4))
    with AgentEndpoint(tokenizer=tok, generate=gen) as ep:
        client = _client(ep.open_episode("e"))
        messages = [{"role": "user", "content": "what is 2+3"}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=5, seed=1)
        messages += [{"role": "assistant", "content": r.choices[0].message.content + " (edited)"},
                     {"role": "user", "content": "again"}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=5, seed=2)
        calls = ep.close_episode("e")
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 1 and [len(s.output_ids) for s in res.samples] == [len(c.output_ids) for c in calls]
    edited = r.choices[0].message.content + " (edited)"
    assert res.samples[1].prompt_ids == _enc(tok, f"<|im_start|>user\nwhat is 2+3<|im_end|>\n<|im_start|>assistant\n"
                                                  f"{edited}<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
                                                  "<|im_start|>assistant\n")


def test_hermes_tool_calls_come_back_as_tool_calls_and_the_result_extends_the_sample(tok):
    open_, json_, close_ = tok.convert_tokens_to_ids(["<tool_call>", ae.TOOL_JSON, "</tool_call>"])
    header_end = _enc(tok, "<|im_start|>assistant\n")[-1]
    chain = {header_end: open_, open_: json_, json_: close_, close_: tok.eos_token_id}
    eng = ae.engine(hidden=64)
    eng.update_weights(ae.scripted_weights(chain).state_dict().items(), version=1)
    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(eng)) as ep:
        client = _client(ep.open_episode("tools"))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 2+3"}]
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        assert [(tc.type, tc.function.name, json.loads(tc.function.arguments)) for tc in msg.tool_calls] == [
            ("function", "add", {"a": 2, "b": 3})]
        messages += [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"}]
        r2 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
        assert r2.choices[0].message.tool_calls[0].function.name == "add"
        calls = ep.close_episode("tools")
    assert [c.output_ids for c in calls] == [[open_, json_, close_, tok.eos_token_id]] * 2
    assert [c.weight_versions for c in calls] == [[1] * 4] * 2
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 0
    env = _enc(tok, "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert res.samples[0].output_ids == calls[0].output_ids + env + calls[1].output_ids
    assert res.samples[0].loss_mask == [1] * 4 + [0] * len(env) + [1] * 4


def _post(port, path, body: bytes, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


VALID = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
BAD = [  # body, status, words the message must contain
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object, got list"),
    (dict(VALID, n=2), 400, "n=1 only"),
    (dict(VALID, stream="yes"), 400, "stream='yes' must be a boolean"),
    (dict(VALID, stream=True, stream_options=[1]), 400, "stream_options must be an object"),
    (dict(VALID, messages=[]), 400, "messages must be a non-empty list"),
    (dict(VALID, messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role='wizard'"),
    (dict(VALID, messages=[{"role": "user", "content": 5}]), 400, "messages[0].content must be a string"),
    (dict(VALID, messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400, "only text is served"),
    (dict(VALID, messages=[{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                               "arguments": "{x"}}]}]),
     400, "arguments is not valid JSON"),
    (dict(VALID, max_tokens=0), 400, "max_tokens=0 must be an integer >= 1"),
    (dict(VALID, max_tokens=True), 400, "max_tokens=True"),
    (dict(VALID, max_completion_tokens="9"), 400, "max_tokens='9'"),
    (dict(VALID, temperature=-1), 400, "temperature=-1 must be a number in [0.0, 2.0]"),
    (dict(VALID, top_p=0), 400, "top_p=0 must be a number in (0.0, 1.0]"),
    (dict(VALID, seed=-3), 400, "seed=-3"),
    (dict(VALID, stop="two words"), 400, "only stop strings of exactly one token"),
    (dict(VALID, stop=[""]), 400, "stop must be"),
    (dict(VALID, tools=[{"type": "function"}]), 400, "tools[0] must be"),
    (dict(VALID, tool_choice="required"), 400, "tool_choice='required'"),
    (dict(VALID, max_tokens=100000), 400, "exceeds max_seq_len"),  # the engine's refusal, as a 400
]


def test_bad_requests_get_openai_error_bodies_and_the_server_keeps_serving(tok):
    failing = {"on": False}
    gen = ae.EngineGenerate(ae.engine(seed=5))

    def generate(req):
        if failing["on"]:
            raise RuntimeError("engine process died")
        return gen(req)

    with AgentEndpoint(tokenizer=tok, generate=generate, default_max_tokens=3) as ep:
        url = ep.open_episode("f")
        path = "/episodes/f/v1/chat/completions"
        for body, status, words in BAD:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            got, text = _post(ep.port, path, raw)
            err = json.loads(text)["error"]
            assert (got, err["type"]) == (status, "invalid_request_error") and words in err["message"], (body, text)
        # the openai client raises its typed error with the server's message
        with pytest.raises(openai.BadRequestError, match="n=1 only"):
            _client(url).chat.completions.create(model="m", messages=VALID["messages"], n=2)
        assert _post(ep.port, "/episodes/nope/v1/chat/completions", json.dumps(VALID).encode())[0] == 404
        assert _post(ep.port, "/elsewhere", b"{}")[0] == 404
        assert _post(ep.port, "/episodes/f/v1/models", b"{}")[0] == 405
        assert _post(ep.port, path, b"", {"Content-Length": "x"})[0] in (400, 411)
        failing["on"] = True
        got, text = _post(ep.port, path, json.dumps(VALID).encode())
        assert got == 500 and json.loads(text)["error"]["message"] == \
            "the engine call failed: RuntimeError: engine process died"
        failing["on"] = False
        with socket.create_connection(("127.0.0.1", ep.port)) as s:  # not HTTP at all
            s.sendall(b"\x00\x01garbage\r\n\r\n")
            s.recv(4096)
        # fuzz: random mutations of a valid body; every answer is a JSON completion or a 400, never a traceback
        rng = random.Random(0)
        junk = [None, True, -1, 0, 1.5, "", "x" * 3, [], [1], {}, {"role": "user"}, [{"role": "user", "content": []}]]
        keys = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
                "seed", "tools", "tool_choice", "stream"]
        seen = set()
        for _ in range(60):
            body = json.loads(json.dumps(VALID))
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(keys)
                if rng.random() < 0.2:
                    body.pop(key, None)
                elif key == "messages" and rng.random() < 0.5:
                    field = rng.choice(["content", "role", "tool_calls"])
                    body["messages"] = [{"role": "user", field: rng.choice(junk)}]
                else:
                    body[key] = rng.choice(junk)
            got, text = _post(ep.port, path, json.dumps(body).encode())
            seen.add(got)
            assert got in (200, 400) and "Traceback" not in text, (body, text)
            if got == 200 and body.get("stream") is True:  # server-sent events, the last one [DONE]
                assert text.endswith("data: [DONE]\n\n") and '"chat.completion.chunk"' in text, text
                continue
            assert ("choices" if got == 200 else "error") in json.loads(text), text
        assert seen == {200, 400}
        r = _client(url).chat.completions.create(model="m", messages=VALID["messages"], max_tokens=2)
        assert r.usage.completion_tokens >= 1
        assert len(ep.close_episode("f")) == len(gen.requests)


def test_the_server_stops_with_its_context_and_leaves_no_thread(tok):
    before = set(threading.enumerate())
    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(ae.engine(seed=6))) as ep:
        url = ep.open_episode("s")
        idle = socket.create_connection(("127.0.0.1", ep.port))  # a client that never sends its request
        _client(url).chat.completions.create(model="m", messages=VALID["messages"], max_tokens=2)
        port = ep.port
        assert len(set(threading.enumerate()) - before) >= 2  # the server thread and the idle connection's
    idle.close()
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(RuntimeError, match="not serving"):
        ep.open_episode("t")


def test_a_template_that_rewrites_earlier_turns_falls_back_to_a_new_sample(tok):
    """Like Qwen3's stripping of earlier `<think>` blocks: this template shows an assistant turn in full only while
    it is the last message, so templating the history with a new user turn does not extend it; the endpoint
    templates the call afresh (the ids the model will really see) and the stitcher counts a broken prefix."""
    rewriting = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
                          "{% if m.role == 'assistant' and not loop.last %}{{ '(earlier)' }}{% else %}{{ m.content }}"
                          "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
                          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with AgentEndpoint(tokenizer=tok, chat_template=rewriting, generate=ae.EngineGenerate(ae.engine(seed=8))) as ep:
        client = _client(ep.open_episode("r"))
        messages = [{"role": "user", "content": "what is 2+3"}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=4, seed=1)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=4, seed=2)
        calls = ep.close_episode("r")
    res = stitch_calls(calls, prompt_id="p")
    assert res.broken_prefixes == 1 and len(res.samples) == 2
    assert calls[1].prompt_ids == _enc(tok, "<|im_start|>user\nwhat is 2+3<|im_end|>\n<|im_start|>assistant\n(earlier)"
                                            "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")


def test_moe_routes_concatenate_across_the_calls_of_an_episode(tok):
    """Routing replay across turns: on a Llama-4 MoE engine recording routes, with a weight update between the
    two calls, the stitched sample's routes take each position from the call whose forward sampled the next id:
    positions before turn 1's last id are the v1 forward's (a full-sequence HF forward of the v1 model), the rest
    the v2 forward's (call 2 prefilled the whole prompt with v2), with their versions; gates within float32
    rounding."""
    from scalerl_mega.rollout.core import CoreConfig, moe_routers
    from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec
    from tests.support.routing_probe import hf_router_logits

    cfg = dict(vocab_size=ae.VOCAB, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
               num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
               attention_chunk_size=1024, max_position_embeddings=1024, tie_word_embeddings=False)
    models = {}
    for version in (1, 2):
        models[version] = build_model(LocalModelSpec(arch="llama4", config=cfg, init_seed=version))
        with torch.no_grad():
            for r in moe_routers(models[version]):
                r.weight.mul_(20.0)  # spread the router logits: tokens and versions take different experts
    spec = LocalModelSpec(arch="llama4", config=cfg, init_seed=0)
    eng = InProcessRolloutEngine(LocalEngineConfig(model=spec, core=CoreConfig(max_batch=2, max_seq_len=256,
                                                                                record_routes=True)))
    eng.update_weights(models[1].state_dict().items(), version=1)
    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(eng)) as ep:
        client = _client(ep.open_episode("moe"))
        messages = [{"role": "user", "content": "what is 2+3"}]
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=5, seed=1)
        eng.update_weights(models[2].state_dict().items(), version=2)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=5, seed=2)
        calls = ep.close_episode("moe")
    s = stitch_calls(calls, prompt_id="p").samples[0]
    ids = s.prompt_ids + s.output_ids
    n1 = len(calls[0].prompt_ids) + len(calls[0].output_ids) - 1  # positions of call 1's forwards
    R = s.routes
    R.check(where="stitched")
    assert R.num_positions == len(ids) - 1 and R.versions == [1] * n1 + [2] * (len(ids) - 1 - n1)
    top1, want1 = hf_router_logits(models[1], ids, output=1).max(dim=-1)  # [N, L] top-1 over the experts
    top2, want2 = hf_router_logits(models[2], ids, output=1).max(dim=-1)
    want = torch.cat([want1[:n1], want2[n1:-1]])
    assert not torch.equal(want1[:-1], want2[:-1])  # the versions route differently: provenance is visible
    got = torch.tensor(R.expert_ids).view(R.num_positions, R.num_layers)
    assert torch.equal(got.long(), want)
    gates = torch.tensor(R.weights, dtype=torch.float64).view(R.num_positions, R.num_layers)
    assert torch.allclose(gates, torch.sigmoid(torch.cat([top1[:n1], top2[n1:-1]])), atol=1e-5)


def test_concurrent_episodes_keep_their_own_calls(tok):
    """Two agents on two episodes at once (one thread each; both first calls are held in the server until the
    other arrives): each episode's calls are its own and stitch into one sample whose opening is its question."""
    gen = ae.EngineGenerate(ae.engine(seed=9))
    results, errors = {}, []
    both_in = threading.Barrier(2, timeout=120)
    first = {}

    def generate(req):
        if first.setdefault(req.episode_id, True):
            first[req.episode_id] = False
            both_in.wait()  # both episodes' first calls are in flight at once
        return gen(req)

    def agent(url, question):
        try:
            client = _client(url)
            messages = [{"role": "user", "content": question}]
            for turn in range(3):
                r = client.chat.completions.create(model="m", messages=messages, max_tokens=3, seed=turn)
                messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    with AgentEndpoint(tokenizer=tok, generate=generate) as ep:
        threads = [threading.Thread(target=agent, args=(ep.open_episode(f"c{i}"), q))
                   for i, q in enumerate(["what is 2+3", "the sum of 7 and 9"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(2):
            results[i] = ep.close_episode(f"c{i}")
    assert errors == [] and len(gen.requests) == 6
    for i, q in enumerate(["what is 2+3", "the sum of 7 and 9"]):
        res = stitch_calls(results[i], prompt_id=f"c{i}")
        assert res.broken_prefixes == 0 and len(results[i]) == 3
        assert res.samples[0].prompt_ids == _enc(tok, f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")


def test_a_streamed_call_is_the_same_call_sent_as_server_sent_events(tok):
    """`stream=true` (agent SDKs that always stream): the openai client's chunks rebuild the reply the engine's ids
    decode to, tool calls included (the scripted Hermes block), with the usage of the recorded ids; the call
    records and stitches exactly as an unstreamed one."""
    open_, json_, close_ = tok.convert_tokens_to_ids(["<tool_call>", ae.TOOL_JSON, "</tool_call>"])
    header_end = _enc(tok, "<|im_start|>assistant\n")[-1]
    eng = ae.engine(hidden=64)
    eng.update_weights(ae.scripted_weights({header_end: open_, open_: json_, json_: close_,
                                            close_: tok.eos_token_id}).state_dict().items(), version=1)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 2+3"}]
    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(eng)) as ep:
        client = _client(ep.open_episode("streamed"))
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        calls = ep.close_episode("streamed")
    assert [c.output_ids for c in calls] == [[open_, json_, close_, tok.eos_token_id]]
    deltas = [ch.choices[0] for ch in chunks if ch.choices]
    assert [d.finish_reason for d in deltas] == [None, "tool_calls"]
    (tc,) = deltas[0].delta.tool_calls
    assert (tc.index, tc.function.name, json.loads(tc.function.arguments)) == (0, "add", {"a": 2, "b": 3})
    assert chunks[-1].choices == [] and (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (
        len(calls[0].prompt_ids), 4)
    with AgentEndpoint(tokenizer=tok, generate=ae.EngineGenerate(ae.engine(seed=3))) as ep:
        client = _client(ep.open_episode("text"))
        text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model="m", messages=messages[1:], max_tokens=6, temperature=0, stream=True) if ch.choices)
        (call,) = ep.close_episode("text")
    shown = call.output_ids[:-1] if call.output_ids[-1] == tok.eos_token_id else call.output_ids
    assert text == tok.decode(shown, skip_special_tokens=False) and len(call.output_ids) >= 1
