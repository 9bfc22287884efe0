"""Rejected weight updates: a wrong tensor name or shape is rejected before anything is
applied; the engine keeps serving its previous weights (same tokens, same log-probs, same version);
the error names the tensor. The trainer side checks the whole update against the generator model's
manifest before the first bucket is sent (SGLang applies buckets as they arrive, so a wrong tensor in
the last bucket must never reach it); where no manifest is known, SGLang generation is still resumed
after the server's own rejection. Every wait is bounded by the engines' own timeouts (30 s here), so a
hang fails the test instead of stalling it."""

from __future__ import annotations

import time

import pytest
import torch

from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
from scalerl_mega.weight_sync import (PlannedTensors, WeightManifest, WeightSyncConfig, WeightSyncError,
                                              spec_of)
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


def _same_outputs(a, b, tol: float = 1e-5) -> bool:
    """Same tokens and versions, log-probs within `tol` (the server batches its requests differently
    from call to call, which moves FP32 log-probs by ~1e-7; other weights move them by >1e-2)."""
    return all(ia == ib and va == vb and max(abs(x - y) for x, y in zip(la, lb)) < tol
               for (ia, la, va), (ib, lb, vb) in zip(a, b, strict=True))


def _bad_updates(model) -> dict[str, tuple[list, str]]:
    sd = list(model.state_dict().items())
    last_name, last = sd[-1]
    mid_name = sd[len(sd) // 2][0]
    wrong_shape = sd[:-1] + [(last_name, torch.zeros(last.shape[0] + 1, *last.shape[1:]))]
    wrong_name = [((n + ".bogus") if n == mid_name else n, t) for n, t in sd]
    return {"shape": (wrong_shape, repr(last_name)), "name": (wrong_name, repr(mid_name + ".bogus"))}


@pytest.mark.parametrize("flattened,check", [(False, "manifest"), (True, "manifest"), (False, "engine"),
                                              (True, "engine")],
                         ids=["per_tensor", "flattened", "per_tensor-engine_check", "flattened-engine_check"])
def test_local_engine_rejects_and_keeps_serving_previous_weights(flattened, check):
    """check="manifest": the trainer-side manifest check rejects before the first bucket; "engine": the
    manifest is made to accept the bad update, so it reaches the engine, whose own staged check rejects
    it after receiving every bucket (the second line)."""
    sync = WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000, flattened=flattened)
    engine = LocalRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="llama", config=CFG, init_seed=0),
                                                  core=CoreConfig(max_batch=4, max_seq_len=64), sync=sync))
    try:
        before = _generate(engine, 0)
        model1 = _model(1)
        for kind, (update, named) in _bad_updates(model1).items():
            if check == "engine":
                engine._manifest = WeightManifest([spec_of(n, t) for n, t in update], source="the bad update")
            with pytest.raises(WeightSyncError) as e:
                engine.update_weights(update, version=1)
            msg = str(e.value)
            assert named in msg and "rejected" in msg and "nothing was applied" in msg, (kind, msg)
            assert ("before the first bucket was sent" in msg) == (check == "manifest"), msg
            assert engine._proc.is_alive() and engine.version == 0
            assert engine.last_sync_stats is None or engine.last_sync_stats.version != 1
            # the earlier buckets were received and checked, none applied: same tokens, log-probs, version
            assert _generate(engine, 0) == before, kind
        # a good update still works afterwards (the sync group survived the rejection)
        engine._manifest = None  # the real one again
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


def _source(items, log: list):
    """A lazy tensor source (like the trainer's export) that records what it produced."""
    for name, t in items:
        log.append(name)
        yield name, t


