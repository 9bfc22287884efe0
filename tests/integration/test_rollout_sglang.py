"""SGLang client against the in-process SGLang test server (backed by the local engine, gloo sync).

Every request body the client sends and every response it parses is validated against SGLang
0.5.23's OpenAPI schema (tests/data/sglang-0.5.23-openapi.json; see README.sglang-openapi.md).
"""

from __future__ import annotations

import pathlib
import threading
import time

import pytest
import requests
import torch

from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.local import LocalModelSpec, build_model, make_requests
from scalerl_mega.rollout.openapi_check import OpenAPIValidator
from scalerl_mega.rollout.sglang import (
    SGLangClient,
    SGLangEngineConfig,
    SGLangError,
    SGLangRolloutEngine,
    SGLangServer,
    SGLangServerConfig,
    launch_command,
)
from scalerl_mega.sglang_emulation import SGLangTestServer
from scalerl_mega.weight_sync import WeightSyncConfig, bucket_meta, free_port, init_custom_process_group
from scalerl_mega.types import FinishReason, Prompt, SamplingParams

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
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


@pytest.fixture(scope="module")
def schema():
    return OpenAPIValidator.from_file(str(DATA / "sglang-0.5.23-openapi.json"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recorder:
    """Client body hook: validates every body against the schema and counts them."""

    def __init__(self, schema: OpenAPIValidator) -> None:
        self.schema = schema
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, endpoint: str, kind: str, body) -> None:
        method = "get" if endpoint in ("/health_generate", "/model_info", "/server_info") else "post"
        if kind == "request":
            self.schema.validate_request(endpoint, body, method)
        else:
            self.schema.validate_response(endpoint, body, method)
        with self.lock:
            self.seen.append((endpoint, kind))


def _model(seed: int):
    m = build_model(LocalModelSpec(arch="llama", config=CFG, init_seed=seed))
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(8.0)
    return m


def _server(schema, **kw) -> SGLangTestServer:
    s = SGLangTestServer(
        _model(0),
        core_config=CoreConfig(max_batch=8, max_seq_len=96),
        request_validator=lambda ep, body, method: schema.validate_request(ep, body, method),
        sync_timeout_s=30.0,
        **kw,
    )
    s.start()
    return s


def _oracle(model, prompt, output):
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].double(), -1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def _prompt(pid: str, ids: list[int]) -> Prompt:
    return Prompt(prompt_id=pid, text="", task="synthetic", gold="0", token_ids=ids)


def _collect(engine, n, timeout_s=120.0):
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += engine.poll(0.5)
    assert len(out) == n, f"got {len(out)}/{n} completions"
    return out


def test_launch_command_flags():
    cmd = launch_command(SGLangServerConfig(model_path="/m", tp_size=2, dtype="bfloat16", mem_fraction_static=0.6))
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for flag in ("--model-path /m", "--tp-size 2", "--dtype bfloat16", "--mem-fraction-static 0.6", "--random-seed 0"):
        assert flag in joined
    assert "--skip-tokenizer-init" in cmd and "--enable-fp32-lm-head" in cmd
    assert "--enable-fp32-lm-head" not in launch_command(SGLangServerConfig(model_path="/m", fp32_lm_head=False))
    with pytest.raises(ValueError, match="mem_fraction_static"):
        SGLangServerConfig(model_path="/m", mem_fraction_static=1.5)


def test_in_place_launch_flags():
    """A server the engine updates in place gets --disable-radix-cache --disable-overlap-schedule (the two
    defects real SGLang 0.5.23 shows otherwise: tests/sglang/test_real_in_place.py); retract/abort keep
    SGLang's defaults (the update flushes the cache there)."""
    from scalerl_mega.rollout.sglang import IN_PLACE_FLAGS

    assert list(IN_PLACE_FLAGS) == ["--disable-radix-cache", "--disable-overlap-schedule"]
    cmd = launch_command(SGLangServerConfig(model_path="/m"))  # in_place is the default pause mode
    assert "--disable-radix-cache" in cmd and "--disable-overlap-schedule" in cmd
    for mode in ("retract", "abort"):
        cmd = launch_command(SGLangServerConfig(model_path="/m", pause_mode=mode))
        assert "--disable-radix-cache" not in cmd and "--disable-overlap-schedule" not in cmd
    with pytest.raises(ValueError, match="pause_mode"):
        SGLangServerConfig(model_path="/m", pause_mode="sideways")


