"""LoRA adapters on a real SGLang 0.5.23 server on CPU through the project's engine (`update_adapter`,
rollout/sglang/adapters.py): log-probs against HF + peft's own `PeftModel`, the version switch (a sample keeps
the adapter it started with; the replaced one is unloaded once unused), refused loads that keep the previous
version, and the directory route. One server for the module (torch_native LoRA backend; the pinned-memory
stand-in of tests/sglang_support/lora_server_path on its PYTHONPATH); the tests run in file order."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
import torch

from scalerl_mega.rollout.sglang.launch import LoraServing
from scalerl_mega.types import Prompt, SamplingParams
from scalerl_mega.weight_sync import WeightSyncError
from tests.sglang_support.oracle import collect, full_logprobs, max_diff

peft = pytest.importorskip("peft")
pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("one_torch_thread")]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOL = 1e-5  # measured here: 1.1e-6 between SGLang's FP32 CPU LoRA and HF + peft
PROMPT = [5, 17, 99, 300, 41]


@pytest.fixture(scope="module")
def server(llama_dir):
    from tests.sglang_support.real_server import launch

    s = launch(llama_dir, pause_mode="in_place", lora=LoraServing(max_rank=8, target_modules=TARGETS,
                                                                   backend="torch_native"))
    yield s
    s.stop()


class HoldResponse:
    """A body hook that, once armed with a request id, stops the engine's HTTP loop thread at that request's
    /generate response until released: its sample has ended on the server but not yet in the engine, so it still
    holds its adapter (forces the interleaving; no timing)."""

    def __init__(self) -> None:
        self.rid: str | None = None
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, endpoint: str, kind: str, body) -> None:
        if self.rid is not None and endpoint == "/generate" and kind == "response" and body.get("meta_info", {}).get(
                "id") == self.rid:
            self.reached.set()
            assert self.release.wait(timeout=300)


@pytest.fixture(scope="module")
def hold():
    return HoldResponse()


@pytest.fixture(scope="module")
def engine(server, hold):
    from tests.sglang_support.real_server import engine_for

    eng = engine_for(server, pause_mode="in_place", body_hook=hold)
    yield eng
    hold.release.set()
    eng.close()


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    """PEFT adapters of the served checkpoint as PEFT writes them, by seed: (config dict, tensors, PeftModel)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = {}
    for seed, r in ((1, 8), (2, 8), (3, 16)):
        base = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
        torch.manual_seed(seed)
        model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(TARGETS),
                                                          init_lora_weights=False, lora_dropout=0.0))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.3)
        d = tmp_path_factory.mktemp(f"adapter{seed}")
        model.save_pretrained(d)
        out[seed] = (json.loads((d / "adapter_config.json").read_text()),
                     sorted(load_file(d / "adapter_model.safetensors").items()), model.eval())
    return out


def _generate(engine, n_tokens: int, *, n: int = 2, seed: int = 0):
    engine.submit(Prompt(prompt_id=f"p{seed}", text="", task="synthetic", gold="0", token_ids=PROMPT),
                  SamplingParams(max_new_tokens=n_tokens, temperature=1.0, seed=seed), n=n, version=engine.version)
    return collect(engine, n)


def _loaded(server) -> set[str]:
    return {m["id"] for m in requests.get(server.url + "/v1/models", timeout=30).json()["data"]}


def _wait_unloaded(server, name: str) -> None:
    """Until `name` leaves /v1/models (the engine unloads on its control pool; a safety bound, not a timing test)."""
    deadline = time.monotonic() + 120
    while name in _loaded(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name not in _loaded(server)


def test_adapter_in_the_request_body_gives_hf_peft_log_probs_and_counts_its_bytes(server, engine, adapters):
    config, tensors, model = adapters[1]
    engine.update_adapter(config, iter(tensors), version=1)
    assert "policy-v1" in _loaded(server)
    # r (in + out) per adapted linear of the tiny Llama (hidden 64, 2 heads of 32, 1 KV head, MLP 128), FP32
    per_layer = 8 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)
    assert engine.last_sync_stats.bytes == 2 * per_layer * 4
    for c in _generate(engine, 12, seed=1):
        assert c.weight_versions == [1] * 12
        assert max_diff(full_logprobs(model, PROMPT, c.output_ids), c.gen_logprobs) < TOL


def test_a_sample_keeps_its_adapter_across_a_switch_and_the_old_one_goes_when_unused(server, engine, hold, adapters):
    (_, _, model1), (config2, tensors2, model2) = adapters[1], adapters[2]
    hold.rid = "held/0/v1"
    engine.submit(Prompt(prompt_id="held", text="", task="synthetic", gold="0", token_ids=PROMPT),
                  SamplingParams(max_new_tokens=12, temperature=1.0, seed=7), n=1, version=engine.version)
    assert hold.reached.wait(timeout=300)
    engine.update_adapter(config2, iter(tensors2), version=2)
    assert {"policy-v1", "policy-v2"} <= _loaded(server)  # v1 is still held by the unfinished sample
    hold.rid = None
    hold.release.set()
    (long,) = collect(engine, 1)
    assert long.weight_versions == [1] * len(long.output_ids)
    assert max_diff(full_logprobs(model1, PROMPT, long.output_ids), long.gen_logprobs) < TOL
    _wait_unloaded(server, "policy-v1")
    for c in _generate(engine, 12, seed=2):
        assert c.weight_versions == [2] * 12
        assert max_diff(full_logprobs(model2, PROMPT, c.output_ids), c.gen_logprobs) < TOL


def test_refused_adapters_keep_the_previous_version_serving(server, engine, adapters):
    (config2, tensors2, model2), (config3, tensors3, _) = adapters[2], adapters[3]
    missing = [(n, t) for n, t in tensors2 if "layers.1.self_attn.v_proj.lora_A" not in n]
    with pytest.raises(WeightSyncError, match=r"policy-v3.*missing tensor .*layers\.1\.self_attn\.v_proj\.lora_A"):
        engine.update_adapter(config2, iter(missing), version=3)  # refused before sending
    with pytest.raises(WeightSyncError, match=r"adapter 'policy-v3'.*keep serving policy-v2"):
        engine.update_adapter(config3, iter(tensors3), version=3)  # r=16 > --max-lora-rank 8: SGLang refuses
    assert engine.version == 2 and "policy-v3" not in _loaded(server)
    for c in _generate(engine, 12, seed=3):
        assert c.weight_versions == [2] * 12
        assert max_diff(full_logprobs(model2, PROMPT, c.output_ids), c.gen_logprobs) < TOL


def test_adapter_from_a_peft_directory(server, adapters, tmp_path):
    from tests.sglang_support.real_server import engine_for

    config, tensors, model = adapters[1]
    eng = engine_for(server, pause_mode="in_place", adapter_dir=str(tmp_path))
    try:
        eng.update_adapter(config, iter(tensors), version=4)
        assert (tmp_path / "policy-v4" / "adapter_model.safetensors").is_file()
        for c in _generate(eng, 12, seed=4):
            assert c.weight_versions == [4] * 12
            assert max_diff(full_logprobs(model, PROMPT, c.output_ids), c.gen_logprobs) < TOL
    finally:
        eng.close()
