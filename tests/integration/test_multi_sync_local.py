"""Multi-sender weight sync into the local engine process: two senders (this process and a
spawned one), each over its own group, both at once. The engine applies the update and its version only
when both groups delivered every bucket; the manifest is checked before the first byte; a sender that
is killed before its bucket 1 (forced by a hook, no race) makes the sync raise within the deadline naming
the sender, bucket and tensor, and the engine keeps its weights and version. In-flight (requests running
across the update) and paused (PPO-k) modes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from scalerl_mega.weight_sync.multi import bucket_metas, open_sender_group, send_buckets
from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.local import LocalEngineConfig, LocalRolloutEngine, build_model
from scalerl_mega.weight_sync.plan import plan_buckets
from scalerl_mega.types import SamplingParams
from scalerl_mega.weight_sync import TensorSpec, WeightSyncConfig, WeightSyncError, free_port, spec_of, weights_sha256
from tests.integration.test_rollout_local_engine import P, _collect, _oracle, _spec  # the same tiny Llama engine

BUCKET = 6_000
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _remote_sender(url, name, named, buckets, version, timeout, kill_at, world_size=2):
    def hook(index):
        if index == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    group = open_sender_group(name, url, world_size=world_size, backend="gloo", timeout_s=timeout)
    send_buckets(group, iter(named), buckets=buckets, group_name=name, version=version, timeout_s=timeout,
                 before_bucket=hook)


def _sync(engine, model, *, version, tag, kill_at=None, shift=0.0, named=None):
    """Push `model`'s weights (+ shift; or the tensors `named`) over two groups: the first half of the tensors
    from this process, the second half from a spawned process (killed before its bucket `kill_at`). Any
    `weight_sync.multi.MultiSyncEngine` (tests/sglang/test_real_multi_sender_sync.py: one or two SGLang servers)."""
    if named is None:
        named = [(n, (t + shift).contiguous()) for n, t in model.state_dict().items()]
    half = len(named) // 2
    parts = {f"{tag}v{version}-a": named[:half], f"{tag}v{version}-b": named[half:]}  # group names are per process
    buckets = {g: plan_buckets([spec_of(n, t) for n, t in part], bucket_bytes=BUCKET) for g, part in parts.items()}
    metas = {g: bucket_metas(b, version=version, flattened=False) for g, b in buckets.items()}
    engine.check_plan(metas, version=version)
    urls = {g: f"tcp://127.0.0.1:{free_port()}" for g in parts}
    (ga, a), (gb, b) = parts.items()
    timeout, world = engine.config.sync.timeout_s, engine.group_world_size  # the sender and every receiving rank
    proc = mp.get_context("spawn").Process(target=_remote_sender, daemon=True,
                                           args=(urls[gb], gb, b, buckets[gb], version, timeout, kill_at, world))
    proc.start()
    try:
        engine.join_groups(urls)
        group = open_sender_group(ga, urls[ga], world_size=world, backend="gloo", timeout_s=timeout)
        engine.wait_groups()
        engine.announce_groups(metas, version=version)
        send_buckets(group, iter(a), buckets=buckets[ga], group_name=ga, version=version, timeout_s=timeout)
        engine.finish_groups(metas, version=version)
    finally:
        proc.join(timeout=timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return named, buckets


def test_two_senders_in_flight_and_paused_bit_exact():
    sync = WeightSyncConfig(backend="gloo", timeout_s=60)
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=4, max_seq_len=96), sync=sync))
    try:
        model1 = build_model(_spec(1))
        engine.submit(P, SamplingParams(max_new_tokens=60, seed=1), n=2, version=0)  # in flight across the update
        named, buckets = _sync(engine, model1, version=1, tag="ok")
        assert all(len(b) > 1 for b in buckets.values())  # several buckets per sender
        d = engine.weights_digest()
        assert d["version"] == 1 and d["weights_sha256"] == weights_sha256(model1.named_parameters())
        for c in _collect(engine, 2):
            assert c.weight_versions == sorted(c.weight_versions) and set(c.weight_versions) <= {0, 1}
        engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=1, version=1)
        (c,) = _collect(engine, 1)
        assert c.weight_versions == [1] * 8
        assert max(abs(a - b) for a, b in zip(_oracle(model1, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
        # paused (PPO-k): pause, sync, resume
        engine.pause("in_place")
        named2, _ = _sync(engine, model1, version=2, tag="ok", shift=0.5)
        engine.resume()
        d = engine.weights_digest()
        assert d["version"] == 2 and d["weights_sha256"] == weights_sha256(named2)
    finally:
        engine.close()


def test_manifest_rejects_before_the_first_byte_and_a_killed_sender_raises_within_the_deadline():
    timeout = 20.0
    sync = WeightSyncConfig(backend="gloo", timeout_s=timeout)
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=2, max_seq_len=32), sync=sync))
    try:
        before = engine.weights_digest()
        model1 = build_model(_spec(1))
        bad = {"g": bucket_metas([[TensorSpec("model.embed_tokens.weight", (52, 32), "float32")]], version=1,
                                 flattened=False)}
        with pytest.raises(WeightSyncError, match=r"rejected before the first bucket.*embed_tokens.*\[52, 32\]"):
            engine.check_plan(bad, version=1)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            _sync(engine, model1, version=1, tag="kill", kill_at=1)
        elapsed = time.monotonic() - t0
        named = [(n, t) for n, t in model1.state_dict().items()]
        half = len(named) // 2
        first_b1 = plan_buckets([spec_of(n, t) for n, t in named[half:]], bucket_bytes=BUCKET)[1][0].name
        msg = str(err.value)
        assert "sender 'killv1-b' bucket 1" in msg and repr(first_b1) in msg and "keeps serving v0" in msg, msg
        assert elapsed < 3 * timeout, elapsed  # the bucket's deadline, plus start-up; no hang
        after = engine.weights_digest()  # nothing applied: old weights, old version
        assert after == before
    finally:
        engine.close()