def test_in_place_update_refused_when_a_server_lacks_the_flags(schema, monkeypatch):
    """An attached server launched without IN_PLACE_FLAGS: the first in_place update is refused before
    anything is paused, naming the server and the missing flag."""
    server = _server(schema)
    monkeypatch.setattr(SGLangClient, "server_info",
                        lambda self: {"disable_radix_cache": False, "disable_overlap_schedule": True})
    engine = SGLangRolloutEngine([SGLangServer.attach(server.url)], config=SGLangEngineConfig(
        pause_mode="in_place", model=LocalModelSpec(arch="llama", config=CFG),
        sync=WeightSyncConfig(backend="gloo", timeout_s=5)))
    try:
        with pytest.raises(SGLangError, match="--disable-radix-cache") as e:
            engine.update_weights(list(_model(1).state_dict().items()), version=1)
        assert server.url in str(e.value) and "--disable-overlap-schedule" not in str(e.value)
        # nothing was paused or sent (the read-only /model_info of the served-model check may come first)
        assert [e for e in server.events if e != "/model_info"] == [] and engine.version == 0
    finally:
        engine.close()
        server.stop()


def test_no_sglang_import_in_package():
    root = pathlib.Path(__file__).resolve().parents[2] / "scalerl_mega"
    for f in root.rglob("*.py"):
        text = f.read_text()
        assert "import sglang" not in text and "from sglang" not in text, f


def test_schema_validator_rejects_bad_bodies(schema):
    from jsonschema import ValidationError

    schema.validate_request("/pause_generation", {"mode": "in_place"})
    with pytest.raises(ValidationError):
        schema.validate_request("/pause_generation", {"mode": "sideways"})
    with pytest.raises(ValidationError):
        schema.validate_request("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"]})
    with pytest.raises(ValidationError, match="max_tokens"):
        schema.validate_request("/generate", {"input_ids": [1], "sampling_params": {"max_tokens": 3}})
    with pytest.raises(ValidationError):
        schema.validate_response("/generate", {"output_ids": [1], "meta_info": {"id": "x"}})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    _model(0).save_pretrained(d)
    return str(d)


def _spawned(model_dir, **kw):
    from scalerl_mega.sglang_emulation import SpawnedTestServer

    return SpawnedTestServer(
        LocalModelSpec(arch="llama", path=model_dir),
        core_config=CoreConfig(max_batch=8, max_seq_len=96),
        schema_path=str(DATA / "sglang-0.5.23-openapi.json"),
        sync_timeout_s=30.0,
        **kw,
    )


