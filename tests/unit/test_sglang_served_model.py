"""The pre-send check compares what an attached SGLang server serves (`/model_info` `model_path`, its
config.json) with the model the trainer's updates are built for: a server started on
another checkpoint is refused before anything is sent, naming the server and each differing field.
The server here is a stdlib HTTP stub that answers /model_info and records every request."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "tests" / "data" / "hf_configs"


class _Stub:
    def __init__(self, model_path: str) -> None:
        self.requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                stub.requests.append(self.path)
                body = json.dumps({"model_path": model_path, "is_generation": True}).encode()
                self.send_response(200 if self.path == "/model_info" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET  # noqa: N815 - anything else is recorded too (and fails)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def stub_factory():
    made = []

    def make(model_path: str) -> _Stub:
        made.append(_Stub(model_path))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _engine(url: str, preset: str):
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.model.config import load_model_preset

    arch, kw = hf_config_from_model(load_model_preset(preset))
    spec = LocalModelSpec(arch=arch, config=kw)
    return SGLangRolloutEngine([SGLangServer.attach(url)], config=SGLangEngineConfig(model=spec, control_timeout_s=10)), spec


def _served(tmp_path: Path, cfg: dict | str) -> str:
    """A checkpoint directory whose config.json is `cfg` (a dict, or a file name under PUBLISHED)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if isinstance(cfg, str):
        shutil.copy(PUBLISHED / cfg, tmp_path / "config.json")
    else:
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_server_on_another_checkpoint_is_refused_before_anything_is_sent(tmp_path, stub_factory):
    from scalerl_mega.weight_sync import WeightSyncError

    path = _served(tmp_path / "llama8b", "Llama-3.1-8B.config.json")
    stub = stub_factory(path)
    engine, _ = _engine(stub.url, "tiny_dense")
    try:
        with pytest.raises(WeightSyncError) as e:
            engine.update_weights([("model.norm.weight", torch.ones(64))], version=1)
    finally:
        engine.close()
    msg = str(e.value)
    assert f"SGLang server {stub.url} serves {path}, not the trainer's model" in msg
    assert f"hidden_size=4096 in {path}/config.json but 64 expected" in msg and "nothing was sent" in msg
    assert stub.requests == ["/model_info"]  # no pause, no weight-update request


def test_server_on_the_trainers_architecture_passes(tmp_path, stub_factory):
    """The twin's own config served (dense) passes and the manifest is built; so does Meta's multimodal Scout
    config.json against the scout_17b16e preset's twin (the text model is compared)."""
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.config import load_model_preset

    arch, kw = hf_config_from_model(load_model_preset("tiny_dense"))
    stub = stub_factory(_served(tmp_path / "tiny", {"model_type": "llama", **kw}))
    engine, _ = _engine(stub.url, "tiny_dense")
    try:
        man = engine.manifest()
        assert man is not None and man.problems([]) != []  # a real manifest (an empty update is incomplete)
    finally:
        engine.close()
    assert stub.requests == ["/model_info"]

    scout_stub = stub_factory(_served(tmp_path / "scout", "Llama-4-Scout-17B-16E-Instruct.config.json"))
    engine, spec = _engine(scout_stub.url, "scout_17b16e")
    try:
        engine._check_served_models(spec)  # no error: the multimodal file's text_config is Scout's
    finally:
        engine.close()


def test_unreadable_served_path_is_not_checked(stub_factory):
    stub = stub_factory("meta-llama/Llama-3.1-8B")  # a hub id, not a directory here
    engine, spec = _engine(stub.url, "tiny_dense")
    try:
        engine._check_served_models(spec)
    finally:
        engine.close()
    assert stub.requests == ["/model_info"]
