"""The other pause modes against a real SGLang 0.5.23 server on CPU, launched with SGLang's defaults (radix
cache and overlap scheduler on: `SGLangServerConfig.pause_mode="retract"`), where the update flushes the
cache itself (`flush_cache=true`). Also the control experiment for the in_place defects: this server lacks
the in_place flags, the engine refuses in_place updates to it, and forcing one reproduces the stale
prefix cache the in_place launch avoids (tests/sglang/test_real_in_place.py).

One server and one engine for the module; tests run in file order, the server holds the weights of seed
`engine.version`.
"""

from __future__ import annotations

import pytest

from scalerl_mega.rollout.sglang import SGLangError
from scalerl_mega.types import FinishReason, Prompt, SamplingParams
from tests.sglang_support.oracle import collect, full_logprobs, in_place_logprobs, max_diff, wait_decoding, weights
from tests.sglang_support.real_server import engine_for

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("one_torch_thread")]
TOL = 1e-4


@pytest.fixture(scope="module")
def server(llama_dir):
    from tests.sglang_support.real_server import launch

    s = launch(llama_dir, pause_mode="retract")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine(server):
    eng = engine_for(server, pause_mode="retract")
    yield eng
    eng.close()


def _submit(engine, pid: str, prompt: list[int], n_tokens: int, seed: int) -> None:
    engine.submit(Prompt(prompt_id=pid, text="", task="synthetic", gold="0", token_ids=prompt),
                  SamplingParams(max_new_tokens=n_tokens, seed=seed), n=1, version=engine.version)


def _update(engine, version: int) -> None:
    engine.update_weights(list(weights(version).state_dict().items()), version=version)


@pytest.fixture(autouse=True)
def _ready(engine):
    """The manifest and the next weights exist before a test's request starts decoding."""
    engine.manifest()
    for seed in range(5):
        weights(seed)


def test_retract_update_with_a_request_in_flight(server, engine):
    """retract: the running request's KV is dropped and recomputed with the new weights, so every token
    tagged v1 is exactly the new model's over the whole sequence, every token tagged v0 the old one's."""
    prompt = [1, 60, 61, 62, 63, 64]
    _submit(engine, "retract", prompt, 120, seed=4)
    wait_decoding(server.url, min_tokens=len(prompt) + 10)
    _update(engine, 1)
    (c,) = collect(engine, 1)
    b = c.weight_versions.index(1)
    assert 10 <= b < 120 and c.weight_versions == [0] * b + [1] * (120 - b), c.weight_versions
    assert c.finish_reason == FinishReason.LENGTH
    assert max_diff(c.gen_logprobs[:b], full_logprobs(weights(0), prompt, c.output_ids)[:b]) < TOL
    assert max_diff(c.gen_logprobs[b:], full_logprobs(weights(1), prompt, c.output_ids)[b:]) < TOL


def test_abort_update_with_a_request_in_flight(server, engine):
    """abort: the running request comes back at once with its partial output (finish abort), all of it
    from the old weights; the next request runs on the new ones."""
    engine.config.pause_mode = "abort"
    try:
        prompt = [1, 70, 71, 72]
        _submit(engine, "abort", prompt, 120, seed=5)
        wait_decoding(server.url, min_tokens=len(prompt) + 10)
        _update(engine, 2)
        (c,) = collect(engine, 1)
        n = len(c.output_ids)
        assert c.finish_reason == FinishReason.ABORT and 10 <= n < 120
        assert c.weight_versions == [1] * n
        assert max_diff(c.gen_logprobs, full_logprobs(weights(1), prompt, c.output_ids)) < TOL
        _submit(engine, "after-abort", prompt, 8, seed=6)
        (d,) = collect(engine, 1)
        assert d.weight_versions == [2] * 8
        assert max_diff(d.gen_logprobs, full_logprobs(weights(2), prompt, d.output_ids)) < TOL
    finally:
        engine.config.pause_mode = "retract"


def test_in_place_without_the_flags_is_refused_and_forcing_it_shows_the_stale_prefix_cache(server, engine):
    """The control experiment: this server keeps SGLang's radix cache and overlap scheduler. An in_place
    update is refused by the engine, naming both flags. Forced anyway (the client before the fix), a prompt
    computed under v2 and asked again after the update to v3 reuses v2's KV: its log-probs are not v3's."""
    engine.config.pause_mode = "in_place"
    try:
        with pytest.raises(SGLangError, match="--disable-radix-cache --disable-overlap-schedule"):
            _update(engine, 3)
        assert engine.version == 2
        shared = [1] + list(range(200, 260))
        _submit(engine, "shared-v2", shared, 4, seed=7)
        collect(engine, 1)
        engine._in_place_checked = True  # force it: the client before the fix
        _update(engine, 3)
        _submit(engine, "shared-v3", shared + [5, 6], 4, seed=8)
        (c,) = collect(engine, 1)
        assert c.weight_versions == [3] * 4  # tagged with the new version ...
        stale = max_diff(c.gen_logprobs, full_logprobs(weights(3), shared + [5, 6], c.output_ids))
        assert stale > 0.05, stale  # ... but computed over the old weights' KV of the shared prefix
        print(f"stale prefix cache (radix cache on, in_place, no flush): log-probs off by up to {stale:.3f} nats")
        # with a request in flight, the overlap scheduler's boundary: which boundary do the log-probs follow?
        prompt = [950, 80, 81, 82, 83]  # shares no prefix with earlier prompts (their cached KV is stale)
        _submit(engine, "overlap", prompt, 120, seed=9)
        wait_decoding(server.url, min_tokens=len(prompt) + 10)
        _update(engine, 4)
        (d,) = collect(engine, 1)
        tagged = d.weight_versions.index(4)
        fits = [k for k in range(max(1, tagged - 3), min(120, tagged + 4))
                if max_diff(d.gen_logprobs, in_place_logprobs(weights(3), weights(4), prompt, d.output_ids, k)) < TOL]
        print(f"overlap scheduler on: first token tagged v4 = {tagged}, log-probs follow a boundary at {fits}")
    finally:
        engine.config.pause_mode = "retract"