def test_generate_update_and_in_flight_versions(schema, model_dir):
    """Real generation over HTTP; the 0.5.23 update sequence; a request in flight during the
    update has tokens tagged v0 then v1; after the sync, log-probs equal the new model's; a
    bucket whose shapes disagree with the model is refused."""
    server = _spawned(model_dir)
    rec = Recorder(schema)
    engine = SGLangRolloutEngine(
        [SGLangServer.attach(server.url)],
        config=SGLangEngineConfig(pause_mode="in_place", sync=WeightSyncConfig(backend="gloo", timeout_s=30, bucket_bytes=4096)),
        body_hook=rec,
    )
    try:
        assert SGLangClient(server.url, body_hook=rec).health_generate()
        model0 = build_model(LocalModelSpec(arch="llama", path=model_dir))
        model1 = _model(1)
        engine.submit(_prompt("a", [3, 4, 5]), SamplingParams(max_new_tokens=6, seed=11), n=3, version=0)
        done = _collect(engine, 3)
        assert sorted(c.sample_index for c in done) == [0, 1, 2]
        for c in done:
            assert c.weight_versions == [0] * 6 and c.finish_reason == FinishReason.LENGTH
            assert max(abs(a - b) for a, b in zip(_oracle(model0, [3, 4, 5], c.output_ids), c.gen_logprobs)) < 1e-5

        server.hold(min_output_len=5)  # the request stays in flight through the update, on any machine load
        engine.submit(_prompt("long", [7, 8]), SamplingParams(max_new_tokens=60, seed=5), n=1, version=0)
        deadline = time.monotonic() + 60
        while not server.state()["held"]:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        server.clear_events()
        engine.update_weights(list(model1.state_dict().items()), version=1)
        server.release()
        ev = server.state()["events"]
        n_buckets = engine.last_sync_stats.buckets
        assert n_buckets > 1
        assert ev == (
            ["/model_info"]  # first update only: the served model's path, for the pre-send manifest check
            + ["/server_info"]  # first in_place update only: the server runs with IN_PLACE_FLAGS
            + ["/pause_generation", "/begin_weight_update", "/init_weights_update_group"]
            + ["/update_weights_from_distributed"] * n_buckets
            + ["/end_weight_update", "/continue_generation"]
        )
        (c,) = _collect(engine, 1)
        k = c.weight_versions.index(1)
        assert k >= 5 and c.weight_versions == [0] * k + [1] * (60 - k)

        engine.submit(_prompt("b", [9, 1, 2]), SamplingParams(max_new_tokens=5, seed=3), n=1, version=1)
        (c,) = _collect(engine, 1)
        assert c.weight_versions == [1] * 5
        assert max(abs(a - b) for a, b in zip(_oracle(model1, [9, 1, 2], c.output_ids), c.gen_logprobs)) < 1e-5
        # a second update (flattened buckets) re-uses the group (no second init)
        server.clear_events()
        engine.config.sync.flattened = True
        engine.update_weights(list(model0.state_dict().items()), version=2)
        assert "/init_weights_update_group" not in server.state()["events"]
        assert server.state()["version"] == "2"
        engine.submit(_prompt("c", [9, 1, 2]), SamplingParams(max_new_tokens=5, seed=3), n=1, version=2)
        (c,) = _collect(engine, 1)
        assert c.weight_versions == [2] * 5
        assert max(abs(a - b) for a, b in zip(_oracle(model0, [9, 1, 2], c.output_ids), c.gen_logprobs)) < 1e-5
        assert {e for e, _ in rec.seen} >= {
            "/generate", "/pause_generation", "/begin_weight_update", "/init_weights_update_group",
            "/update_weights_from_distributed", "/end_weight_update", "/continue_generation", "/health_generate",
        }  # fmt: skip
        assert ("/generate", "response") in rec.seen

        # a bucket whose declared shape disagrees with the model: received in names order, then refused
        import torch.distributed as dist

        client = SGLangClient(server.url, body_hook=rec)
        client.begin_weight_update()
        bad = bucket_meta([("model.norm.weight", torch.ones(31))], version=3, index=0, flattened=False)
        box = {}
        t = threading.Thread(
            target=lambda: box.setdefault(
                "e", _catch(client.update_weights_from_distributed, bad, group_name="weight_update_group", flush_cache=False)
            )
        )
        t.start()
        dist.broadcast(torch.ones(31), src=0, group=engine._group)
        t.join(30)
        assert isinstance(box["e"], SGLangError) and "model.norm.weight" in str(box["e"])
        client.end_weight_update()
        assert server.state()["version"] == "2"
    finally:
        engine.close()
        server.stop()


@pytest.mark.slow
def test_init_blocks_until_trainer_joins(model_dir):
    server = _spawned(model_dir)
    client = SGLangClient(server.url)
    try:
        port = free_port()
        result = {}
        t = threading.Thread(
            target=lambda: result.setdefault(
                "r",
                client.init_weights_update_group(
                    master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2,
                    group_name="weight_update_group", backend="gloo",
                ),
            )
        )  # fmt: skip
        t.start()
        time.sleep(1.5)
        assert t.is_alive() and "r" not in result
        group = init_custom_process_group(
            backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0,
            group_name="weight_update_group", timeout_s=30,
        )  # fmt: skip
        t.join(30)
        assert result["r"]["success"] is True
        from scalerl_mega.weight_sync import destroy_group

        destroy_group(group)
    finally:
        server.stop()


