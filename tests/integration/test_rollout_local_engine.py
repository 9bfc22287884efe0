"""The local engine in its own process: transport, gloo weight sync (bucketed, flattened), pause
modes, and a receiver that dies mid-sync making the sender fail loudly within the timeout."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from scalerl_mega.interfaces import RolloutEngine
from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.local import EngineError, LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
from scalerl_mega.weight_sync import WeightSyncConfig, WeightSyncError
from scalerl_mega.types import FinishReason, Prompt, SamplingParams

CFG = dict(
    vocab_size=53,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def _spec(seed):
    return LocalModelSpec(arch="llama", config=CFG, init_seed=seed)


def _oracle(model, prompt, output):
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].double(), -1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def _collect(engine, n, timeout_s=120.0):
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += engine.poll(0.5)
    assert len(out) == n
    return out


P = Prompt(prompt_id="p", text="", task="synthetic", gold="0", token_ids=[3, 4, 5])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_engine_process_runs_at_the_configured_niceness():
    """LocalEngineConfig.nice (rollout.engine_nice) is added to the engine process's niceness, not to the
    trainer's; the engine still generates."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=4, max_seq_len=64), nice=3))
    try:
        assert os.getpriority(os.PRIO_PROCESS, engine.pid) == min(19, own + 3)
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
        engine.submit(P, SamplingParams(max_new_tokens=4, seed=1), n=2, version=0)
        assert len(_collect(engine, 2)) == 2
    finally:
        engine.close()


def test_engine_process_generates_and_syncs_weights():
    sync = WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=20_000)
    engine = LocalRolloutEngine(
        LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=4, max_seq_len=64), sync=sync)
    )
    try:
        assert isinstance(engine, RolloutEngine)
        model0, model1 = build_model(_spec(0)), build_model(_spec(1))
        engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=6, version=0)
        done = _collect(engine, 6)
        assert sorted(c.sample_index for c in done) == list(range(6))
        for c in done:
            assert c.weight_versions == [0] * 8
            assert max(abs(a - b) for a, b in zip(_oracle(model0, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
        engine.update_weights(model1.state_dict().items(), version=1)
        assert engine.last_sync_stats.buckets > 1 and engine.last_sync_stats.tensors == len(model1.state_dict())
        engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=2, version=1)
        for c in _collect(engine, 2):
            assert c.weight_versions == [1] * 8 and c.submitted_version == 1
            assert max(abs(a - b) for a, b in zip(_oracle(model1, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
        # flattened-bucket format, back to model0
        engine.config.sync.flattened = True
        engine.update_weights(model0.state_dict().items(), version=2)
        engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=1, version=2)
        (c,) = _collect(engine, 1)
        assert c.weight_versions == [2] * 8
        assert max(abs(a - b) for a, b in zip(_oracle(model0, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
        # pause(abort) returns running requests with partial output
        engine.submit(P, SamplingParams(max_new_tokens=50, seed=1), n=2, version=2)
        time.sleep(0.05)
        engine.pause("abort")
        aborted = _collect(engine, 2)
        assert all(c.finish_reason in (FinishReason.ABORT, FinishReason.LENGTH) for c in aborted)
        engine.resume()
    finally:
        engine.close()


class _KillAfterAnnounce:
    """Wraps the engine's announcer: SIGKILLs the engine right after announcing bucket `at`."""

    def __init__(self, inner, pid, at):
        self.inner, self.pid, self.at = inner, pid, at

    def begin(self, version):
        self.inner.begin(version)

    def announce(self, meta):
        waiter = self.inner.announce(meta)
        if meta.index == self.at:
            time.sleep(0.2)
            os.kill(self.pid, signal.SIGKILL)
        return waiter

    def end(self, version):
        self.inner.end(version)


def test_receiver_dying_mid_sync_fails_the_sender_within_timeout():
    timeout = 15.0
    sync = WeightSyncConfig(backend="gloo", timeout_s=timeout, bucket_bytes=8_000)
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=2, max_seq_len=32), sync=sync))
    try:
        model1 = build_model(_spec(1))
        engine.update_weights(model1.state_dict().items(), version=1)  # forms the group
        engine._sender.announcer = _KillAfterAnnounce(engine._sender.announcer, engine.pid, at=2)
        t0 = time.monotonic()
        with pytest.raises((WeightSyncError, EngineError)) as err:
            engine.update_weights(model1.state_dict().items(), version=2)
        elapsed = time.monotonic() - t0
        assert elapsed < timeout + 10, elapsed
        msg = str(err.value)
        assert "bucket 2" in msg or "died" in msg or "dead" in msg, msg
    finally:
        engine.close()


def test_poll_fails_naming_the_dead_engine_instead_of_waiting():
    """Every wait on the engine (training generation and validation alike go through `poll`) checks
    that the process lives: requests in flight to a killed engine raise instead of hanging."""
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=2, max_seq_len=64)))
    try:
        engine.submit(P, SamplingParams(max_new_tokens=40, seed=1, hold_at=1), n=2, version=0)
        os.kill(engine.pid, signal.SIGKILL)
        engine._proc.join(timeout=600)
        with pytest.raises(EngineError, match=r"is dead \(exit code -9\)"):
            for _ in range(200):  # bounded: each poll waits at most 0.1 s
                engine.poll(0.1)
    finally:
        engine.close()
