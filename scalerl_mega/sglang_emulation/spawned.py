"""`SpawnedTestServer`: the SGLang emulation (`server.SGLangTestServer`) in a spawned process, as tests
run it when the trainer and the server must own separate torch.distributed registries."""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any

from scalerl_mega.rollout.core import CoreConfig

if TYPE_CHECKING:  # pragma: no cover
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

    from scalerl_mega.rollout.local import LocalModelSpec


def _serve_main(spec: LocalModelSpec, core_config: CoreConfig, schema_path: str | None, kwargs: dict[str, Any],
                url_q: Queue, stop_ev: Event) -> None:
    import torch

    from scalerl_mega.rollout.local import build_model
    from scalerl_mega.sglang_emulation.server import SGLangTestServer

    torch.set_num_threads(1)
    validator = None
    if schema_path is not None:
        from scalerl_mega.rollout.openapi_check import OpenAPIValidator

        v = OpenAPIValidator.from_file(schema_path)
        validator = lambda ep, body, method: v.validate_request(ep, body, method)  # noqa: E731
    server = SGLangTestServer(build_model(spec), core_config=core_config, request_validator=validator, **kwargs)
    url_q.put(server.start())
    stop_ev.wait()
    server.stop()


class SpawnedTestServer:
    """`SGLangTestServer` in a spawned process, like a real SGLang server: the trainer and the
    server then own separate torch.distributed registries (one process cannot hold both ends of
    a group with the same name). `state()` reads the `/_test/state` introspection endpoint."""

    def __init__(
        self, spec: LocalModelSpec, *, core_config: CoreConfig, schema_path: str | None = None,
        start_timeout_s: float = 180.0, **kwargs: Any
    ) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        q, self._stop = ctx.Queue(), ctx.Event()
        self.proc = ctx.Process(
            target=_serve_main, args=(spec, core_config, schema_path, kwargs, q, self._stop), daemon=True
        )
        self.proc.start()
        try:
            self.url: str = q.get(timeout=start_timeout_s)
        except queue.Empty:
            self.proc.kill()
            raise RuntimeError(f"test server process did not start within {start_timeout_s}s") from None

    def state(self) -> dict[str, Any]:
        import requests

        return requests.get(self.url + "/_test/state", timeout=30).json()

    def clear_events(self) -> None:
        import requests

        requests.post(self.url + "/_test/clear_events", timeout=30)

    def hold(self, *, min_output_len: int) -> None:
        """Hold the server's scheduler once a running request has `min_output_len` output tokens, until
        `release()` (`SGLangTestServer.hold_when`); `state()["held"]` tells when it is held."""
        import requests

        requests.post(self.url + "/_test/hold", json={"min_output_len": int(min_output_len)}, timeout=30)

    def release(self) -> None:
        import requests

        requests.post(self.url + "/_test/release", timeout=30)

    def stop(self) -> None:
        self._stop.set()
        self.proc.join(timeout=20)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
