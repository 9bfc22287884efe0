"""`SGLangTestServer`: an emulation of SGLang 0.5.23's HTTP API over the local engine (`GenerationCore`;
CPU, no sglang import), in this process (see the package doc for who runs it).

It speaks the subset of SGLang 0.5.23's HTTP API that the client (`rollout/sglang/`) uses and enforces
the rules the real server enforces, so the production client code drives real generation:

* request bodies are validated (by an injected validator, e.g. the OpenAPI one) -> 422;
  unknown `sampling_params` keys -> 400;
* the weight-update endpoints with SGLang's rules (`weight_updates.py`);
* `/flush_cache` is refused while requests are running (or queued, unless paused); a refused
  flush after `update_weights_from_distributed(flush_cache=true)` fails the call;
* `/pause_generation` modes: abort (running requests return with finish_reason abort), retract
  (KV dropped, recomputed on continue), in_place (requests keep their stale KV);
* `meta_info.weight_versions` spans report the weight version of every output token;
* `return_routed_experts: true` (honoured when the server was started with `return_routed_experts`,
  SGLang's `--enable-return-routed-experts`): `meta_info.routed_experts` is base64 of a little-endian
  int32 [prompt + output - 1, num_hidden_layers, top-k] array of expert ids (dense layers 0), the
  core's recorded routes, as SGLang 0.5.23's tokenizer manager encodes its capturer's buffer.

Every handled call is appended to `events` (endpoint names, in order) for sequence checks.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
from scalerl_mega.sglang_emulation.weight_updates import HTTPError, JSONBody, WeightUpdateEndpoints
from scalerl_mega.types import Completion, FinishReason, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

RequestValidator = Callable[[str, Any, str], None]
"""validator(endpoint, body, method) raises on an invalid body."""

FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
           "the operation will not be performed.)\n")
"""SGLang 0.5.23's /flush_cache answer (tests/sglang/test_real_in_place.py compares the two servers)."""


class _Killed(Exception):
    pass


