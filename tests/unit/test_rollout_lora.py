"""LoRA adapters on the local engine (rollout/lora.py, `GenerationCore.load_adapter`, the in-process and the spawned
engine's `update_adapter`): log-probs against HF + peft's own `PeftModel` (the adapter files PEFT itself writes),
per-request version binding, all-or-nothing loads, and the bytes a sync carries."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl_mega.interfaces import AdapterEngine
from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, build_model
from scalerl_mega.types import Prompt, SamplingParams
from scalerl_mega.weight_sync import WeightSyncError
from tests.unit.test_rollout_inprocess import _collect as _drain

peft = pytest.importorskip("peft")

CFG = dict(vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [3, 4, 5]
P = Prompt(prompt_id="p", text="", task="synthetic", gold="0", token_ids=PROMPT)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec() -> LocalModelSpec:
    return LocalModelSpec(arch="llama", config=CFG, init_seed=0)


def peft_adapter(tmp_path, *, seed: int, r: int = 4, alpha: int = 8, targets=TARGETS):
    """An adapter as PEFT 0.21 writes it (`save_pretrained`: adapter_config.json + adapter_model.safetensors) for
    the engine's base model, B random so that it changes the outputs; returns (config dict, tensors, PeftModel)."""
    from safetensors.torch import load_file

    base = build_model(_spec())
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                      init_lora_weights=False, lora_dropout=0.0))
    with torch.no_grad():  # PEFT's random B is as large as A: scale it to a small but visible change
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.3)
    out = tmp_path / f"adapter{seed}"
    model.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    return config, sorted(load_file(out / "adapter_model.safetensors").items()), model.eval()


def oracle(model, output):
    """float64 log-softmax of each output token from one full-sequence forward of `model` (HF or PeftModel)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([PROMPT + output])).logits[0].double(), -1)
    return [logp[len(PROMPT) - 1 + j, t].item() for j, t in enumerate(output)]


def _max_err(model, c) -> float:
    return max(abs(a - b) for a, b in zip(oracle(model, c.output_ids), c.gen_logprobs))


def _req(rid: str, seed: int) -> GenRequest:
    return GenRequest(rid=rid, prompt_id=rid, sample_index=0, prompt_ids=PROMPT, seed=seed,
                      sampling=SamplingParams(max_new_tokens=8))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters (seeds 1 and 2) of the same base model, as PEFT writes them."""
    d = tmp_path_factory.mktemp("lora")
    return {1: peft_adapter(d, seed=1), 2: peft_adapter(d, seed=2)}


def test_peft_writes_the_names_the_engine_reads(adapters):
    config, tensors, _ = adapters[1]
    assert config["peft_type"] == "LORA" and config["r"] == 4 and sorted(config["target_modules"]) == sorted(TARGETS)
    assert len(tensors) == 2 * 7 * 2 and tensors[0][0].startswith("base_model.model.model.layers.0.")


def test_in_process_engine_log_probs_equal_hf_peft_and_failed_loads_keep_the_version(adapters):
    (config, tensors, peft1), (config2, tensors2, _) = adapters[1], adapters[2]
    engine = InProcessRolloutEngine(LocalEngineConfig(model=_spec(), core=CoreConfig(max_batch=4, max_seq_len=64)))
    assert isinstance(engine, AdapterEngine)
    base = build_model(_spec())
    engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=2, version=0)
    for c in _drain(engine, 2):
        assert _max_err(base, c) < 1e-5 and c.weight_versions == [0] * 8
    engine.update_adapter(config, iter(tensors), version=1)
    engine.submit(P, SamplingParams(max_new_tokens=8, seed=1), n=2, version=1)
    for c in _drain(engine, 2):
        assert _max_err(peft1, c) < 1e-5 and c.weight_versions == [1] * 8
        assert _max_err(base, c) > 1e-3  # the adapter changes what the base model would give
    good = dict(tensors2)
    q_a = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
    bad = [({**good, q_a: torch.zeros(4, 31)}, config2, rf"policy-v2.*{q_a}.*shape \(4, 31\)"),
           ({k: v for k, v in good.items() if k != q_a}, config2, rf"policy-v2.*missing tensor '{q_a}'"),
           ({**good, "base_model.model.model.layers.0.mlp.nope.lora_A.weight": torch.zeros(4, 32)}, config2,
            r"policy-v2.*mlp\.nope.*no such linear module"),
           (good, {**config2, "use_rslora": True}, r"policy-v2.*use_rslora")]
    for tensors_bad, cfg_bad, match in bad:
        with pytest.raises(WeightSyncError, match=match):
            engine.update_adapter(cfg_bad, iter(sorted(tensors_bad.items())), version=2)
        assert engine.version == 1 and engine.core.adapter == "policy-v1"
    engine.submit(P, SamplingParams(max_new_tokens=8, seed=3), n=1, version=1)
    (c,) = _drain(engine, 1)
    assert _max_err(peft1, c) < 1e-5 and c.weight_versions == [1] * 8
    engine.close()


