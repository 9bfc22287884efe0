"""SGLang 0.5.23 backend: server launch/attach, HTTP client, and the weight-update sequence.

Plain HTTP + torch.distributed; sglang itself is never imported (it cannot even be installed on CPU
machines; SGLang 0.5.23's server arguments). `/generate` runs on one asyncio event-loop thread over
keep-alive connections pooled per server (`AsyncHttp`), at most servers x
`SGLangEngineConfig.max_inflight_per_server` (`rollout.max_batch_size`) in flight, the rest waiting
client-side: no thread per request. The control endpoints use blocking `requests` from a small pool.

Weight update (SGLang 0.5.23's HTTP API, tests/data/sglang-0.5.23-openapi.json), for every server:
  /pause_generation {mode}      in_place (PipelineRL: keep running requests and their KV) or
                                retract / abort (PPO-off-policy)
  /begin_weight_update          0.5.23: updates outside a session fail
  /init_weights_update_group    first time only: fired to all servers without waiting, then the
                                trainer joins as rank 0, then the replies are awaited
  /update_weights_from_distributed  per bucket: HTTP first (async), then the broadcasts in
                                `names` order, then wait for both; flush_cache only when not in_place
                                (a flush is refused while requests sit in the running batch)
  /end_weight_update            always, also after a failure
  /continue_generation          after a successful update, and after a failed one (WeightSyncError):
                                the servers are never left paused.

Before any of this, the whole update is checked against the served model's parameter names and
shapes (`weight_sync.WeightManifest`, from `SGLangEngineConfig.model` or the `model_path` the
server reports when it is a local HF directory, instantiated on the meta device): an unknown name,
a wrong shape or a missing parameter raises WeightSyncError naming the tensor, and the servers are
not even paused. This matters because SGLang applies each bucket as it arrives: a tensor the server
rejected itself (no manifest available, or a dtype the server refuses) leaves the buckets before it
applied; then the engine's `version` is not advanced, generation is resumed and the error raised.

Forced interruption is done client-side in two requests: generate up to `interruption_at`
tokens; if the budget ran out, resend prompt + output + phrase for `answer_budget` more tokens.

MoE routes (rollout routing replay, issue #19): with `SGLangEngineConfig.routes` set, requests carry
`return_routed_experts: true` (SGLang 0.5.23 `GenerateReqInput`; the server must run with
`--enable-return-routed-experts`, `SGLangServerConfig.return_routed_experts`) and the response's
`meta_info.routed_experts` is decoded: base64 of a little-endian int32 C-order array
[prompt + output tokens - 1, num_hidden_layers, top-k] of global expert ids (SGLang's
`tokenizer_manager` encodes the capturer's host buffer with `pybase64.b64encode(t.numpy().tobytes())`).
The MoE layers' columns become `Completion.routes` (expert ids only: SGLang returns no gate weights,
so `moe.routing_replay=ids_and_weights` is refused with rollout=sglang). After an interruption the
second request's routes are used only for the positions the first one did not cover (each position
keeps the route of the forward that sampled its next token, as in the local engine).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.rollout.core import GenRequest
from scalerl_mega.weight_sync import BucketMeta, WeightSyncConfig, WeightSyncError
from scalerl_mega.types import Completion, FinishReason, Routes

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from scalerl_mega.types import Prompt, SamplingParams

PAUSE_MODES = ("in_place", "retract", "abort")
BodyHook = Callable[[str, str, Any], None]
"""Called as hook(endpoint, "request" | "response", body) for every JSON body (tests validate)."""


class SGLangError(RuntimeError):
    """An SGLang endpoint answered with an error."""


class ServerDown(SGLangError):
    """The server did not answer (connection refused/reset, timeout)."""


# ---- launch ---------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class SGLangServerConfig:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dtype: str = "bfloat16"
    mem_fraction_static: float = 0.7
    random_seed: int = 0
    fp32_lm_head: bool = True
    """Pass --enable-fp32-lm-head (pair it with FP32 logits in the trainer; paper Sec. 3.2)."""
    skip_tokenizer_init: bool = True
    return_routed_experts: bool = False
    """Pass --enable-return-routed-experts (the server then answers `return_routed_experts` requests)."""
    weight_version: str = "0"
    pause_mode: str = "in_place"
    """The pause mode of the engine that updates this server (`SGLangEngineConfig.pause_mode`). For
    in_place the launch adds `IN_PLACE_FLAGS` (see there): without them SGLang 0.5.23 reuses KV computed
    with the old weights for prompts sharing a prefix after an update, and tags one token early."""
    base_gpu_id: int = 0
    extra_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"SGLangServerConfig.tp_size={self.tp_size} must be >= 1")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"SGLangServerConfig.mem_fraction_static={self.mem_fraction_static} must be in (0, 1)")
        if self.dtype not in ("auto", "half", "float16", "bfloat16", "float", "float32"):
            raise ValueError(f"SGLangServerConfig.dtype={self.dtype!r} is not an SGLang --dtype choice")
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLangServerConfig.pause_mode={self.pause_mode!r} must be one of {PAUSE_MODES}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


IN_PLACE_FLAGS = {"--disable-radix-cache": "disable_radix_cache", "--disable-overlap-schedule": "disable_overlap_schedule"}
"""Launch flags (-> their `/server_info` keys) a server updated with `pause_mode=in_place` needs; measured on
SGLang 0.5.23 itself (docs/sglang_tests.md):
- --disable-radix-cache: in_place keeps requests in the running batch, so the cache cannot be flushed at the
  update (`/flush_cache` is refused while requests run) and later prompts sharing a prefix with earlier ones
  would reuse KV computed with the old weights (their log-probs off by 0.2-27 nats, tagged with the new
  version). Its cost: prompts shared by a group's samples are prefilled once per sample.
