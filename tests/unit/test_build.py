"""Component factory pieces: ModelConfig -> HF config, micro-batch rows, SFT batches, per-sample
sampling parameters, task building. Expected values are worked out by hand below."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest

from scalerl_mega.model.hf_export import hf_config_from_model
from scalerl_mega.inflight import _Pending, _Router, sampling_params
from scalerl_mega.rollout.local import make_requests
from scalerl_mega.sft import sft_batch, warm_start
from scalerl_mega.model.config import ModelConfig, OptimConfig
from scalerl_mega.types import Completion, FinishReason, Prompt, SamplingParams

DEMO_MOE = dict(name="demo", arch="llama4", vocab_size=48, hidden_size=128, ffn_hidden_size=256, num_layers=4,
                num_attention_heads=4, num_query_groups=2, max_position_embeddings=128, rope_theta=10000.0,
                num_experts=4, moe_topk=1, moe_ffn_hidden_size=64, shared_expert_ffn=64,
                moe_router_score_function="sigmoid", moe_router_pre_softmax=False, moe_apply_probs_on_input=True)


def test_hf_config_llama4_moe_round_trip():
    from transformers import Llama4TextConfig

    from scalerl_mega.convert.model_config import model_config_from_hf

    m = ModelConfig(**DEMO_MOE).validate()
    arch, kw = hf_config_from_model(m)
    assert arch == "llama4"
    assert kw["no_rope_layers"] == [1, 1, 1, 1]  # HF: 1 = RoPE on every layer (no NoPE layers)
    assert kw["moe_layers"] == [0, 1, 2, 3]
    assert kw["intermediate_size"] == 64 and kw["intermediate_size_mlp"] == 256
    assert kw["use_qk_norm"] is False and kw["attention_chunk_size"] == 128
    back = model_config_from_hf(Llama4TextConfig(**kw).to_dict())
    for key in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_query_groups",
                "kv_channels", "num_experts", "moe_topk", "expert_ffn", "shared_expert_ffn", "rope_theta",
                "tie_embeddings", "qk_l2_norm", "no_rope_freq", "moe_layer_freq"):
        assert getattr(back, key) == getattr(m, key), key


def test_hf_config_llama_dense_and_nope_every_4th():
    from transformers import LlamaConfig

    from scalerl_mega.convert.model_config import model_config_from_hf

    dense = ModelConfig(name="d", vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_layers=2,
                        num_attention_heads=4, num_query_groups=2, rope_theta=10000.0).validate()
    arch, kw = hf_config_from_model(dense)
    assert arch == "llama" and kw["intermediate_size"] == 64
    back = model_config_from_hf(LlamaConfig(**kw).to_dict())
    assert (back.hidden_size, back.ffn_hidden_size, back.num_query_groups) == (32, 64, 2)

    nope = ModelConfig(**{**DEMO_MOE, "num_layers": 8, "no_rope_freq": 4})
    _, kw = hf_config_from_model(nope)
    assert kw["no_rope_layers"] == [1, 1, 1, 0, 1, 1, 1, 0]  # layers 3 and 7 (0-based) skip RoPE


def test_hf_config_refuses_what_hf_llama4_cannot_express():
    with pytest.raises(ValueError, match="shared_expert_ffn"):
        hf_config_from_model(ModelConfig(**{**DEMO_MOE, "shared_expert_ffn": 128}))
    with pytest.raises(ValueError, match="MoE needs arch: llama4"):
        hf_config_from_model(ModelConfig(**{**DEMO_MOE, "arch": "llama"}))


def test_sft_batch_layout():
    b = sft_batch([([1, 2], [3, 4]), ([5], [6])], pad_id=0)
    assert b.input_ids_BT.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    # target j at position P + j is predicted from position P + j - 1
    assert b.targets_BT.tolist() == [[0, 3, 4, 0], [6, 0, 0, 0]]
    assert b.loss_mask_BT.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert b.position_ids_BT.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="empty"):
        sft_batch([([], [1])])


class _RecordingTrainer:
    """Records what warm_start feeds it (the optimizer settings of each step and the example order), with
    `MegatronPolicyTrainer`'s contract: `reset_optimizer(optim)` sets the settings of the steps until the next reset,
    `None` the run's own (`cfg.optim`)."""

    def __init__(self):
        self.cfg = SimpleNamespace(optim=OptimConfig(lr=1e-4, warmup_steps=0))
        self.seen, self.lrs, self.resets, self.optim = [], [], [], self.cfg.optim

    def reset_optimizer(self, optim=None):
        self.resets.append(optim)
        self.optim = optim or self.cfg.optim

    def sft_step(self, batch):
        self.lrs.append((self.optim.lr, self.optim.warmup_steps))
        self.seen.append(batch.input_ids_BT[:, 0].tolist())
        return {"loss": 1.0}


def test_warm_start_epochs_and_optimizer_swap():
    tr = _RecordingTrainer()
    examples = [([i + 1], [7]) for i in range(6)]
    hist = warm_start(tr, examples, steps=5, batch_size=4, lr=1e-3, warmup_steps=2, seed=3)
    assert len(hist) == 5 and len(tr.resets) == 2 and tr.resets[1] is None  # then RL's own settings again
    assert tr.lrs == [(1e-3, 2)] * 5
    assert tr.cfg.optim == OptimConfig(lr=1e-4, warmup_steps=0)  # the run's config is never modified
    assert tr.resets[0] == OptimConfig(lr=1e-3, warmup_steps=2)  # every other setting is the run's
    flat = [x for batch in tr.seen for x in batch]
    # epochs are permutations from Random(seed): the first 6 and the next 6 examples each cover all
    assert sorted(flat[:6]) == [1, 2, 3, 4, 5, 6] and sorted(flat[6:12]) == [1, 2, 3, 4, 5, 6]
    rng = random.Random(3)
    first = list(range(6))
    rng.shuffle(first)
    assert flat[:6] == [i + 1 for i in first]