def test_a_request_keeps_its_adapter_version_in_a_mixed_batch_and_old_versions_are_dropped_when_unused(adapters):
    (config, tensors, peft1), (config2, tensors2, peft2) = adapters[1], adapters[2]
    core = GenerationCore(build_model(_spec()), config=CoreConfig(max_batch=4, max_seq_len=64, admit_min_free=1))
    core.load_adapter(config, iter(tensors), version=1)
    core.add(_req("a", 11))
    core.step()  # "a" admitted with policy-v1 (one token sampled)
    assert core.num_running == 1
    core.load_adapter(config2, iter(tensors2), version=2)
    assert sorted(core.lora.adapters) == ["policy-v1", "policy-v2"]  # "a" still holds v1
    core.add(_req("b", 12))
    core.add(_req("c", 13))
    done = {}
    while core.can_progress():
        done.update({c.prompt_id: c for c in core.step()})
        if "a" in done:
            assert sorted(core.lora.adapters) == ["policy-v2"]  # v1 dropped once its last request finished
    assert done["a"].weight_versions == [1] * 8 and _max_err(peft1, done["a"]) < 1e-5
    for rid in ("b", "c"):  # decoded in the same batches as "a", each row with its own adapter
        assert done[rid].weight_versions == [2] * 8 and _max_err(peft2, done[rid]) < 1e-5


def test_spawned_engine_receives_the_adapter_over_the_sync_group_and_counts_its_bytes(adapters):
    from scalerl_mega.rollout.local import LocalRolloutEngine
    from scalerl_mega.weight_sync import WeightSyncConfig

    (config, tensors, peft1), (config2, tensors2, _) = adapters[1], adapters[2]
    engine = LocalRolloutEngine(LocalEngineConfig(model=_spec(), core=CoreConfig(max_batch=4, max_seq_len=64),
                                                  sync=WeightSyncConfig(bucket_bytes=4096, timeout_s=60.0)))
    try:
        engine.update_adapter(config, iter(tensors), version=1)
        # r (in + out) per adapted linear, hand-counted from the model's shapes: q/o [32, 32], k/v [16, 32],
        # gate/up [64, 32], down [32, 64]; two layers, FP32
        per_layer = 4 * ((32 + 32) * 2 + (32 + 16) * 2 + (32 + 64) * 3)
        assert engine.last_sync_stats.bytes == 2 * per_layer * 4 == 16384
        assert engine.last_sync_stats.buckets >= 4  # several buckets of at most 4 KiB
        model_bytes = sum(p.numel() * 4 for p in build_model(_spec()).parameters())
        assert engine.last_sync_stats.bytes < 0.2 * model_bytes
        missing = [(n, t) for n, t in tensors2 if "layers.0.mlp.down_proj.lora_B" not in n]
        with pytest.raises(WeightSyncError, match=r"policy-v2.*missing tensor .*layers\.0\.mlp\.down_proj\.lora_B"):
            engine.update_adapter(config2, iter(missing), version=2)
        engine.submit(P, SamplingParams(max_new_tokens=8, seed=5), n=2, version=1)
        done = []
        while len(done) < 2:
            done += engine.poll(1.0)
        for c in done:  # the previous version still serves
            assert c.weight_versions == [1] * 8 and _max_err(peft1, c) < 1e-5
    finally:
        engine.close()