- --disable-overlap-schedule: with the overlap scheduler the batch after the pause is already launched with
  the old weights, so `weight_versions` tags one token early (the staleness accounting and routing replay
  read these tags)."""


def launch_command(cfg: SGLangServerConfig) -> list[str]:
    """`python -m sglang.launch_server ...` with SGLang 0.5.23's server flags."""
    cmd = [
        cfg.python, "-m", "sglang.launch_server",
        "--model-path", cfg.model_path,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--tp-size", str(cfg.tp_size),
        "--dtype", cfg.dtype,
        "--mem-fraction-static", str(cfg.mem_fraction_static),
        "--random-seed", str(cfg.random_seed),
        "--base-gpu-id", str(cfg.base_gpu_id),
        "--weight-version", cfg.weight_version,
        "--skip-server-warmup",
    ]  # fmt: skip
    if cfg.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    if cfg.fp32_lm_head:
        cmd.append("--enable-fp32-lm-head")
    if cfg.return_routed_experts:
        cmd.append("--enable-return-routed-experts")
    if cfg.pause_mode == "in_place":
        cmd += list(IN_PLACE_FLAGS)
    return cmd + list(cfg.extra_args)


class SGLangServer:
    """A server we launched (restartable) or attached to (url only)."""

    def __init__(self, *, url: str, config: SGLangServerConfig | None = None, tp_size: int = 1) -> None:
        self.url = url.rstrip("/")
        self.config = config
        self.tp_size = config.tp_size if config is not None else tp_size
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @classmethod
    def launch(cls, config: SGLangServerConfig, *, wait: bool = True) -> "SGLangServer":
        server = cls(url=config.url, config=config)
        server.start(wait=wait)
        return server

    @classmethod
    def attach(cls, url: str, *, tp_size: int = 1) -> "SGLangServer":
        return cls(url=url, tp_size=tp_size)

    @property
    def restartable(self) -> bool:
        return self.config is not None

    def start(self, *, wait: bool = True) -> None:
        import os

        if self.config is None:
            raise SGLangError(f"server {self.url} was attached, not launched: cannot start it")
        env = dict(os.environ, **self.config.env)
        # its own process group: SGLang forks a scheduler and a detokenizer, `stop` ends them all
        self.proc = subprocess.Popen(launch_command(self.config), env=env, start_new_session=True)
        if wait:
            self.wait_healthy(timeout_s=self.config.startup_timeout_s)

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        return SGLangClient(self.url, timeout_s=10.0).health_generate()

    def wait_healthy(self, *, timeout_s: float) -> None:
        """Poll GET /health_generate until 200 (slime's readiness check)."""
        deadline = time.monotonic() + timeout_s
        client = SGLangClient(self.url, timeout_s=10.0)
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerDown(f"SGLang server {self.url} exited with code {self.proc.returncode} during startup")
            if client.health_generate():
                return
            time.sleep(1.0)
        raise ServerDown(f"SGLang server {self.url} not healthy within {timeout_s}s")

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start(wait=True)

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `timeout_s`, and return once
        no process of the group remains (SGLang's scheduler and detokenizer included)."""
        import os
        import signal

        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    self.proc.wait()
                    return
                time.sleep(0.2)
        self.proc.wait(timeout=10)


# ---- HTTP client ----------------------------------------------------------------------------------
def sglang_sampling_params(sp: "SamplingParams", *, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
    """Our SamplingParams -> SGLang `sampling_params` (only keys SGLang accepts; unknown are rejected)."""
    return {
        "max_new_tokens": int(max_new_tokens if max_new_tokens is not None else sp.max_new_tokens),
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "stop_token_ids": [int(t) for t in sp.stop_token_ids],
        "sampling_seed": int(seed) % (1 << 63),
        "no_stop_trim": True,
    }


def parse_version(v: Any, *, initial: int = 0) -> int:
    """SGLang weight versions are strings; ours are ints ("default" = the launch weights)."""
    if v is None or v == "default":
        return initial
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SGLangError(f"weight version {v!r} is not an integer string") from None


def versions_per_token(meta: dict[str, Any], n: int, *, initial: int = 0) -> list[int]:
    """Expand meta_info.weight_versions spans ([start, end) over output tokens) to one per token."""
    spans = meta.get("weight_versions")
    if spans is None:
        return [parse_version(meta.get("weight_version"), initial=initial)] * n
    out: list[int | None] = [None] * n
    for s in spans:
        if not 0 <= s["start"] <= s["end"] <= n:
            raise SGLangError(f"weight_versions span {s} outside the {n} output tokens")
        for i in range(s["start"], s["end"]):
            out[i] = parse_version(s["version"], initial=initial)
    if any(v is None for v in out):
        raise SGLangError(f"weight_versions spans {spans} do not cover all {n} output tokens")
    return out  # type: ignore[return-value]


@dataclass
class GenerateResult:
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish: dict[str, Any]
    routed: Any = None
    """Decoded MoE expert ids, flat [input + output - 1, MoE layers, top-k] (`decode_routed_experts`)."""

    @property
    def finish_type(self) -> str:
        return self.finish.get("type", "") if self.finish else ""


@dataclass(frozen=True, kw_only=True)
class RouteLayout:
    """How to read `meta_info.routed_experts`: the HF model's layer count (SGLang's buffer has one
    column per hidden layer), its top-k, and the 0-based indices of its MoE layers (the columns kept,
    in this order: the trainer's route columns, `trainer/megatron/routing.py`)."""

    num_hidden_layers: int
    topk: int
    moe_layers: tuple[int, ...]
    num_experts: int = 0
    """Routed experts per MoE layer: ids are checked against it and kept as `route_id_dtype`
    (uint8 up to 256); 0: unknown (int32, unchecked)."""


def decode_routed_experts(b64: str, *, positions: int, layout: RouteLayout) -> "np.ndarray":
    """SGLang's base64 little-endian int32 [positions, num_hidden_layers, topk] routes -> the MoE
    layers' expert ids, a flat [positions, len(moe_layers), topk] numpy array of
    `route_id_dtype(layout.num_experts)` (decoded in numpy: no Python int per id)."""
    import base64

    import numpy as np

    from scalerl_mega.types import route_id_dtype

    raw = np.frombuffer(base64.b64decode(b64), dtype="<i4")
    per_pos = layout.num_hidden_layers * layout.topk
    if raw.size != positions * per_pos:
        raise SGLangError(f"meta_info.routed_experts has {raw.size} ids, expected {positions} positions x "
                          f"{layout.num_hidden_layers} layers x top-{layout.topk} = {positions * per_pos}")
    arr = raw.reshape(positions, layout.num_hidden_layers, layout.topk)[:, list(layout.moe_layers)]
    if layout.num_experts and arr.size and not 0 <= int(arr.min()) <= int(arr.max()) < layout.num_experts:
        raise SGLangError(f"meta_info.routed_experts has expert ids in [{arr.min()}, {arr.max()}], outside "
                          f"0..{layout.num_experts - 1} (num_experts={layout.num_experts}): a different model?")
    return arr.astype(route_id_dtype(layout.num_experts)).ravel()


def parse_generate_response(body: dict[str, Any], *, initial_version: int = 0, routes: RouteLayout | None = None,
                            input_len: int = 0) -> GenerateResult:
    """Pull output ids, output_token_logprobs ([logprob, token_id, text]), finish_reason and the
    per-token weight versions out of one /generate response object; with `routes`, also the decoded
    `meta_info.routed_experts` of the `input_len` + output - 1 positions."""
    meta = body.get("meta_info") or {}
    ids = body.get("output_ids")
    lps = meta.get("output_token_logprobs")
    if ids is None or lps is None:
        raise SGLangError("generate response lacks output_ids or meta_info.output_token_logprobs")
    if [int(e[1]) for e in lps] != list(ids):
        raise SGLangError("output_token_logprobs token ids disagree with output_ids")
    routed = None
    if routes is not None:
        if not meta.get("routed_experts"):
            raise SGLangError("generate response lacks meta_info.routed_experts (requested with "
                              "return_routed_experts): launch the server with --enable-return-routed-experts")
        routed = decode_routed_experts(meta["routed_experts"], positions=input_len + len(ids) - 1, layout=routes)
    return GenerateResult(
        output_ids=list(ids),
        logprobs=[float(e[0]) for e in lps],
        versions=versions_per_token(meta, len(ids), initial=initial_version),
        finish=meta.get("finish_reason") or {},
        routed=routed,
    )


def generate_body(*, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None,
                  return_routed_experts: bool) -> dict[str, Any]:
    """The /generate request body (SGLang 0.5.23 `GenerateReqInput`)."""
    body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True}
    if rid is not None:
        body["rid"] = rid
    if return_routed_experts:
        body["return_routed_experts"] = True
    return body


def _reply(method: str, url: str, endpoint: str, *, status: int, content: bytes, body_hook: BodyHook | None) -> Any:
    """An HTTP answer -> its JSON body (text if not JSON); SGLangError on a non-200 status or
    `success: false`. Shared by the blocking control client and the pooled /generate client."""
    import json

    try:
        data = json.loads(content) if content else None
    except ValueError:
        data = content.decode("utf-8", errors="replace")
    if body_hook is not None and status == 200:
        body_hook(endpoint, "response", data)
    if status != 200:
        raise SGLangError(f"{method} {url}{endpoint} -> HTTP {status}: {data}")
    if isinstance(data, dict) and data.get("success") is False:
        raise SGLangError(f"{method} {url}{endpoint} failed: {data.get('message')}")
    return data


class SGLangClient:
    """One server's HTTP endpoints. Every call has a timeout; errors raise SGLangError/ServerDown."""

    def __init__(self, url: str, *, timeout_s: float = 3600.0, body_hook: BodyHook | None = None) -> None:
        import requests

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.body_hook = body_hook
        self._session = requests.Session()

    def _call(self, method: str, endpoint: str, body: Any = None, *, timeout_s: float | None = None, params=None):
        import requests

        if body is not None and self.body_hook is not None:
            self.body_hook(endpoint, "request", body)
        try:
            r = self._session.request(
                method, self.url + endpoint, json=body, params=params, timeout=timeout_s or self.timeout_s
            )
        except (requests.ConnectionError, requests.Timeout) as e:
            raise ServerDown(f"{method} {self.url}{endpoint}: {e}") from e
        return _reply(method, self.url, endpoint, status=r.status_code, content=r.content, body_hook=self.body_hook)

    def health_generate(self, *, timeout_s: float = 30.0) -> bool:
        try:
            self._call("GET", "/health_generate", timeout_s=timeout_s)
            return True
        except SGLangError:
            return False

    def model_info(self) -> dict[str, Any]:
        return self._call("GET", "/model_info")

    def server_info(self) -> dict[str, Any]:
        return self._call("GET", "/server_info")

    def generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None,
                 return_routed_experts: bool = False) -> dict:
        return self._call("POST", "/generate", generate_body(input_ids=input_ids, sampling_params=sampling_params,
                                                           rid=rid, return_routed_experts=return_routed_experts))

    def pause_generation(self, mode: str) -> Any:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode={mode!r} must be one of {PAUSE_MODES}")
        return self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> Any:
        return self._call("POST", "/continue_generation", {"torch_empty_cache": False})

    def abort_all(self) -> Any:
        return self._call("POST", "/abort_request", {"abort_all": True})

    def flush_cache(self) -> Any:
        return self._call("POST", "/flush_cache")

    def begin_weight_update(self) -> Any:
        return self._call("POST", "/begin_weight_update", {"selector": "all"})

    def end_weight_update(self) -> Any:
        return self._call("POST", "/end_weight_update", {})

    def init_weights_update_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> Any:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return self._call("POST", "/init_weights_update_group", body)

    def destroy_weights_update_group(self, group_name: str) -> Any:
        return self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, meta: BucketMeta, *, group_name: str, flush_cache: bool) -> Any:
        body = {
            "names": meta.names,
            "dtypes": meta.dtypes,
            "shapes": meta.shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": False,
            "weight_version": str(meta.version),
            "load_format": meta.load_format,
        }
        return self._call("POST", "/update_weights_from_distributed", body)


