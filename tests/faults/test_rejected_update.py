"""Rejected weight updates (issue 16): a wrong tensor name or shape is rejected before anything is
applied; the engine keeps serving its previous weights (same tokens, same log-probs, same version);
the error names the tensor; SGLang generation is resumed afterwards. Every wait is bounded by the
engines' own timeouts (30 s here), so a hang fails the test instead of stalling it."""

from __future__ import annotations

import time

import pytest
import torch

from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
from scalerl_mega.rollout.weight_sync import WeightSyncConfig, WeightSyncError
from scalerl_mega.types import Prompt, SamplingParams

pytestmark = pytest.mark.timeout(600)  # bounded: a hang fails instead of stalling the suite

CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
P = Prompt(prompt_id="p", text="", task="synthetic", gold="0", token_ids=[3, 4, 5])
SP = SamplingParams(max_new_tokens=8, seed=1)


def _model(seed: int):
    return build_model(LocalModelSpec(arch="llama", config=CFG, init_seed=seed))


def _collect(engine, n: int, timeout_s: float = 120.0):
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += engine.poll(0.5)
    assert len(out) == n, f"got {len(out)}/{n} completions"
    return sorted(out, key=lambda c: c.sample_index)


def _generate(engine, version: int) -> list[tuple[list[int], list[float], list[int]]]:
    engine.submit(P, SP, n=2, version=version)
    return [(c.output_ids, c.gen_logprobs, c.weight_versions) for c in _collect(engine, 2)]


def _bad_updates(model) -> dict[str, tuple[list, str]]:
    sd = list(model.state_dict().items())
    last_name, last = sd[-1]
    mid_name = sd[len(sd) // 2][0]
    wrong_shape = sd[:-1] + [(last_name, torch.zeros(last.shape[0] + 1, *last.shape[1:]))]
    wrong_name = [((n + ".bogus") if n == mid_name else n, t) for n, t in sd]
    return {"shape": (wrong_shape, repr(last_name)), "name": (wrong_name, repr(mid_name + ".bogus"))}


@pytest.mark.parametrize("flattened", [False, True], ids=["per_tensor", "flattened"])
def test_local_engine_rejects_and_keeps_serving_previous_weights(flattened):
    sync = WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000, flattened=flattened)
    engine = LocalRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="llama", config=CFG, init_seed=0),
                                                  core=CoreConfig(max_batch=4, max_seq_len=64), sync=sync))
    try:
        before = _generate(engine, 0)
        model1 = _model(1)
        for kind, (update, named) in _bad_updates(model1).items():
            with pytest.raises(WeightSyncError) as e:
                engine.update_weights(update, version=1)
            msg = str(e.value)
            assert named in msg and "rejected" in msg and "nothing was applied" in msg, (kind, msg)
            assert engine._proc.is_alive() and engine.version == 0
            assert engine.last_sync_stats is None or engine.last_sync_stats.version != 1
            # the earlier buckets were received and checked, none applied: same tokens, log-probs, version
            assert _generate(engine, 0) == before, kind
        # a good update still works afterwards (the sync group survived the rejection)
        engine.update_weights(model1.state_dict().items(), version=1)
        assert engine.version == 1 and engine.last_sync_stats.buckets > 1
        after = _generate(engine, 1)
        assert all(v == [1] * len(ids) for ids, _, v in after)
        with torch.no_grad():  # and it is exactly model1 (staged tensors were copies, not reused views)
            ids, lp, _ = after[0]
            logp = torch.log_softmax(model1(torch.tensor([P.token_ids + ids])).logits[0].double(), -1)
            ref = [logp[len(P.token_ids) - 1 + j, t].item() for j, t in enumerate(ids)]
        assert max(abs(a - b) for a, b in zip(ref, lp)) < 1e-5
    finally:
        engine.close()


def test_core_load_weights_is_all_or_nothing():
    from scalerl_mega.rollout.core import GenerationCore

    core = GenerationCore(_model(0), config=CoreConfig(max_batch=2, max_seq_len=32))
    before = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    update, named = _bad_updates(_model(1))["shape"]
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        core.load_weights(update)
    assert all(torch.equal(before[n], p) for n, p in core.model.named_parameters())


def test_sglang_rejected_update_resumes_generation_and_names_the_tensor(tmp_path):
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.rollout.testing_server import SpawnedTestServer

    _model(0).save_pretrained(tmp_path)
    # in its own process, like a real server (one process cannot hold both ends of the sync group)
    server = SpawnedTestServer(LocalModelSpec(arch="llama", path=str(tmp_path)),
                               core_config=CoreConfig(max_batch=8, max_seq_len=96), sync_timeout_s=30.0)
    engine = SGLangRolloutEngine([SGLangServer.attach(server.url)], config=SGLangEngineConfig(
        pause_mode="in_place", sync=WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000),
        control_timeout_s=30.0, request_timeout_s=60.0))
    try:
        assert len(_generate(engine, 0)) == 2
        update, named = _bad_updates(_model(1))["shape"]
        server.clear_events()
        with pytest.raises(WeightSyncError, match=named.replace(".", r"\.")):
            engine.update_weights(update, version=1)
        events = server.state()["events"]
        assert events[0] == "/pause_generation" and events[-2:] == ["/end_weight_update", "/continue_generation"], events
        assert engine.version == 0 and server.state()["version"] != 1
        assert len(_generate(engine, 0)) == 2  # generation was resumed: new requests complete
        # the group survived: a good update goes through afterwards
        engine.update_weights(_model(1).state_dict().items(), version=1)
        assert engine.version == 1 and len(_generate(engine, 1)) == 2
    finally:
        engine.close()
        server.stop()