def test_client_side_interruption(schema):
    server = _server(schema)
    engine = SGLangRolloutEngine(
        [SGLangServer.attach(server.url)], config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo")), body_hook=Recorder(schema)
    )
    try:
        sp = SamplingParams(max_new_tokens=20, seed=1, interruption_at=4, interruption_ids=[50, 51], answer_budget=3)
        engine.submit(_prompt("i", [3, 4]), sp, n=1, version=0)
        (c,) = _collect(engine, 1)
        # interrupted, then the 3-token answer budget ran out: truncated (App. A.13)
        assert c.finish_reason == FinishReason.LENGTH and c.interrupted_at == 4
        assert c.output_ids[4:6] == [50, 51] and len(c.output_ids) == 9
        assert c.loss_mask == [1] * 4 + [0, 0] + [1] * 3
        ref = _oracle(server.core.model, [3, 4], c.output_ids)
        assert max(abs(ref[j] - c.gen_logprobs[j]) for j in range(9) if c.loss_mask[j]) < 1e-5
    finally:
        engine.close()
        server.stop()


def test_server_rules(schema):
    server = _server(schema)
    reached, release = server.hold_when(lambda srv: srv.core.num_running > 0)
    client = SGLangClient(server.url)
    try:
        # no session -> SGLang's error
        meta = bucket_meta([("model.norm.weight", torch.ones(32))], version=1, index=0, flattened=False)
        with pytest.raises(SGLangError, match="between begin_weight_update"):
            client.update_weights_from_distributed(meta, group_name="weight_update_group", flush_cache=False)
        # unknown sampling key -> 400; schema violation -> 422
        r = requests.post(server.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_tokens": 2}})
        assert r.status_code in (400, 422)
        r = requests.post(server.url + "/pause_generation", json={"mode": "sideways"})
        assert r.status_code == 422
        # flush refused while a request is running, even when paused in place; fine after retract
        th = threading.Thread(
            target=lambda: client.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 80, "sampling_seed": 1})
        )
        th.start()
        assert reached.wait(60)  # the request is running and held there
        with pytest.raises(SGLangError, match="400"):
            client.flush_cache()
        client.pause_generation("in_place")
        with pytest.raises(SGLangError, match="400"):
            client.flush_cache()
        client.pause_generation("retract")
        client.flush_cache()
        client.continue_generation()
        release.set()
        th.join(60)
        assert not th.is_alive()
    finally:
        release.set()
        server.stop()