# ---- pooled /generate client ----------------------------------------------------------------------
class AsyncHttp:
    """One asyncio event loop on one daemon thread carrying every /generate request of an engine over
    keep-alive HTTP/1.1 connections, pooled per server: N requests in flight cost N sockets and N
    coroutines, not N threads. Callers bound the connections (`AsyncGenerateClient.slots`: a
    connection is opened only when none is idle). `close()` cancels what is still running, closes
    every socket and joins the thread.

    A minimal client on asyncio streams rather than httpx: httpx 0.28's pool does work linear in the
    connections it holds for every request it starts and ends (measured: 250 concurrent requests 7 s,
    500 24 s on this machine), too slow at a fleet's 16,384; aiohttp is not a dependency. It speaks what
    SGLang's uvicorn answers: a JSON body with Content-Length, or chunked, or to EOF on `Connection: close`."""

    def __init__(self, *, timeout_s: float, name: str = "sglang-gen") -> None:
        import asyncio

        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._closed = False
        self._idle: dict[tuple[str, int], list] = {}
        self._open: set = set()  # every connection's writer
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro) -> Future:
        """Run `coro` on the loop; a concurrent Future of its result (cancel() cancels the task)."""
        import asyncio

        if self._closed:
            coro.close()
            raise RuntimeError("AsyncHttp is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def post_json(self, host: str, port: int, path: str, body: Any) -> tuple[int, bytes]:
        """POST `body` as JSON -> (status, response bytes). OSError, asyncio.IncompleteReadError or
        TimeoutError (after `timeout_s`) when the server is unreachable, drops the connection or is slow."""
        import asyncio
        import json

        data = json.dumps(body, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode("latin-1")
        async with asyncio.timeout(self.timeout_s):
            idle = self._idle.setdefault((host, port), [])
            while idle:
                reader, writer = idle.pop()
                if not (reader.at_eof() or writer.is_closing()):  # else the server closed it while idle
                    break
                self._open.discard(writer)
                writer.close()
            else:
                reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
                self._open.add(writer)
            return await self._exchange(reader, writer, head + data, key=(host, port))

    async def _exchange(self, reader, writer, request: bytes, *, key: tuple[str, int]) -> tuple[int, bytes]:
        keep = False
        try:
            writer.write(request)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            version, status = status_line.split(b" ", 2)[:2]
            headers = {}
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip().lower()
            if "content-length" in headers:
                content = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                parts = []
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    parts.append(await reader.readexactly(size))
                    await reader.readexactly(2)
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                content = b"".join(parts)
            else:
                content = await reader.read()
                headers["connection"] = "close"
            keep = version == b"HTTP/1.1" and headers.get("connection") != "close"
            return int(status), content
        finally:
            if keep and not self._closed:
                self._idle[key].append((reader, writer))
            else:
                self._open.discard(writer)
                writer.close()

    def close(self, *, timeout_s: float = 30.0) -> None:
        import asyncio

        if self._closed:
            return

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writers = list(self._open)
            for w in writers:
                w.close()
            await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
            self._open.clear()
            self._idle.clear()

        try:
            self.submit(shutdown()).result(timeout=timeout_s)
        finally:
            self._closed = True
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout_s)
            if not self.thread.is_alive():
                self.loop.close()


class AsyncGenerateClient:
    """One server's /generate on an engine's shared `AsyncHttp`, at most `max_inflight` requests at a
    time (the rest wait on a semaphore, not in a thread). Same bodies, body hook and errors as
    `SGLangClient.generate`: a refused or dropped connection or a timeout raises ServerDown, an
    error answer SGLangError."""

    def __init__(self, url: str, *, http: AsyncHttp, max_inflight: int, body_hook: BodyHook | None = None) -> None:
        import asyncio
        from urllib.parse import urlsplit

        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"SGLang server url {url!r}: the /generate client speaks plain http://host:port")
        self.host, self.port, self.prefix = parts.hostname, parts.port or 80, parts.path
        self.http = http
        self.body_hook = body_hook
        self.slots = asyncio.Semaphore(max_inflight)

    async def generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None,
                       return_routed_experts: bool = False) -> dict:
        import asyncio

        body = generate_body(input_ids=input_ids, sampling_params=sampling_params, rid=rid,
                             return_routed_experts=return_routed_experts)
        if self.body_hook is not None:
            self.body_hook("/generate", "request", body)
        try:
            status, content = await self.http.post_json(self.host, self.port, self.prefix + "/generate", body)
        except TimeoutError as e:
            raise ServerDown(f"POST {self.url}/generate: no answer within {self.http.timeout_s}s") from e
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:  # refused, reset, dropped, garbled
            raise ServerDown(f"POST {self.url}/generate: {type(e).__name__}: {e}") from e
        return _reply("POST", self.url, "/generate", status=status, content=content, body_hook=self.body_hook)