def test_sample_index_is_passed_to_the_engine_not_encoded_in_the_prompt_id():
    """The router submits sample i of a prompt as its own request with `first_index=i` and the prompt's
    own id (any characters, "#s9" included); the engine's requests carry that index, unique request ids
    and seed + j within one call; completions are routed back by prompt id and keep their index."""
    p = Prompt(prompt_id="synthetic-ab#s9", text="Q:1+2=", task="synthetic", gold="3", token_ids=[1, 2])
    reqs = make_requests(p, SamplingParams(max_new_tokens=4, seed=40), n=2, version=3, base_seed=0, first_index=5)
    assert [(r.prompt_id, r.sample_index, r.rid, r.seed) for r in reqs] == [
        ("synthetic-ab#s9", 5, "synthetic-ab#s9/5/v3", 40), ("synthetic-ab#s9", 6, "synthetic-ab#s9/6/v3", 41)]
    with pytest.raises(ValueError, match="first_index=-1"):
        make_requests(p, SamplingParams(max_new_tokens=4), n=1, version=0, base_seed=0, first_index=-1)

    class Recording:  # answers each request at once, with the index the engine was given
        def __init__(self):
            self.calls, self.out = [], []

        def submit(self, prompt, sampling, *, n, version, first_index=0):
            self.calls.append((prompt.prompt_id, sampling.seed, n, version, first_index))
            self.out += [Completion(prompt_id=prompt.prompt_id, sample_index=first_index + j, prompt_ids=[1, 2],
                                    output_ids=[7], gen_logprobs=[-0.5], weight_versions=[version],
                                    finish_reason=FinishReason.STOP, submitted_version=version) for j in range(n)]

        def poll(self, timeout_s=0.0):
            out, self.out = self.out[::-1], []  # out of order on purpose
            return out

    engine = Recording()
    router = _Router(engine, group_size=3, poll_timeout_s=0.0)
    router.submit(_Pending(seq=0, prompt=p, version=2), [SamplingParams(max_new_tokens=4, seed=10 + i) for i in range(3)])
    assert engine.calls == [("synthetic-ab#s9", 10 + i, 1, 2, i) for i in range(3)]
    assert router.pump() == 3 and router.in_flight == 0
    done = router.pop(1)[0].completions
    assert sorted(c.sample_index for c in done) == [0, 1, 2] and {c.prompt_id for c in done} == {"synthetic-ab#s9"}


def test_interruption_point_drawn_per_sample():
    cfg = SimpleNamespace(
        length=SimpleNamespace(name="interruption", max_new_tokens=100, interruption_min=10, interruption_max=60,
                               answer_budget=5),
        rollout=SimpleNamespace(temperature=1.0, top_p=1.0))
    comps = SimpleNamespace(stop_token_ids=[2], interruption_ids=[9, 8])
    params = sampling_params(cfg.length, cfg.rollout, comps, random.Random(7), seed=100, n=8)
    ref = random.Random(7)
    assert [p.interruption_at for p in params] == [ref.randint(10, 60) for _ in range(8)]
    assert len({p.interruption_at for p in params}) > 1  # not shared by the group
    assert [p.seed for p in params] == list(range(100, 108))
    assert all(p.interruption_ids == [9, 8] and p.answer_budget == 5 for p in params)
    cfg.length.name = "penalty"
    assert all(p.interruption_at is None for p in sampling_params(cfg.length, cfg.rollout, comps, random.Random(7), seed=0, n=3))


def test_build_task_checks_vocab_and_phrase():
    from scalerl_mega.build import build_task

    def cfg(**over):
        base = dict(data=SimpleNamespace(name="synthetic", val_prompts=10, synthetic_num_prompts=60, split_seed=0,
                                         synthetic_max_digits=2, synthetic_difficulty_weights=[], max_prompt_tokens=64),
                    model=SimpleNamespace(vocab_size=48), length=SimpleNamespace(interruption_phrase="</think>"))
        base.update(over)
        return SimpleNamespace(**base)

    task = build_task(cfg())
    assert len(task.val_prompts) == 10 and len(task.train_prompts) == 50
    assert not {p.prompt_id for p in task.val_prompts} & {p.prompt_id for p in task.train_prompts}
    assert task.interruption_ids == [task.tokenizer.convert_tokens_to_ids("</think>")]
    assert task.decode(task.encode("Q:1+2=")) == "Q:1+2="
    with pytest.raises(ValueError, match="model.vocab_size=16"):
        build_task(cfg(model=SimpleNamespace(vocab_size=16)))
    with pytest.raises(ValueError, match="interruption_phrase"):
        build_task(cfg(length=SimpleNamespace(interruption_phrase="</think> ~")))
    with pytest.raises(ValueError, match=r"data.name='polaris' needs a tokenizer \(data.tokenizer_path and "
                                         r"init_from_hf are empty\): a model of model.vocab_size=48 tokens cannot "
                                         r"read free text \(the embedded demo model's vocabulary is the synthetic"):
        build_task(cfg(data=SimpleNamespace(name="polaris", tokenizer_path="")))


def test_dataclass_replace_keeps_optim_fields():
    # warm_start swaps lr/warmup with dataclasses.replace: the betas of the RL optimizer stay
    o = OptimConfig(lr=1e-4, adam_beta2=0.99)
    assert dataclasses.replace(o, lr=1e-3).adam_beta2 == 0.99