class _AdapterTrainer:
    """The trainer side of a LoRA push as the loop sees it: base weights (HF names) and a PEFT adapter."""

    def __init__(self, base_state: dict, adapter) -> None:
        self.base_state, self.adapter, self.dtypes = base_state, adapter, []

    def export_hf_weights(self, *, dtype=None):
        return iter(self.base_state.items())

    def export_adapter(self, *, dtype=None):
        self.dtypes.append(dtype)
        return self.adapter[0], list(self.adapter[1])


def test_the_loop_push_sends_the_base_once_then_the_adapter_alone_and_reports_its_bytes(adapters):
    from scalerl_mega.interfaces import LoopComponents
    from scalerl_mega.loop import push_weights
    from scalerl_mega.weight_sync import weights_sha256

    base = {n: t + 0.01 for n, t in build_model(_spec()).state_dict().items()}  # the trainer's base differs from
    engine = InProcessRolloutEngine(LocalEngineConfig(model=_spec(), core=CoreConfig(max_batch=4, max_seq_len=64)))
    trainer = _AdapterTrainer(base, adapters[1])  # the engine's own initialisation until the first push
    comps = LoopComponents(engine=engine, trainer=trainer, reward_fn=None, sampler=None, val_prompts=[], decode=None,
                           encode=None, stop_token_ids=[], adapter_sync=True, weight_dtype="float32+fp32_head")
    push_weights(comps, version=0, full=True)
    assert engine.weights_digest() == {"weights_sha256": weights_sha256(base.items()), "version": 0}
    metrics = push_weights(comps, version=1)
    # the adapter's bytes counted from its shapes (r = 4; q/o [32, 32], k/v [16, 32], gate/up [64, 32],
    # down [32, 64]; two layers; FP32), against the whole model's
    adapter_bytes = 2 * 4 * ((32 + 32) * 2 + (32 + 16) * 2 + (32 + 64) * 3) * 4
    model_bytes = sum(t.numel() * 4 for t in base.values())
    assert metrics["sync/bytes"] == adapter_bytes == 16384 and "sync/seconds" in metrics
    assert metrics["sync/bytes"] / model_bytes < 0.2
    assert trainer.dtypes == ["float32", "float32"]  # the generator dtype without the FP32-head suffix
    assert engine.weights_digest()["weights_sha256"] == weights_sha256(base.items())  # the base is not sent again
    assert engine.core.adapter == "policy-v1" and engine.version == 1


def test_an_engine_set_loads_the_adapter_on_every_engine(adapters):
    from scalerl_mega.build import EngineSet

    config, tensors, peft1 = adapters[1]
    engines = [InProcessRolloutEngine(LocalEngineConfig(model=_spec(), core=CoreConfig(max_batch=4, max_seq_len=64)))
               for _ in range(2)]
    both = EngineSet(engines)
    assert isinstance(both, AdapterEngine)
    both.update_adapter(config, iter(tensors), version=3)
    assert both.last_sync_stats.bytes == 2 * 16384 and both.last_sync_stats.tensors == 2 * len(tensors)
    for e in engines:
        e.submit(P, SamplingParams(max_new_tokens=8, seed=2), n=1, version=3)
        (c,) = _drain(e, 1)
        assert c.weight_versions == [3] * 8 and _max_err(peft1, c) < 1e-5


LLAMA4 = dict(vocab_size=61, hidden_size=32, intermediate_size=16, intermediate_size_mlp=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=1,
              interleave_moe_layer_step=1, no_rope_layers=[1, 0], attention_chunk_size=64,
              max_position_embeddings=256, tie_word_embeddings=False)