# ---- the RolloutEngine ----------------------------------------------------------------------------
@dataclass(kw_only=True)
class SGLangEngineConfig:
    pause_mode: str = "in_place"
    """in_place for PipelineRL; retract or abort for PPO-off-policy."""
    sync: WeightSyncConfig = field(default_factory=lambda: WeightSyncConfig(backend="nccl"))
    master_address: str = "127.0.0.1"
    max_inflight_per_server: int = 256
    """/generate requests kept in flight on each server (`rollout.max_batch_size`): the engine keeps
    up to servers x this many in flight (the fleet's running batch: 64 generators x 256 = 16,384),
    each a pooled connection on one event-loop thread; the rest wait client-side."""
    request_timeout_s: float = 3600.0
    control_timeout_s: float = 300.0
    seed: int = 0
    initial_version: int = 0
    max_restarts: int = 3
    routes: RouteLayout | None = None
    """Request and decode the MoE routes of every sample (`Completion.routes`); None: not requested."""
    model: Any = None
    """`rollout.local.LocalModelSpec` of the model the servers serve (HF config kwargs or a local HF
    directory): the names and shapes every update is checked against before the first bucket. None:
    the `model_path` of a launched server, or the one an attached server reports (/model_info) if it
    is a local directory with a config.json; without either there is no pre-send check."""

    def __post_init__(self) -> None:
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLangEngineConfig.pause_mode={self.pause_mode!r} must be one of {PAUSE_MODES}")
        if isinstance(self.max_inflight_per_server, bool) or not (
                isinstance(self.max_inflight_per_server, int) and self.max_inflight_per_server >= 1):
            raise ValueError(f"SGLangEngineConfig.max_inflight_per_server={self.max_inflight_per_server!r} "
                             "(rollout.max_batch_size) must be an integer >= 1")