def test_local_engine_planned_stream_checked_before_it_starts_and_aborted_when_it_strays():
    """A lazy source announces a plan: a plan that does not fit is rejected before the source produces
    its first tensor; a source that leaves its (fitting) plan in the LAST bucket is caught while
    streaming, and the engine discards the buckets it already received ("weights_abort")."""
    sync = WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000)
    engine = LocalRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="llama", config=CFG, init_seed=0),
                                                  core=CoreConfig(max_batch=4, max_seq_len=64), sync=sync))
    try:
        before = _generate(engine, 0)
        good = list(_model(1).state_dict().items())
        bad, named = _bad_updates(_model(1))["shape"]
        produced: list[str] = []
        with pytest.raises(WeightSyncError, match="before the first bucket was sent") as e:
            engine.update_weights(PlannedTensors(_source(bad, produced), plan=[spec_of(n, t) for n, t in bad]),
                                  version=1)
        assert named in str(e.value) and produced == [] and engine.version == 0
        # plan fits, the stream does not: its last tensor (alone in the last bucket) has another shape
        produced.clear()
        with pytest.raises(WeightSyncError, match="left its announced plan") as e:
            engine.update_weights(PlannedTensors(_source(bad, produced), plan=[spec_of(n, t) for n, t in good]),
                                  version=1)
        assert named in str(e.value) and produced == [n for n, _ in bad]  # earlier buckets were sent
        assert engine._proc.is_alive() and engine.version == 0
        assert _generate(engine, 0) == before  # ... and discarded: same tokens and log-probs
        engine.update_weights(PlannedTensors(iter(good), plan=[spec_of(n, t) for n, t in good]), version=1)
        assert engine.version == 1 and all(v == [1] * len(ids) for ids, _, v in _generate(engine, 1))
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


@pytest.mark.parametrize("flattened", [False, True], ids=["per_tensor", "flattened"])
def test_sglang_wrong_shape_in_last_bucket_is_rejected_before_anything_is_sent(tmp_path, flattened):
    """The server reports a local model_path: its manifest (meta-device HF model) is checked first, so
    a wrong shape in the LAST bucket is rejected with no request at all to the server -- generation is
    never paused, no bucket is applied, the served tokens and log-probs stay the same."""
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.sglang_emulation import SpawnedTestServer

    _model(0).save_pretrained(tmp_path)
    server = SpawnedTestServer(LocalModelSpec(arch="llama", path=str(tmp_path)), model_path=str(tmp_path),
                               core_config=CoreConfig(max_batch=8, max_seq_len=96), sync_timeout_s=30.0)
    engine = SGLangRolloutEngine([SGLangServer.attach(server.url)], config=SGLangEngineConfig(
        pause_mode="in_place", control_timeout_s=30.0, request_timeout_s=60.0,
        sync=WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000, flattened=flattened)))
    try:
        before = _generate(engine, 0)
        update, named = _bad_updates(_model(1))["shape"]
        server.clear_events()
        with pytest.raises(WeightSyncError, match="before the first bucket was sent") as e:
            engine.update_weights(update, version=1)
        assert named in str(e.value) and "nothing was applied" in str(e.value)
        st = server.state()
        assert st["events"] == ["/model_info"] and st["version"] == "0" and not st["paused"]  # only the manifest lookup
        assert engine.version == 0 and _same_outputs(_generate(engine, 0), before)
        engine.update_weights(_model(1).state_dict().items(), version=1)
        assert engine.version == 1 and engine.last_sync_stats.buckets > 1
        assert not _same_outputs(_generate(engine, 1), before)  # the check can tell the weights apart
        assert all(v == [1] * len(ids) for ids, _, v in _generate(engine, 1))
    finally:
        engine.close()
        server.stop()


def test_sglang_rejected_update_resumes_generation_and_names_the_tensor(tmp_path):
    """No manifest here (the server reports a model_path that is not a local directory): the server
    itself rejects the bad tensor; generation is resumed and the error names it."""
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.sglang_emulation import SpawnedTestServer

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
        assert events[:3] == ["/model_info", "/server_info", "/pause_generation"] and events[-2:] == ["/end_weight_update", "/continue_generation"], events
        assert engine.version == 0 and server.state()["version"] != 1
        assert len(_generate(engine, 0)) == 2  # generation was resumed: new requests complete
        # the group survived: a good update goes through afterwards
        engine.update_weights(_model(1).state_dict().items(), version=1)
        assert engine.version == 1 and len(_generate(engine, 1)) == 2
    finally:
        engine.close()
        server.stop()
