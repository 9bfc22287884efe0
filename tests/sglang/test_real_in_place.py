"""The project's SGLang client against a real SGLang 0.5.23 server on CPU, launched the way the project
launches a server its engine updates in place (PipelineRL; `SGLangServerConfig.pause_mode="in_place"`).

One server and one engine for the module (the weight-sync group is formed once); the tests run in file
order and each leaves the server on the weights of `engine.version` (seed = version). The last test kills
the server mid-update.
"""

from __future__ import annotations

import time

import pytest
import requests

from scalerl_mega.rollout.sglang import IN_PLACE_FLAGS, SGLangClient
from scalerl_mega.weight_sync import WeightSyncError
from scalerl_mega.types import FinishReason, Prompt, SamplingParams
from tests.sglang_support.oracle import collect, full_logprobs, in_place_logprobs, max_diff, wait_decoding, weights
from tests.sglang_support.real_server import engine_for

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("one_torch_thread")]
TOL = 1e-4  # measured: 4.8e-7 between SGLang's FP32 CPU path and transformers


def _prompt(pid: str, ids: list[int]) -> Prompt:
    return Prompt(prompt_id=pid, text="", task="synthetic", gold="0", token_ids=ids)


def _sp(n: int, seed: int = 0) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, seed=seed)


@pytest.fixture(scope="module")
def server(llama_dir):
    from tests.sglang_support.real_server import launch

    s = launch(llama_dir, pause_mode="in_place")
    yield s
    s.stop()
    assert s.proc.poll() is not None


@pytest.fixture(scope="module")
def engine(server):
    eng = engine_for(server, pause_mode="in_place")
    yield eng
    eng.close()


def _update(engine, version: int) -> float:
    t0 = time.perf_counter()
    engine.update_weights(list(weights(version).state_dict().items()), version=version)
    return time.perf_counter() - t0


def _generate(engine, prompt: list[int], n_tokens: int, *, n: int = 1, seed: int = 0):
    engine.submit(_prompt(f"p{seed}-{len(prompt)}", prompt), _sp(n_tokens, seed), n=n, version=engine.version)
    return collect(engine, n)


def test_emulation_answers_the_scripted_exchange_like_the_real_server(server, llama_dir):
    """The same script (generate, batch, bad requests, a full weight push, generate, push back, leave the
    group) against the real server and against the emulation serving the same checkpoint: every field the
    emulation sends equals the real one (greedy tokens identical, log-probs within 1e-4)."""
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.sglang_emulation import SpawnedTestServer
    from tests.sglang_support.exchange import compare, scripted_exchange

    emu = SpawnedTestServer(LocalModelSpec(arch="llama", path=llama_dir), model_path=llama_dir,
                            core_config=CoreConfig(max_batch=8, max_seq_len=256), sync_timeout_s=60.0)
    try:
        fake = scripted_exchange(emu.url, old=weights(0), new=weights(1), group_name="scripted-emulation")
    finally:
        emu.stop()
    real = scripted_exchange(server.url, old=weights(0), new=weights(1), group_name="scripted-real")
    assert [s for s, _, _ in real] == [s for s, _, _ in fake]
    diffs = []
    for (step, status, body), (_, fstatus, fbody) in zip(real, fake):
        if status != fstatus:
            diffs.append(f"{step}: HTTP {status} != {fstatus} (real {body!r}, emulation {fbody!r})")
        elif status == 200:
            diffs += [f"{step}{d}" for d in compare(body, fbody)]
    assert not diffs, "\n".join(diffs)
    gen = dict((s, b) for s, _, b in real)
    # the script is not vacuous: the push changed the served tokens' log-probs, and was undone
    assert gen["generate_after_update"]["meta_info"]["weight_version"] == "1"
    assert gen["generate"]["meta_info"]["output_token_logprobs"] != gen["generate_after_update"]["meta_info"][
        "output_token_logprobs"]
    assert SGLangClient(server.url).model_info()["weight_version"] == "0"


def test_generation_and_logprobs_match_the_trainer(server, engine):
    """/generate log-probs of sampled tokens == the trainer's FP32 forward of the same weights."""
    prompts = [[1, 17, 300, 5], [1, 900, 901, 902, 903, 42]]
    for i, p in enumerate(prompts):
        done = _generate(engine, p, 16, n=2, seed=i)
        assert sorted(c.sample_index for c in done) == [0, 1]
        for c in done:
            assert c.finish_reason == FinishReason.LENGTH and len(c.output_ids) == 16
            assert c.weight_versions == [0] * 16
            assert max_diff(c.gen_logprobs, full_logprobs(weights(0), p, c.output_ids)) < TOL
            # the check can tell weights apart: another seed's model is whole nats away
            assert max_diff(c.gen_logprobs, full_logprobs(weights(1), p, c.output_ids)) > 0.5


def test_model_info_manifest_and_launch_flags(server, engine, llama_dir):
    client = SGLangClient(server.url)
    info = client.model_info()
    assert info["model_path"] == llama_dir and info["weight_version"] == "0"
    assert info["architectures"] == ["LlamaForCausalLM"] and info["is_generation"] is True
    manifest = engine.manifest()  # built from the model_path the server was launched with
    want = {n: tuple(t.shape) for n, t in weights(0).state_dict().items()}
    assert {n: s.shape for n, s in manifest.specs.items()} == want and len(want) == 21
    server_info = client.server_info()
    assert all(server_info[key] is True for key in IN_PLACE_FLAGS.values())  # the in_place launch


