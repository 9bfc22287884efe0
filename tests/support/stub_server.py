"""A minimal SGLang stand-in without a model: an asyncio HTTP/1.1 server (one thread, one event loop)
that answers `/generate` with canned outputs, for driving thousands of concurrent requests through
the SGLang client (`tests/integration/test_sglang_client_concurrency.py`; its retired benchmark's
figures: bench/results/sglang_client_concurrency.md). The model-backed emulation is `scalerl_mega/sglang_emulation/`.

- It listens on `num_ports` ports (one "server" each, as `rollout.num_engines` servers), sharing its
  counters: `in_flight` (requests inside the handler now), `peak` (the most at once), `arrived`,
  `served`, `open_connections`, `accepted` (connections ever opened).
- `/generate`: `output_ids[j] = (sum(input_ids) + sampling_seed + j) % 1000` for j < max_new_tokens,
  log-prob `-(j + 1) / 8`, finish `length`, weight version "0" (`expected_output`). Before answering, a
  request waits for its `barrier` generation: every `barrier` arrivals open one gate, so with
  barrier = N the first answer leaves only once N requests are in flight together (what a test asserts
  without timing); then it sleeps `delay_s` (emulated decode time; 0: none). barrier=0: no gate.
  `hold()` makes every later request wait until `release()` (a hung server); `fail_on_seed` answers
  HTTP 400 for that sampling seed.
- `/health_generate`: 200. Anything else: 404.

Keep-alive; request bodies with Content-Length only (what `requests` and `httpx` send for JSON).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any


def expected_output(input_ids: list[int], *, seed: int, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """The output ids and log-probs the stub answers for a request."""
    base = sum(int(t) for t in input_ids) + int(seed)
    return [(base + j) % 1000 for j in range(max_new_tokens)], [-(j + 1) / 8 for j in range(max_new_tokens)]


class StubGenerateServer:
    def __init__(self, *, num_ports: int = 1, barrier: int = 0, delay_s: float = 0.0, host: str = "127.0.0.1",
                 fail_on_seed: int | None = None) -> None:
        if num_ports < 1 or barrier < 0 or delay_s < 0:
            raise ValueError(f"StubGenerateServer num_ports={num_ports} must be >= 1, barrier={barrier} and "
                             f"delay_s={delay_s} >= 0")
        self.num_ports, self.barrier, self.delay_s, self.host = num_ports, barrier, delay_s, host
        self.fail_on_seed = fail_on_seed
        self.in_flight = self.peak = self.arrived = self.served = self.open_connections = self.accepted = 0
        self.ports: list[int] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stub-sglang", daemon=True)
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[asyncio.Task] = set()
        self._gate: asyncio.Event | None = None
        self._held: asyncio.Event | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    def start(self) -> "StubGenerateServer":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._gate = asyncio.Event()
        for _ in range(self.num_ports):
            server = await asyncio.start_server(self._connection, self.host, 0, backlog=8192)
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])

    def hold(self) -> None:
        """Every request arriving from now on waits until `release()`."""
        def _hold():
            self._held = asyncio.Event()
        self.loop.call_soon_threadsafe(_hold)

    def release(self) -> None:
        def _release():
            if self._held is not None:
                self._held.set()
                self._held = None
        self.loop.call_soon_threadsafe(_release)

    def stop(self) -> None:
        async def _stop():
            for s in self._servers:
                s.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            for s in self._servers:
                await s.wait_closed()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()

    # ---- serving ----------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        self.open_connections += 1
        self.accepted += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path = head[0].split(" ")[:2]
                headers = dict((k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in head[1:] if h))
                n = int(headers.get("content-length", "0"))
                body = json.loads(await reader.readexactly(n)) if n else None
                status, payload = await self._handle(method, path, body)
                data = json.dumps(payload).encode()
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed the connection, or `stop()`
        finally:
            self.open_connections -= 1
            self._conns.discard(task)
            writer.close()

    async def _handle(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        if (method, path) == ("GET", "/health_generate"):
            return 200, {}
        if (method, path) != ("POST", "/generate"):
            return 404, {"error": f"{method} {path}: not served by the stub"}
        sp = body["sampling_params"]
        seed, n = int(sp.get("sampling_seed", 0)), int(sp["max_new_tokens"])
        self.arrived += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self._held is not None:
                await self._held.wait()
            if self.barrier:
                gate = self._gate
                if self.arrived % self.barrier == 0:
                    gate.set()
                    self._gate = asyncio.Event()
                await gate.wait()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if self.fail_on_seed is not None and seed == self.fail_on_seed:
            return 400, {"error": {"message": f"stub refuses sampling_seed={seed}"}}
        ids, lps = expected_output(body["input_ids"], seed=seed, max_new_tokens=n)
        self.served += 1
        return 200, {"output_ids": ids, "meta_info": {
            "id": body.get("rid", ""), "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": len(body["input_ids"]), "completion_tokens": n, "weight_version": "0",
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}}