def _llama4_adapter(seed: int, r: int = 4):
    """A rank-r adapter on every attention projection, every routed expert's gate/up/down (the per-expert names the
    trainer exports) and the shared expert of the tiny Llama-4, A and B random; (config, tensors, scale)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {}
    for layer in range(2):
        pre = f"model.layers.{layer}."
        shapes.update({pre + "self_attn.q_proj": (32, 32), pre + "self_attn.k_proj": (16, 32),
                       pre + "self_attn.v_proj": (16, 32), pre + "self_attn.o_proj": (32, 32)})
        for m in ["feed_forward.shared_expert"] + [f"feed_forward.experts.{e}" for e in range(4)]:
            shapes.update({f"{pre}{m}.gate_proj": (16, 32), f"{pre}{m}.up_proj": (16, 32), f"{pre}{m}.down_proj": (32, 16)})
    tensors = []
    for mod, (out_f, in_f) in shapes.items():
        tensors += [(f"base_model.model.{mod}.lora_A.weight", 0.3 * torch.randn(r, in_f, generator=gen)),
                    (f"base_model.model.{mod}.lora_B.weight", 0.3 * torch.randn(out_f, r, generator=gen))]
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    return config, tensors, 2.0


def _merged_llama4(tensors, scale):
    """The tiny Llama-4 with the adapter merged into its weights (W + s B A; a routed expert's into its slice of the
    fused gate_up_proj [E, H, 2I] / down_proj [E, I, H], stored input-major): HF's own dense MoE forward is the oracle."""
    model = build_model(LocalModelSpec(arch="llama4", config=LLAMA4, init_seed=0))
    ab = dict(tensors)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in [n[len("base_model.model."):-len(".lora_A.weight")] for n in ab if n.endswith("lora_A.weight")]:
            delta = scale * ab[f"base_model.model.{name}.lora_B.weight"] @ ab[f"base_model.model.{name}.lora_A.weight"]
            if ".experts." in name:
                layer, e, proj = name.split(".experts.")[0], int(name.split(".")[-2]), name.split(".")[-1]
                if proj == "down_proj":
                    params[f"{layer}.experts.down_proj"][e] += delta.T
                else:
                    cols = slice(0, 16) if proj == "gate_proj" else slice(16, 32)
                    params[f"{layer}.experts.gate_up_proj"][e][:, cols] += delta.T
            else:
                params[name + ".weight"] += delta
    return model.eval()


def test_routed_expert_adapters_on_the_sparse_llama4_engine_equal_the_merged_model():
    cfg1, t1, s1 = _llama4_adapter(1)
    cfg2, t2, s2 = _llama4_adapter(2)
    core = GenerationCore(build_model(LocalModelSpec(arch="llama4", config=LLAMA4, init_seed=0)),
                          config=CoreConfig(max_batch=4, max_seq_len=64, admit_min_free=1))
    core.load_adapter(cfg1, iter(t1), version=1)
    core.add(_req("a", 21))
    core.step()
    core.load_adapter(cfg2, iter(t2), version=2)
    core.add(_req("b", 22))
    done = {}
    while core.can_progress():
        done.update({c.prompt_id: c for c in core.step()})
    assert done["a"].weight_versions == [1] * 8 and done["b"].weight_versions == [2] * 8
    assert _max_err(_merged_llama4(t1, s1), done["a"]) < 1e-5
    assert _max_err(_merged_llama4(t2, s2), done["b"]) < 1e-5
    assert _max_err(build_model(LocalModelSpec(arch="llama4", config=LLAMA4, init_seed=0)), done["b"]) > 1e-3


def test_a_shared_expert_adapter_needs_no_routed_expert_tensors_but_a_routed_one_needs_them_all():
    config, tensors, _ = _llama4_adapter(3)
    core = GenerationCore(build_model(LocalModelSpec(arch="llama4", config=LLAMA4, init_seed=0)),
                          config=CoreConfig(max_batch=2, max_seq_len=32))
    shared_only = [(n, t) for n, t in tensors if ".experts." not in n]  # gate_proj etc. name the shared expert too
    core.load_adapter(config, iter(shared_only), version=1)
    assert not any(".experts." in m for m in core.lora.adapters["policy-v1"].modules)
    one_missing = [(n, t) for n, t in tensors if "layers.1.feed_forward.experts.2.up_proj.lora_B" not in n]
    with pytest.raises(ValueError, match=r"policy-v2.*missing tensor .*layers\.1\.feed_forward\.experts\.2\.up_proj"):
        core.load_adapter(config, iter(one_missing), version=2)
    assert core.adapter == "policy-v1"