def _catch(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except Exception as e:  # noqa: BLE001
        return e


def test_abort_mode_returns_partial_outputs(schema):
    server = _server(schema)
    reached, release = server.hold_when(lambda srv: srv.core.num_running == 2,
                                        start_when=lambda srv: srv.core.num_waiting == 2)
    engine = SGLangRolloutEngine(
        [SGLangServer.attach(server.url)],
        config=SGLangEngineConfig(pause_mode="abort", sync=WeightSyncConfig(backend="gloo")),
        body_hook=Recorder(schema),
    )
    try:
        engine.submit(_prompt("x", [3]), SamplingParams(max_new_tokens=80, seed=2), n=2, version=0)
        assert reached.wait(60)  # both requests running, the scheduler held
        engine.pause()
        release.set()
        done = _collect(engine, 2)
        engine.resume()
        assert {c.finish_reason for c in done} == {FinishReason.ABORT}
        assert all(0 < len(c.output_ids) < 80 and set(c.weight_versions) == {0} for c in done)
    finally:
        release.set()
        engine.close()
        server.stop()


class _Restartable(SGLangServer):
    """An SGLangServer whose 'process' is a test server on a fixed port, (re)made by `make(port)`;
    `running(impl)` tells whether the current one still runs."""

    def __init__(self, make, running) -> None:
        self._make, self._running = make, running
        self.port = free_port()
        super().__init__(url=f"http://127.0.0.1:{self.port}")
        self.impl = None
        self.start()

    @property
    def restartable(self) -> bool:
        return True

    def start(self, *, wait: bool = True) -> None:
        self.impl = self._make(self.port)

    def stop(self) -> None:
        if self.impl is not None and self._running(self.impl):
            self.impl.stop()


def test_dead_server_is_restarted_and_requests_requeued(schema):
    srv = _Restartable(lambda port: _server(schema, port=port), lambda impl: not impl.killed)
    reached, _ = srv.impl.hold_when(lambda impl: impl.core.num_running == 3,  # the first server only
                                    start_when=lambda impl: impl.core.num_waiting == 3)
    engine = SGLangRolloutEngine(
        [srv], config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo")), body_hook=Recorder(schema)
    )
    try:
        engine.submit(_prompt("r", [4, 5]), SamplingParams(max_new_tokens=40, seed=9), n=3, version=0)
        assert reached.wait(60)  # 3 requests in flight, held until the kill
        first = srv.impl
        srv.impl.kill()
        done = _collect(engine, 3)
        assert srv.restarts == 1 and srv.impl is not first
        assert sorted(c.sample_index for c in done) == [0, 1, 2]
        assert all(len(c.output_ids) == 40 and c.finish_reason == FinishReason.LENGTH for c in done)
    finally:
        engine.close()
        srv.stop()


@pytest.mark.slow
def test_crashed_server_restart_requeue_and_resync(schema, model_dir):
    """SIGKILL the server process mid-generation: it is relaunched, in-flight requests re-queued,
    and the next update rebuilds the weight-sync group and syncs the restarted server."""
    srv = _Restartable(lambda port: _spawned(model_dir, port=port, step_delay_s=0.02),  # SIGKILL = crash
                       lambda impl: impl.proc.is_alive())
    engine = SGLangRolloutEngine(
        [srv], config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo", timeout_s=30)), body_hook=Recorder(schema)
    )
    try:
        model1 = _model(1)
        engine.update_weights(list(model1.state_dict().items()), version=1)
        engine.submit(_prompt("r", [4, 5]), SamplingParams(max_new_tokens=40, seed=9), n=2, version=1)
        deadline = time.monotonic() + 30
        while srv.impl.state()["num_running"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        srv.impl.proc.kill()
        done = _collect(engine, 2)
        assert srv.restarts == 1 and all(len(c.output_ids) == 40 for c in done)
        # the relaunched server runs its launch weights (version "0") until the next sync
        assert all(set(c.weight_versions) == {0} for c in done)
        engine.update_weights(list(model1.state_dict().items()), version=2)
        engine.submit(_prompt("s", [6, 7]), SamplingParams(max_new_tokens=5, seed=1), n=1, version=2)
        (c,) = _collect(engine, 1)
        assert c.weight_versions == [2] * 5
        assert max(abs(a - b) for a, b in zip(_oracle(model1, [6, 7], c.output_ids), c.gen_logprobs)) < 1e-5
    finally:
        engine.close()
        srv.stop()


# ---- MoE routes (rollout routing replay) ------------------------------------------------------------
LLAMA4_MOE = dict(vocab_size=53, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                  num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
                  attention_chunk_size=64, max_position_embeddings=256, tie_word_embeddings=False)


def test_decode_routed_experts_hand_worked():
    import base64
    import struct

    from scalerl_mega.rollout.sglang import RouteLayout, decode_routed_experts

    # 2 positions x 3 layers x top-2, little-endian int32; MoE layers 0 and 2
    vals = [1, 2, 9, 9, 3, 0, 4, 5, 9, 9, 7, 6]
    b64 = base64.b64encode(struct.pack("<12i", *vals)).decode()
    layout = RouteLayout(num_hidden_layers=3, topk=2, moe_layers=(0, 2))
    ids = decode_routed_experts(b64, positions=2, layout=layout)
    assert ids.tolist() == [1, 2, 3, 0, 4, 5, 7, 6] and ids.dtype == "int32"  # num_experts unknown
    with pytest.raises(SGLangError, match="expected 3 positions"):
        decode_routed_experts(b64, positions=3, layout=layout)
    # with the model's expert count: one byte per id (uint8 up to 256 experts); ids past it are refused
    eight = RouteLayout(num_hidden_layers=3, topk=2, moe_layers=(0, 2), num_experts=8)
    ids = decode_routed_experts(b64, positions=2, layout=eight)
    assert ids.tolist() == [1, 2, 3, 0, 4, 5, 7, 6] and ids.dtype == "uint8" and ids.nbytes == 8
    wide = [300, 1, 9, 9, 299, 0, 4, 5, 9, 9, 7, 6]
    b64w = base64.b64encode(struct.pack("<12i", *wide)).decode()
    ids = decode_routed_experts(b64w, positions=2, layout=RouteLayout(num_hidden_layers=3, topk=2, moe_layers=(0, 2),
                                                                        num_experts=301))
    assert ids.tolist() == [300, 1, 299, 0, 4, 5, 7, 6] and ids.dtype == "int32"
    with pytest.raises(SGLangError, match=r"expert ids in \[1, 9\], outside 0..7"):
        decode_routed_experts(b64, positions=2, layout=RouteLayout(num_hidden_layers=3, topk=2, moe_layers=(0, 1),
                                                                    num_experts=8))
    assert "--enable-return-routed-experts" in launch_command(SGLangServerConfig(model_path="/m", return_routed_experts=True))
    assert "--enable-return-routed-experts" not in launch_command(SGLangServerConfig(model_path="/m"))


def test_routed_experts_requested_parsed_and_positioned(schema):
    """Llama-4 with MoE layers 1 and 3 of 4: the client requests `return_routed_experts` (valid per the
    0.5.23 schema), decodes the MoE columns of the response (checked against the schema contract) and
    the routes equal a full-sequence forward's, for an interrupted sample (two requests) too."""
    from scalerl_mega.rollout.hf_params import moe_routers
    from scalerl_mega.rollout.sglang import RouteLayout

    model = build_model(LocalModelSpec(arch="llama4", config=LLAMA4_MOE, init_seed=0))
    with torch.no_grad():
        for r in moe_routers(model):
            r.weight.mul_(20.0)
    server = SGLangTestServer(model, core_config=CoreConfig(max_batch=8, max_seq_len=96),
                              request_validator=lambda ep, body, method: schema.validate_request(ep, body, method),
                              return_routed_experts=True)
    server.start()
    layout = RouteLayout(num_hidden_layers=4, topk=1, moe_layers=(1, 3), num_experts=4)
    rec = Recorder(schema)
    engine = SGLangRolloutEngine([SGLangServer.attach(server.url)], body_hook=rec,
                                 config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo"), routes=layout))
    try:
        engine.submit(_prompt("r", [3, 4, 5]), SamplingParams(max_new_tokens=8, seed=2), n=1, version=0)
        sp = SamplingParams(max_new_tokens=20, seed=1, interruption_at=4, interruption_ids=[50, 51], answer_budget=3)
        engine.submit(_prompt("i", [3, 4]), sp, n=1, version=0)
        out = {c.prompt_id: c for c in _collect(engine, 2)}
        assert ("/generate", "response") in rec.seen
        for c in out.values():
            seq = c.prompt_ids + c.output_ids
            assert c.routes.num_positions == len(seq) - 1 and len(c.routes.weights) == 0
            assert c.routes.expert_ids.dtype == "uint8"  # decoded to one byte per id, no Python list
            assert c.routes.versions == [0] * (len(seq) - 1)
            logits = []
            hooks = [r.register_forward_hook(lambda m, a, o: logits.append(o[1])) for r in moe_routers(model)]
            with torch.no_grad():
                model(torch.tensor([seq[:-1]]))
            for h in hooks:
                h.remove()
            ref = torch.stack(logits, dim=1).argmax(-1)  # [N, MoE layers]
            assert c.routes.expert_ids.tolist() == ref.flatten().tolist()
        assert out["i"].interrupted_at == 4 and len(out["i"].output_ids) == 9
    finally:
        engine.close()
        server.stop()
    # a server without the flag answers without routes: the client says how to fix it
    plain = _server(schema)
    engine = SGLangRolloutEngine([SGLangServer.attach(plain.url)],
                                 config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo"), routes=layout))
    try:
        with pytest.raises(SGLangError, match="--enable-return-routed-experts"):
            engine._generate(engine._clients[0], make_requests(_prompt("x", [3]), SamplingParams(max_new_tokens=2),
                                                               n=1, version=0, base_seed=0)[0])
    finally:
        engine.close()
        plain.stop()