class SGLangTestServer(WeightUpdateEndpoints):
    def __init__(
        self,
        model: "PreTrainedModel",
        *,
        core_config: CoreConfig,
        request_validator: RequestValidator | None = None,
        model_path: str = "scalerl-test-model",
        weight_version: str = "0",
        sync_timeout_s: float = 60.0,
        request_timeout_s: float = 300.0,
        port: int = 0,
        step_delay_s: float = 0.0,
        return_routed_experts: bool = False,
    ) -> None:
        import dataclasses

        from scalerl_mega.rollout.hf_params import moe_layers

        self.return_routed_experts = return_routed_experts
        if return_routed_experts:
            core_config = dataclasses.replace(core_config, record_routes=True)
        self.core = GenerationCore(model, config=core_config)
        self.moe_layer_ids = [i for i, _ in moe_layers(model)]
        self.num_hidden_layers = int(model.config.num_hidden_layers)
        self.validator = request_validator
        self.model_path = model_path
        self.sync_timeout_s = sync_timeout_s
        self.request_timeout_s = request_timeout_s
        self.version_names = [weight_version]
        self.events: list[str] = []
        self.paused = False
        self.session_open = False
        self.group = None
        self.group_name: str | None = None
        self.receiver = None
        self._cv = threading.Condition()
        self._pending: dict[str, tuple[threading.Event, list[Completion]]] = {}
        self._stop = False
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.port = port
        self.step_delay_s = step_delay_s
        """Sleep between decode steps (a spawned server's tests use it to catch requests in flight)."""
        self.step_hook: Callable[[SGLangTestServer], None] | None = None
        """Called by the scheduler thread after every step, without the lock held: an in-process test holds the
        scheduler in a chosen state (e.g. 3 requests in flight) while it pauses, flushes or kills the server,
        instead of hoping a delay keeps them in flight long enough."""
        self.step_gate: Callable[[SGLangTestServer], bool] | None = None
        """While it returns False (checked under the lock whenever a request arrives), the scheduler does not
        step: a test lets requests that arrive one by one start together."""
        self.killed = False
        self._test_hold: tuple[threading.Event, threading.Event] | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                return None

            def _do(self, method: str) -> None:
                parsed = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    return self._send(400, {"error": "body is not JSON"})
                try:
                    status, out = server._route(method, parsed.path, body)
                except _Killed:
                    # a crashed server: drop the connection without an answer
                    self.close_connection = True
                    try:
                        self.connection.shutdown(2)
                    except OSError:
                        pass
                    return None
                except HTTPError as e:
                    status, out = e.status, e.body
                except Exception as e:  # noqa: BLE001 - a server error, reported as 500
                    status, out = 500, {"error": f"{type(e).__name__}: {e}"}
                self._send(status, out)

            def _send(self, status: int, obj: JSONBody) -> None:
                data = b"" if obj is None else json.dumps(obj).encode()  # SGLang: /health, /abort_request
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._do("get")

            def do_POST(self) -> None:
                self._do("post")

            def do_PUT(self) -> None:
                self._do("put")

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        t_http = threading.Thread(target=self._httpd.serve_forever, name="sglang-test-http", daemon=True)
        t_loop = threading.Thread(target=self._loop, name="sglang-test-scheduler", daemon=True)
        self._threads = [t_http, t_loop]
        for t in self._threads:
            t.start()
        return self.url

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=10)
        if self.group is not None:
            from scalerl_mega.weight_sync import destroy_group

            destroy_group(self.group)
            self.group = None

    def kill(self) -> None:
        """Simulate a crash: in-flight HTTP requests lose their connection, the port closes."""
        with self._cv:
            self.killed = True
            for ev, _ in self._pending.values():
                ev.set()
            self._pending.clear()
        self.stop()

    def __enter__(self) -> "SGLangTestServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold_when(self, pred: Callable[[SGLangTestServer], bool], *, start_when: Callable[[SGLangTestServer], bool]
                  | None = None) -> tuple[threading.Event, threading.Event]:
        """Hold the scheduler (as `step_hook`) after the first step at which `pred(self)` holds, until `release`
        is set or the server is killed or stopped: requests stay in flight as long as a test needs, on any
        machine load. HTTP endpoints (pause, flush, weight updates) keep working meanwhile. `start_when`:
        do not step at all until it first holds (`step_gate`, latched), e.g. until n requests have arrived.
        Returns (reached, release)."""
        reached, release = threading.Event(), threading.Event()
        if start_when is not None:
            opened = threading.Event()

            def gate(srv: SGLangTestServer) -> bool:
                if not opened.is_set() and start_when(srv):
                    opened.set()
                return opened.is_set()

            self.step_gate = gate

        def hook(srv: SGLangTestServer) -> None:
            if reached.is_set() or not pred(srv):
                return
            reached.set()
            while not release.wait(0.01) and not (srv.killed or srv._stop):
                pass

        self.step_hook = hook
        return reached, release

    # ---- scheduler ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (self.paused or not self.core.has_work()
                                          or (self.step_gate is not None and not self.step_gate(self))):
                    self._cv.wait(0.1)
                if self._stop:
                    return
                done = self.core.step()
                self._resolve(done)
            if self.step_hook is not None:
                self.step_hook(self)
            if self.step_delay_s:
                import time

                time.sleep(self.step_delay_s)

    def _resolve(self, done: list[Completion]) -> None:
        for c in done:
            entry = self._pending.pop(c.prompt_id, None)
            if entry is not None:
                entry[1].append(c)
                entry[0].set()

    # ---- routing -----------------------------------------------------------------------------------
    def _route(self, method: str, path: str, body: JSONBody) -> tuple[int, JSONBody]:
        routes = {
            ("get", "/health"): self._health,
            ("get", "/health_generate"): self._health_generate,
            ("get", "/model_info"): self._model_info,
            ("get", "/server_info"): self._server_info,
            ("post", "/generate"): self._generate,
            ("put", "/generate"): self._generate,
            ("post", "/pause_generation"): self._pause,
            ("post", "/continue_generation"): self._continue,
            ("post", "/flush_cache"): self._flush,
            ("get", "/flush_cache"): self._flush,
            ("post", "/abort_request"): self._abort,
            ("post", "/begin_weight_update"): self._begin,
            ("post", "/end_weight_update"): self._end,
            ("post", "/init_weights_update_group"): self._init_group,
            ("post", "/destroy_weights_update_group"): self._destroy_group,
            ("post", "/update_weights_from_distributed"): self._update_weights,
            ("get", "/_test/state"): self._test_state,
            ("post", "/_test/clear_events"): self._test_clear_events,
            ("post", "/_test/hold"): self._test_hold_at,
            ("post", "/_test/release"): self._test_release,
        }
        fn = routes.get((method, path))
        if fn is None:
            raise HTTPError(404, {"detail": f"{method.upper()} {path} not served by the test server"})
        if self.validator is not None and not path.startswith("/_test/"):
            try:
                self.validator(path, body, method)
            except Exception as e:  # noqa: BLE001 - FastAPI answers schema violations with 422
                raise HTTPError(422, {"detail": str(e).splitlines()[0]}) from None
        if not path.startswith("/_test/"):
            with self._cv:
                self.events.append(path)
        return fn(body or {})

    # ---- endpoints ---------------------------------------------------------------------------------
    def _test_state(self, body: dict) -> tuple[int, JSONBody]:
        """Introspection for tests driving a server in another process (not an SGLang endpoint)."""
        with self._cv:
            return 200, {
                "events": list(self.events),
                "num_running": self.core.num_running,
                "num_waiting": self.core.num_waiting,
                "output_lens": [len(r.output_ids) for r in self.core.rows],
                "version": self.version_names[self.core.version],
                "paused": self.paused,
                "held": self._test_hold is not None and self._test_hold[0].is_set(),
            }

    def _test_hold_at(self, body: dict) -> tuple[int, JSONBody]:
        """`{"min_output_len": n}`: hold the scheduler once a running request has n output tokens (`hold_when`)
        until `/_test/release`; `held` in `/_test/state` tells when it is."""
        n = int(body["min_output_len"])
        self._test_hold = self.hold_when(lambda srv: any(len(r.output_ids) >= n for r in srv.core.rows))
        return 200, {}

    def _test_release(self, body: dict) -> tuple[int, JSONBody]:
        if self._test_hold is not None:
            self._test_hold[1].set()
        return 200, {}

    def _test_clear_events(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            self.events.clear()
        return 200, {}

    def _health(self, body: dict) -> tuple[int, JSONBody]:
        return 200, None

    def _health_generate(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            if self.paused:
                raise HTTPError(503, {"error": "server is paused"})
            busy = self.core.num_running > 0
        if not busy:
            self._run([1], SamplingParams(max_new_tokens=1), seed=0, rid=f"health-{uuid.uuid4().hex}")
        return 200, {}

    def _model_info(self, body: dict) -> tuple[int, JSONBody]:
        return 200, {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,  # SGLang: --tokenizer-path defaults to --model-path
            "is_generation": True,
            "weight_version": self.version_names[self.core.version],
            "load_format": "auto",
            "architectures": [type(self.core.model).__name__],
        }

    def _server_info(self, body: dict) -> tuple[int, JSONBody]:
        # the subset of SGLang's server arguments the client reads: this server has no prefix cache and
        # no overlap scheduler (every token is computed after the previous one, with the weights of its tag)
        return 200, {"model_path": self.model_path, "disable_radix_cache": True, "disable_overlap_schedule": True,
                     "skip_tokenizer_init": True, "weight_version": self.version_names[self.core.version],
                     "enable_return_routed_experts": self.return_routed_experts}

    def _generate(self, body: dict) -> tuple[int, JSONBody]:
        from scalerl_mega.rollout.openapi_check import SAMPLING_PARAMS_FIELDS

        ids = body.get("input_ids")
        if not ids:
            raise HTTPError(400, {"error": "input_ids is required (server runs with --skip-tokenizer-init)"})
        batch = isinstance(ids[0], list)
        ids_list = ids if batch else [ids]
        sps = body.get("sampling_params") or {}
        sps_list = sps if isinstance(sps, list) else [sps] * len(ids_list)
        rids = body.get("rid")
        rid_list = rids if isinstance(rids, list) else [rids] * len(ids_list)
        if len(sps_list) != len(ids_list) or len(rid_list) != len(ids_list):
            raise HTTPError(400, {"error": "batch sizes of input_ids, sampling_params and rid differ"})
        jobs = []
        for i, (p, sp, rid) in enumerate(zip(ids_list, sps_list, rid_list)):
            unknown = sorted(set(sp) - set(SAMPLING_PARAMS_FIELDS))
            if unknown:
                raise HTTPError(400, {"error": f"unknown field `{unknown[0]}`"})
            params = SamplingParams(
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                stop_token_ids=list(sp.get("stop_token_ids") or []),
            )
            seed = sp.get("sampling_seed")
            seed = int(seed) if seed is not None else uuid.uuid4().int % (1 << 62)
            rid = rid if rid is not None else uuid.uuid4().hex
            if batch and isinstance(rids, str):
                rid = f"{rid}-{i}"
            jobs.append(self._submit(p, params, seed=seed, rid=rid))
        routed = bool(body.get("return_routed_experts")) and self.return_routed_experts
        out = [self._response(job, routed_experts=routed) for job in jobs]
        return 200, out if batch else out[0]

    def _submit(self, prompt: list[int], sp: SamplingParams, *, seed: int, rid: str):
        key = f"{rid}#{uuid.uuid4().hex}"
        # prompt_id carries the key back on the Completion (see _resolve)
        req = GenRequest(rid=key, prompt_id=key, sample_index=0, prompt_ids=list(prompt), sampling=sp, seed=seed)
        ev, box = threading.Event(), []
        with self._cv:
            try:
                self.core.add(req)
            except ValueError as e:
                raise HTTPError(400, {"error": str(e)}) from None
            self._pending[key] = (ev, box)
            self._cv.notify_all()
        return key, ev, box, len(prompt)

    def _run(self, prompt: list[int], sp: SamplingParams, *, seed: int, rid: str) -> Completion:
        key, ev, box, _ = self._submit(prompt, sp, seed=seed, rid=rid)
        if not ev.wait(self.request_timeout_s):
            raise HTTPError(500, {"error": f"request {rid} timed out"})
        return box[0]

    def _routed_experts(self, c: Completion) -> str:
        import base64

        import numpy as np

        r = c.routes
        arr = np.zeros((r.num_positions, self.num_hidden_layers, r.topk), dtype="<i4")
        arr[:, self.moe_layer_ids] = np.asarray(r.expert_ids, dtype="<i4").reshape(r.num_positions, r.num_layers, r.topk)
        return base64.b64encode(arr.tobytes()).decode("utf-8")

    def _response(self, job, *, routed_experts: bool = False) -> dict[str, Any]:
        key, ev, box, n_prompt = job
        if not ev.wait(self.request_timeout_s):
            raise HTTPError(500, {"error": f"request {key} timed out"})
        if self.killed or not box:
            raise _Killed()
        c: Completion = box[0]
        if c.finish_reason == FinishReason.STOP:
            finish = {"type": "stop", "matched": c.output_ids[-1]}
        elif c.finish_reason == FinishReason.LENGTH:
            finish = {"type": "length", "length": len(c.output_ids)}
        else:
            finish = {"type": "abort", "message": "Abort in progress", "status_code": 200, "err_type": None}
        spans: list[dict[str, Any]] = []
        for i, v in enumerate(c.weight_versions):
            name = self.version_names[v]
            if spans and spans[-1]["version"] == name:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": name, "start": i, "end": i + 1})
        if not spans:
            spans = [{"version": self.version_names[self.core.version], "start": 0, "end": 0}]
        extra = {"routed_experts": self._routed_experts(c)} if routed_experts and c.routes is not None else {}
        return {
            "output_ids": c.output_ids,
            "meta_info": {
                **extra,
                "id": key.split("#")[0],
                "finish_reason": finish,
                "prompt_tokens": n_prompt,
                "completion_tokens": len(c.output_ids),
                "cached_tokens": 0,
                "reasoning_tokens": 0,
                "num_retractions": 0,
                "weight_version": spans[-1]["version"],
                "weight_versions": spans,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(c.gen_logprobs, c.output_ids)],
                "input_token_logprobs": [],
                "output_token_logprobs_length": len(c.output_ids),
            },
        }

    def _pause(self, body: dict) -> tuple[int, JSONBody]:
        mode = body.get("mode", "abort")
        with self._cv:
            if mode == "abort":
                self._resolve(self.core.abort_all())
            elif mode == "retract":
                self.core.retract_all()
            self.paused = True
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def _continue(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            self.paused = False
            self._cv.notify_all()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    def _flush_refused(self) -> bool:
        return self.core.num_running > 0 or (not self.paused and self.core.num_waiting > 0)

    def _flush(self, body: dict) -> tuple[int, JSONBody]:
        with self._cv:
            if self._flush_refused():
                raise HTTPError(400, "Cache not flushed because there are pending requests.")
        return 200, FLUSHED

    def _abort(self, body: dict) -> tuple[int, JSONBody]:
        if body.get("abort_all"):
            with self._cv:
                self._resolve(self.core.abort_all())
        return 200, None