class _HttpAnnouncer:
    def __init__(self, engine: "SGLangRolloutEngine", *, flush_cache: bool) -> None:
        self.engine = engine
        self.flush_cache = flush_cache

    def begin(self, version: int) -> None:
        return None

    def announce(self, meta: BucketMeta):
        eng = self.engine
        futs = [
            eng._ctl_pool.submit(
                c.update_weights_from_distributed, meta, group_name=eng.config.sync.group_name, flush_cache=self.flush_cache
            )
            for c in eng._ctl_clients
        ]

        def wait(timeout_s: float) -> None:
            _wait_futures(futs, what=f"update_weights_from_distributed bucket {meta.index}", timeout_s=timeout_s)

        return wait

    def end(self, version: int) -> None:
        return None


def _wait_futures(futs: list[Future], *, what: str, timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    out = []
    for f in futs:
        try:
            out.append(f.result(timeout=max(deadline - time.monotonic(), 0.001)))
        except TimeoutError:
            raise WeightSyncError(f"{what}: no reply within {timeout_s}s") from None
        except SGLangError as e:
            raise WeightSyncError(f"{what}: {e}") from e
    return out


class SGLangRolloutEngine:
    """`RolloutEngine` over one or more SGLang servers (HTTP /generate, distributed weight sync)."""

    def __init__(
        self, servers: list[SGLangServer], *, config: SGLangEngineConfig, body_hook: BodyHook | None = None
    ) -> None:
        if not servers:
            raise ValueError("SGLangRolloutEngine needs at least one server")
        self.servers = servers
        self.config = config
        self.body_hook = body_hook
        self.max_concurrency = config.max_inflight_per_server * len(servers)
        """/generate requests in flight at most: servers x `max_inflight_per_server`."""
        _ensure_open_files(self.max_concurrency + 256, what=f"{len(servers)} server(s) x "
                           f"SGLangEngineConfig.max_inflight_per_server={config.max_inflight_per_server} "
                           "(rollout.max_batch_size) connections")
        self._ctl_clients = [
            SGLangClient(s.url, timeout_s=config.control_timeout_s, body_hook=body_hook) for s in servers
        ]
        self._http = AsyncHttp(timeout_s=config.request_timeout_s)
        self._clients = [AsyncGenerateClient(s.url, http=self._http, max_inflight=config.max_inflight_per_server,
                                             body_hook=body_hook) for s in servers]
        self._ctl_pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(servers)), thread_name_prefix="sglang-ctl")
        self._lock = threading.Lock()
        self._inflight: dict[Future, tuple[int, GenRequest]] = {}
        self._finished: queue.SimpleQueue[Future] = queue.SimpleQueue()
        self._load = [0] * len(servers)
        self._done: list[Completion] = []
        self._group = None
        self._regroup = False
        self._stale: set[int] = set()
        self.version = config.initial_version
        self.last_sync_stats = None
        self._manifest: Any = None
        self._manifest_known = False
        self._in_place_checked = False

    # ---- RolloutEngine ---------------------------------------------------------------------------
    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int) -> None:
        from scalerl_mega.rollout.local import make_requests

        for req in make_requests(prompt, sampling, n=n, version=version, base_seed=self.config.seed):
            self._dispatch(req)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        finished = []
        with self._lock:
            busy = bool(self._inflight)
        if busy and not self._done and timeout_s > 0:
            try:  # requests finish in the loop thread, which queues their futures (`_dispatch`)
                finished.append(self._finished.get(timeout=timeout_s))
            except queue.Empty:
                pass
        while True:
            try:
                finished.append(self._finished.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            items = [(f, self._inflight.pop(f)) for f in finished if f in self._inflight]
            for _, (si, _) in items:
                self._load[si] -= 1
        for f, (si, req) in items:
            try:
                self._done.append(f.result())
            except ServerDown:
                self._recover(si)
                self._dispatch(req)
        out, self._done = self._done, []
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        from scalerl_mega.weight_sync import DistWeightSender, checked_update

        # checked whole before the servers are paused: a rejected update never pauses generation
        named_tensors = checked_update(named_tensors, self.manifest(), version=version)
        mode = self.config.pause_mode
        if mode == "in_place" and not self._in_place_checked:
            self._check_in_place_flags()
        t = self.config.control_timeout_s
        self._fan_out(lambda c: c.pause_generation(mode), what=f"pause_generation({mode})", timeout_s=t)
        self._fan_out(lambda c: c.begin_weight_update(), what="begin_weight_update", timeout_s=t)
        rejected = False
        try:
            if self._regroup:
                self._destroy_groups()
            if self._group is None:
                self._init_group()
            sender = DistWeightSender(
                self._group, announcer=_HttpAnnouncer(self, flush_cache=mode != "in_place"), config=self.config.sync
            )
            self.last_sync_stats = sender.send(named_tensors, version=version)
        except WeightSyncError:  # e.g. a rejected name/shape: resume below, never leave the servers paused
            rejected = True
            raise
        finally:
            self._fan_out(lambda c: c.end_weight_update(), what="end_weight_update", timeout_s=t)
            if rejected:
                self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)
        self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)
        self.version = version
        self._stale.clear()

    def _check_served_models(self, spec: Any) -> None:
        """Attached servers: compare the architecture in the config.json of the checkpoint each one
        reports serving (`/model_info` `model_path`, when readable here) with the model the updates are
        built for (`spec`, the trainer's twin); WeightSyncError naming the server and every differing
        field before anything is sent. Unreadable paths are logged and skipped."""
        import json
        import logging
        import os

        from scalerl_mega.model.hf_import import config_mismatches
        from scalerl_mega.weight_sync import WeightSyncError

        ours = {"model_type": "llama" if spec.arch == "llama" else "llama4_text", **spec.config}
        for server, client in zip(self.servers, self._ctl_clients):
            if server.config is not None:  # launched here from the trainer's own export
                continue
            path = str(client.model_info().get("model_path") or "")
            cfg_file = os.path.join(path, "config.json")
            if not os.path.isfile(cfg_file):
                logging.getLogger(__name__).info("SGLang server %s serves %r: no config.json readable here, its "
                                                 "architecture is not checked against the trainer's", server.url, path)
                continue
            with open(cfg_file) as f:
                bad = config_mismatches(json.load(f), ours, where=cfg_file)
            if bad:
                raise WeightSyncError(f"SGLang server {server.url} serves {path}, not the trainer's model "
                                      f"({len(bad)} field(s)): " + "; ".join(bad) + "; nothing was sent")

    def _check_in_place_flags(self) -> None:
        """in_place updates need every server launched with `IN_PLACE_FLAGS` (`/server_info`); raise
        SGLangError naming the server and the missing flags before anything is paused."""
        infos = self._fan_out(lambda c: c.server_info(), what="server_info", timeout_s=self.config.control_timeout_s)
        for server, info in zip(self.servers, infos):
            missing = [flag for flag, key in IN_PLACE_FLAGS.items() if not (info or {}).get(key)]
            if missing:
                raise SGLangError(
                    f"SGLang server {server.url} runs without {' '.join(missing)}: with "
                    f"SGLangEngineConfig.pause_mode='in_place' its updates would reuse KV of the old weights for "
                    f"shared prefixes and tag versions one token early; relaunch it with these flags "
                    f"(SGLangServerConfig.pause_mode='in_place' adds them) or use pause_mode 'retract'")
        self._in_place_checked = True

    def manifest(self) -> Any:
        """The served model's `WeightManifest` (cached), or None when it cannot be known here. With
        `config.model` given, attached servers are first checked to serve that architecture."""
        import logging
        import os

        from scalerl_mega.rollout.local import LocalModelSpec, model_manifest

        if not self._manifest_known:
            spec = self.config.model
            if spec is not None and spec.config is not None:
                self._check_served_models(spec)
            if spec is None:
                s0 = self.servers[0]
                path = s0.config.model_path if s0.config is not None else self._ctl_clients[0].model_info().get("model_path")
                if path and os.path.isfile(os.path.join(str(path), "config.json")):
                    spec = LocalModelSpec(path=str(path))
            if spec is None:
                logging.getLogger(__name__).warning(
                    "SGLang engine: the served model is unknown here (no SGLangEngineConfig.model, no local model_path); "
                    "weight updates are not checked before sending, a wrong tensor can leave earlier buckets applied")
            self._manifest = model_manifest(spec) if spec is not None else None
            self._manifest_known = True
        return self._manifest

    def pause(self, mode: str | None = None) -> None:
        m = mode or self.config.pause_mode
        self._fan_out(lambda c: c.pause_generation(m), what="pause_generation", timeout_s=self.config.control_timeout_s)

    def resume(self) -> None:
        self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=self.config.control_timeout_s)

    def close(self) -> None:
        from scalerl_mega.weight_sync import destroy_group

        self._http.close()  # cancels the requests still in flight, closes their sockets, joins the loop thread
        self._ctl_pool.shutdown(wait=False, cancel_futures=True)
        if self._group is not None:
            destroy_group(self._group)
            self._group = None

    # ---- internals -------------------------------------------------------------------------------
    def _fan_out(self, fn, *, what: str, timeout_s: float) -> list[Any]:
        futs = [self._ctl_pool.submit(fn, c) for c in self._ctl_clients]
        return _wait_futures(futs, what=what, timeout_s=timeout_s)

    def _destroy_groups(self) -> None:
        """Tear the weight-sync group down everywhere (after a server restart)."""
        from scalerl_mega.weight_sync import destroy_group

        name = self.config.sync.group_name
        futs = [self._ctl_pool.submit(c.destroy_weights_update_group, name) for c in self._ctl_clients]
        for f in futs:
            try:
                f.result(timeout=self.config.control_timeout_s)
            except SGLangError:
                pass  # the restarted server has no group
        if self._group is not None:
            destroy_group(self._group)
        self._group = None
        self._regroup = False

    def _init_group(self) -> None:
        """Fire /init_weights_update_group to all servers (no wait), join as rank 0, then wait."""
        from scalerl_mega.weight_sync import engine_rank_offsets, free_port, init_custom_process_group

        sync = self.config.sync
        world_size, offsets = engine_rank_offsets([s.tp_size for s in self.servers])
        port = free_port()
        futs = [
            self._ctl_pool.submit(
                c.init_weights_update_group,
                master_address=self.config.master_address,
                master_port=port,
                rank_offset=off,
                world_size=world_size,
                group_name=sync.group_name,
                backend=sync.backend,
            )
            for c, off in zip(self._ctl_clients, offsets)
        ]
        self._group = init_custom_process_group(
            backend=sync.backend,
            init_method=f"tcp://{self.config.master_address}:{port}",
            world_size=world_size,
            rank=0,
            group_name=sync.group_name,
            timeout_s=sync.timeout_s,
        )
        _wait_futures(futs, what="init_weights_update_group", timeout_s=sync.timeout_s)

    def _dispatch(self, req: GenRequest) -> None:
        with self._lock:
            # prefer servers holding the synced weights over ones relaunched since the last sync
            live = [i for i in range(len(self.servers)) if i not in self._stale] or list(range(len(self.servers)))
            si = min(live, key=lambda i: self._load[i])
            self._load[si] += 1
            fut = self._http.submit(self._agenerate(self._clients[si], req))
            self._inflight[fut] = (si, req)
        fut.add_done_callback(self._finished.put)

    def _recover(self, si: int) -> None:
        """A request failed with a dead connection: restart the server if we launched it (its
        in-flight requests fail the same way and are re-queued one by one by `poll`)."""
        server = self.servers[si]
        with self._lock:
            if server.alive():
                return
            if not server.restartable or server.restarts >= self.config.max_restarts:
                raise ServerDown(f"SGLang server {server.url} is down and cannot be restarted")
            server.restart()
            # its weight-sync rank left the group: rebuild the group (on every server) at the next
            # update. Until then new requests prefer servers holding the synced weights; if the
            # restarted server is the only one, it generates with its launch weights and its tokens
            # carry that version (weight_versions), so staleness accounting stays exact.
            self._regroup = True
            self._stale.add(si)

    def _generate(self, client: AsyncGenerateClient, req: GenRequest) -> Completion:
        """One sample, blocking (on the engine's loop thread): what `submit` runs for each request."""
        return self._http.submit(self._agenerate(client, req)).result()

    async def _agenerate(self, client: AsyncGenerateClient, req: GenRequest) -> Completion:
        async with client.slots:  # held across both requests of an interrupted sample
            return await self._sample(client, req)

    async def _sample(self, client: AsyncGenerateClient, req: GenRequest) -> Completion:
        sp = req.sampling
        t0 = time.monotonic()
        init = self.config.initial_version
        think_budget = sp.max_new_tokens
        interrupt = sp.interruption_at is not None and sp.interruption_at <= sp.max_new_tokens
        if interrupt:
            think_budget = sp.interruption_at
        layout = self.config.routes
        first = parse_generate_response(
            await client.generate(
                input_ids=req.prompt_ids,
                sampling_params=sglang_sampling_params(sp, seed=req.seed, max_new_tokens=think_budget),
                rid=req.rid, return_routed_experts=layout is not None,
            ),
            initial_version=init, routes=layout, input_len=len(req.prompt_ids),
        )
        routed = first.routed
        ids, lps, vers = first.output_ids, first.logprobs, first.versions
        mask = [1] * len(ids)
        reason = _finish(first.finish_type)
        interrupted_at = None
        if interrupt and reason == FinishReason.LENGTH and len(ids) >= think_budget:
            interrupted_at = len(ids)
            phrase = list(sp.interruption_ids)
            v = vers[-1] if vers else init
            ids, lps, vers, mask = ids + phrase, lps + [0.0] * len(phrase), vers + [v] * len(phrase), mask + [0] * len(phrase)
            reason = FinishReason.LENGTH  # no answer budget: truncated (types.FinishReason)
            if sp.answer_budget > 0:
                second = parse_generate_response(
                    await client.generate(
                        input_ids=req.prompt_ids + ids,
                        sampling_params=sglang_sampling_params(sp, seed=req.seed, max_new_tokens=sp.answer_budget),
                        rid=req.rid + "/answer", return_routed_experts=layout is not None,
                    ),
                    initial_version=init, routes=layout, input_len=len(req.prompt_ids) + len(ids),
                )
                if layout is not None:  # positions the first request covered keep its routes
                    import numpy as np

                    routed = np.concatenate([routed, second.routed[len(routed):]])
                ids, lps = ids + second.output_ids, lps + second.logprobs
                vers, mask = vers + second.versions, mask + [1] * len(second.output_ids)
                answer_end = _finish(second.finish_type)
                reason = FinishReason.INTERRUPTED if answer_end == FinishReason.STOP else answer_end
        return Completion(
            prompt_id=req.prompt_id,
            sample_index=req.sample_index,
            prompt_ids=list(req.prompt_ids),
            output_ids=ids,
            gen_logprobs=lps,
            weight_versions=vers,
            finish_reason=reason,
            loss_mask=mask,
            interrupted_at=interrupted_at,
            submitted_version=req.submitted_version,
            timings={"generate_s": time.monotonic() - t0},
            routes=None if layout is None else _routes(routed, layout, prompt_len=len(req.prompt_ids), versions=vers,
                                                       initial=init),
        )


def _ensure_open_files(needed: int, *, what: str) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `needed` (up to the hard limit): every request in
    flight holds a socket, and 1024 (a common soft default) is below a fleet's concurrency. ValueError
    naming `what` if the hard limit is lower."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(f"{what} need about {needed} open files, above this process's hard limit "
                         f"RLIMIT_NOFILE={hard} (`ulimit -Hn`): lower rollout.max_batch_size or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _routes(ids: Any, layout: RouteLayout, *, prompt_len: int, versions: list[int], initial: int) -> Routes:
    """`Routes` (ids only) of prompt_len + len(versions) - 1 positions: prompt positions before the last
    one get the first output token's version (the prefill's), position prompt_len - 1 + j the version
    of output token j."""
    first = versions[0] if versions else initial
    return Routes(num_layers=len(layout.moe_layers), topk=layout.topk, expert_ids=ids, weights=[],
                  versions=[first] * (prompt_len - 1) + list(versions))


def _finish(kind: str) -> FinishReason:
    return {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}.get(
        kind, FinishReason.ABORT
    )
