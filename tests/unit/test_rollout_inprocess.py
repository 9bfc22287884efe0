"""The in-process local engine (rollout/inprocess.py, `rollout.in_process=true`): generation, weight pushes by
copy (checked, all-or-nothing), pause modes, counters and digest, against the HF model as oracle and
against the process engine's request ids and seeds."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.interfaces import RolloutEngine
from scalerl_mega.rollout.core import CoreConfig, GenerationCore
from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, build_model, make_requests
from scalerl_mega.types import FinishReason, Prompt, SamplingParams
from scalerl_mega.weight_sync import WeightSyncError, weights_sha256

CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
P = Prompt(prompt_id="p", text="", task="synthetic", gold="0", token_ids=[3, 4, 5])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec(seed: int) -> LocalModelSpec:
    return LocalModelSpec(arch="llama", config=CFG, init_seed=seed)


def _engine(**core) -> InProcessRolloutEngine:
    return InProcessRolloutEngine(LocalEngineConfig(model=_spec(0), core=CoreConfig(max_batch=4, max_seq_len=64,
                                                                                    **core)))


def _oracle(model, prompt, output):
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].double(), -1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def _collect(engine, n):
    out = []
    for _ in range(1000):
        out += engine.poll(0.0)
        if len(out) >= n:
            return out
    raise AssertionError(f"{len(out)} of {n} completions")


def test_generates_and_takes_weight_pushes_by_copy():
    engine = _engine()
    assert isinstance(engine, RolloutEngine)
    model0, model1 = build_model(_spec(0)), build_model(_spec(1))
    engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=3, version=0)
    done = _collect(engine, 3)
    assert sorted(c.sample_index for c in done) == [0, 1, 2]
    # the process engine's requests (ids, per-sample seeds) on a bare GenerationCore: the same samples
    core = GenerationCore(build_model(_spec(0)), config=CoreConfig(max_batch=4, max_seq_len=64))
    for req in make_requests(P, SamplingParams(max_new_tokens=8, seed=1), n=3, version=0, base_seed=0):
        core.add(req)
    want = {c.sample_index: c.output_ids for c in core.run_until_done()}
    assert {c.sample_index: c.output_ids for c in done} == want
    for c in done:
        assert c.weight_versions == [0] * 8
        assert max(abs(a - b) for a, b in zip(_oracle(model0, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
    before = engine.decode_stats()
    assert before["decode_tokens"] > 0 and before["prefill_steps"] >= 1
    engine.update_weights(model1.state_dict().items(), version=1)
    stats = engine.last_sync_stats
    assert stats.tensors == len(model1.state_dict()) and stats.bytes == sum(
        t.numel() * t.element_size() for t in model1.state_dict().values())
    digest = engine.weights_digest()
    assert digest == {"weights_sha256": weights_sha256(model1.named_parameters()), "version": 1}
    engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=2, version=1)
    for c in _collect(engine, 2):
        assert c.weight_versions == [1] * 8
        assert max(abs(a - b) for a, b in zip(_oracle(model1, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5
    engine.close()


def test_a_bad_push_changes_nothing_and_names_the_tensor():
    engine = _engine()
    digest = engine.weights_digest()
    good = dict(build_model(_spec(1)).state_dict())
    bad = {**good, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(WeightSyncError, match=r"up_proj"):
        engine.update_weights(bad.items(), version=1)
    unknown = {**good, "model.no_such.weight": torch.zeros(2)}
    with pytest.raises(WeightSyncError, match=r"no_such"):
        engine.update_weights(unknown.items(), version=1)
    assert engine.weights_digest() == digest and engine.version == 0


def test_pause_modes_and_holding_still():
    engine = _engine()
    engine.submit(P, SamplingParams(max_new_tokens=40, seed=2), n=2, version=0)
    engine.poll(0.0)  # one finished request at most; both are running now
    engine.pause("in_place")
    steps = engine.decode_stats()["decode_steps"]
    assert engine.poll(0.0) == [] and engine.decode_stats()["decode_steps"] == steps  # paused: no decoding
    engine.resume()
    engine.pause("abort")
    aborted = engine.poll(0.0)
    assert len(aborted) == 2 and all(c.finish_reason == FinishReason.ABORT for c in aborted)
    engine.resume()
    engine.submit(P, SamplingParams(max_new_tokens=6, seed=3), n=2, version=0)
    engine.poll(0.0)
    engine.pause("retract")
    engine.resume()
    assert len(_collect(engine, 2)) == 2
    with pytest.raises(ValueError, match="pause mode='later'"):
        engine.pause("later")