def test_in_place_update_with_a_request_in_flight_tags_the_exact_boundary(server, engine):
    """A 120-token request is decoding when the weights change: tokens tagged v0 are the old model's, the
    first token tagged v1 is the first one computed with the new weights (over the old KV, as in_place
    keeps it). Fails with SGLang's overlap scheduler, which tags one token early."""
    prompt = [1, 44, 45, 46, 47, 48, 49, 50]
    old, new = weights(0), weights(1)
    engine.manifest()  # built before the request starts: the update must reach it mid-decode
    engine.submit(_prompt("long", prompt), _sp(120, seed=7), n=1, version=0)
    wait_decoding(server.url, min_tokens=len(prompt) + 10)
    seconds = _update(engine, 1)
    assert engine.version == 1 and engine.last_sync_stats.buckets > 1
    (c,) = collect(engine, 1)
    assert 1 in c.weight_versions, "the request finished before the update reached the server"
    b = c.weight_versions.index(1)
    assert 10 <= b < 120 and c.weight_versions == [0] * b + [1] * (120 - b), c.weight_versions
    assert max_diff(c.gen_logprobs[:b], full_logprobs(old, prompt, c.output_ids)[:b]) < TOL
    assert max_diff(c.gen_logprobs, in_place_logprobs(old, new, prompt, c.output_ids, b)) < TOL
    # the reference tells a boundary one token off apart
    assert max_diff(c.gen_logprobs, in_place_logprobs(old, new, prompt, c.output_ids, b - 1)) > 1e-2
    assert max_diff(c.gen_logprobs, in_place_logprobs(old, new, prompt, c.output_ids, b + 1)) > 1e-2
    print(f"in_place update with a request in flight: {seconds:.2f}s, boundary at token {b}")
    # a request after the update: all new weights
    (d,) = _generate(engine, prompt, 8, seed=8)
    assert d.weight_versions == [1] * 8 and max_diff(d.gen_logprobs, full_logprobs(new, prompt, d.output_ids)) < TOL


def test_prompts_sharing_a_prefix_after_an_update_are_recomputed(server, engine):
    """The stale-prefix-cache defect: a prompt computed under v1, then an in_place update to v2, then the
    same prompt and one extending it. Their log-probs must be v2's (with SGLang's radix cache on and no
    flush -- the client cannot flush while in_place keeps requests running -- they were 0.2-27 nats off)."""
    shared = [1] + list(range(100, 160))
    (a,) = _generate(engine, shared, 4, seed=1)
    assert max_diff(a.gen_logprobs, full_logprobs(weights(1), shared, a.output_ids)) < TOL
    _update(engine, 2)
    for prompt in (shared, shared + [7, 8, 9]):
        (c,) = _generate(engine, prompt, 4, seed=2)
        assert c.weight_versions == [2] * 4
        assert max_diff(c.gen_logprobs, full_logprobs(weights(2), prompt, c.output_ids)) < TOL


def test_rejected_update_keeps_the_old_weights_and_generating(server, engine):
    """Wrong name / wrong shape: refused before anything is sent (the manifest check) -- and, with the
    check off, a wrong shape sent anyway is refused by SGLang itself; either way the server keeps v2 and
    generates."""
    prompt = [1, 5, 6, 7]
    good = list(weights(3).state_dict().items())
    wrong_name = [("model.layers.0.mlp.gate.weight" if n == "model.layers.0.mlp.gate_proj.weight" else n, t)
                  for n, t in good]
    wrong_shape = [(n, t[:-1] if n == "model.norm.weight" else t) for n, t in good]
    for bad, named in ((wrong_name, "model.layers.0.mlp.gate.weight"), (wrong_shape, "model.norm.weight")):
        with pytest.raises(WeightSyncError, match="before the first bucket was sent") as e:
            engine.update_weights(bad, version=3)
        assert named in str(e.value)
    # SGLang's own refusal: the wrong shape travels alone, in the last bucket, with the pre-send check off
    engine._manifest, engine._manifest_known = None, True
    try:
        last = [(n, t) for n, t in wrong_shape if n == "model.norm.weight"]
        with pytest.raises(WeightSyncError, match="model.norm.weight|update_weights_from_distributed"):
            engine.update_weights(last, version=3)
    finally:
        engine._manifest_known = False
    assert engine.version == 2
    assert SGLangClient(server.url).model_info()["weight_version"] == "2"
    (c,) = _generate(engine, prompt, 6, seed=3)
    assert c.weight_versions == [2] * 6
    assert max_diff(c.gen_logprobs, full_logprobs(weights(2), prompt, c.output_ids)) < TOL


def test_server_death_mid_update_raises_a_named_error_in_bounded_time(server, engine):
    """The server is killed after the first bucket went out: WeightSyncError naming the step, well within
    the configured deadlines (no hang)."""
    import os
    import signal

    def dying_stream():
        for i, (name, t) in enumerate(weights(4).state_dict().items()):
            if i == 8:  # a few buckets have been sent (64 KiB buckets)
                os.killpg(server.proc.pid, signal.SIGKILL)
            yield name, t

    engine._manifest, engine._manifest_known = None, True  # stream lazily: no pre-collection
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError) as e:
        engine.update_weights(dying_stream(), version=4)
    took = time.monotonic() - t0
    assert engine.version == 2
    assert server.url in str(e.value) or "broadcast" in str(e.value), e.value
    assert took < 60.0 + 10.0, took  # within WeightSyncConfig.timeout_s (+ slack), not control_timeout_s
    print(f"server killed mid-update: {type(e.value).__name__} after {took:.1f}s: {e.value}")
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=5)
