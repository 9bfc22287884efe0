"""An OpenAI chat-completions endpoint per episode, in front of the engine, that records exact ids.

Existing agent code (`fn(base_url, task) -> reward`, written against any OpenAI client) talks to
`AgentEndpoint.open_episode(id)`'s base url, `http://127.0.0.1:PORT/episodes/<id>/v1`. Every
`POST .../chat/completions` becomes one engine call on exact ids, recorded for `close_episode(id)`:

- a call whose messages are the previous call's messages + the assistant reply the endpoint returned (same
  content and tool calls) + new non-assistant messages (tool results, user turns) is sent as the previous
  call's prompt ids + its generated ids + the ids the chat template adds for the new messages, computed by
  `episodes/template.py`'s `ChatSplicer` exactly as the episode driver computes them: the rest of the assistant
  turn's closing (all of it after a `max_tokens` cut or a stop on another id than the closing's first), then the
  difference between templating the history with and without the new messages (checked to be prefix-preserving
  at the id level). The generated ids are never decoded and re-encoded, so `episodes/stitch.py` joins such
  calls into one sample;
- any other call (the first, an edited history, a template that is not prefix-preserving for these messages)
  is templated afresh, and so starts a new sample when stitched (a broken prefix, counted there).

Replies carry Hermes/Qwen3 `<tool_call>` blocks as OpenAI `tool_calls` (`episodes/tool_calls.py`). Bad input
gets an OpenAI-style error body (`{"error": {"message", "type", "param", "code"}}`) with a 4xx status; a
failure of the engine call a 5xx with the exception's message; no traceback reaches the client and no request
stops the server. Served: `messages` (roles system/developer/user/assistant/tool, text content or text
parts, `tool_calls` on assistant messages), `tools`, `tool_choice` "auto"/"none", `max_tokens` /
`max_completion_tokens`, `temperature`, `top_p`, `seed`, `n` = 1, `stop` strings of one token each
(exact ids rule out cutting inside a token) and `stream` (the finished completion sent as server-sent events,
`stream_options.include_usage` honoured: agent SDKs that always stream, such as verifiers' chat program, work
unchanged).

The server is `http.server`'s threaded server on its own thread (one thread per request, HTTP/1.0: one
request per connection); leaving the context stops it, unblocks idle connections and joins every thread
(a call inside `generate` is waited for).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from scalerl_mega.episodes.calls import GenerateRequest, GenerateResult, RecordedCall
from scalerl_mega.episodes.coverage import UnknownIds
from scalerl_mega.episodes.template import ChatSplicer, TemplateError
from scalerl_mega.episodes.tool_calls import parse_tool_calls, same_calls, template_tool_calls
from scalerl_mega.jsonvalue import JSON
from scalerl_mega.types import FinishReason, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
Tools = list[dict[str, JSON]] | None

MAX_BODY_BYTES = 32 << 20
_EPISODE_ID = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")
_PATH = re.compile(r"^/episodes/([^/]+)/v1/(chat/completions|models)/?$")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class RequestError(Exception):
    """A request the endpoint refuses: sent as an OpenAI error body with `status`."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code


@dataclass
class _Turn:
    """A served call, as the next call is matched against it."""

    messages: list[dict[str, JSON]]
    """The call's messages in template form."""
    tools: Tools
    reply: dict[str, JSON]
    """The assistant reply in template form."""
    ids: list[int]
    """prompt ids + generated ids."""
    stopped: bool
    """The generation ended with a stop token (the turn's closing then continues after it)."""


@dataclass
class _Episode:
    calls: list[RecordedCall] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)


class AgentEndpoint:
    """The per-episode OpenAI endpoint (module doc). `tokenizer` is an HF tokenizer with a chat template;
    `generate` a blocking `GenerateRequest -> GenerateResult` (the episode driver's bridge to the engines;
    it may be called from several request threads at once). `stop_token_ids` end every generation (default:
    the tokenizer's EOS); `default_max_tokens` applies when a request names no limit; `chat_template` (Jinja
    source) replaces the tokenizer's own template; `max_seq_len` (0: none) is the engine's longest sequence: a
    call whose prompt plus `max_tokens` exceeds it is answered 400 (`context_length_exceeded`), one that names no
    limit generates what fits; `on_refused(episode_id)` is told of every call of an open episode answered with a
    4xx."""

    def __init__(self, *, tokenizer: "PreTrainedTokenizerBase", generate: Callable[[GenerateRequest], GenerateResult],
                 host: str = "127.0.0.1", port: int = 0, stop_token_ids: list[int] | None = None,
                 default_max_tokens: int = 512, model_name: str = "scalerl-policy",
                 chat_template: str | None = None, max_seq_len: int = 0,
                 on_refused: Callable[[str], None] | None = None) -> None:
        if default_max_tokens < 1:
            raise ValueError(f"AgentEndpoint default_max_tokens={default_max_tokens} must be >= 1")
        if stop_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            stop_token_ids = [eos] if isinstance(eos, int) else []
        self.tokenizer, self.generate = tokenizer, generate
        self.host, self.port = host, port
        self.stop_token_ids = list(stop_token_ids)
        self.default_max_tokens = default_max_tokens
        self.model_name = model_name
        self.max_seq_len, self.on_refused = int(max_seq_len), on_refused
        self.splicer = ChatSplicer(tokenizer, source=chat_template, stop_token_ids=self.stop_token_ids, check=False)
        self.coverage = UnknownIds(tokenizer)  # one per endpoint (per run): it warns once
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifetime ----------------------------------------------------------------------------------
    def __enter__(self) -> "AgentEndpoint":
        self._server = _Server((self.host, self.port), _Handler)
        self._server.endpoint = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"agent-endpoint:{self.port}",
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving: no new connection is accepted, idle ones are shut, running calls are waited for."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.shut_connections()
        server.server_close()  # joins the request threads (block_on_close)
        self._thread.join()

    # ---- episodes ----------------------------------------------------------------------------------
    def open_episode(self, episode_id: str) -> str:
        """Start recording `episode_id`; returns its base url (ends in /v1)."""
        if self._server is None:
            raise RuntimeError("AgentEndpoint.open_episode: the endpoint is not serving (use it as a context manager)")
        if not _EPISODE_ID.match(episode_id):
            raise ValueError(f"episode id {episode_id!r} must be 1-200 characters of letters, digits and ._~-")
        with self._lock:
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already open")
            self._episodes[episode_id] = _Episode()
        return f"http://{self.host}:{self.port}/episodes/{episode_id}/v1"

    def close_episode(self, episode_id: str) -> list[RecordedCall]:
        """Stop serving `episode_id` (its later requests get 404) and return its calls in the order they finished."""
        with self._lock:
            ep = self._episodes.pop(episode_id, None)
        if ep is None:
            raise ValueError(f"episode {episode_id!r} is not open")
        return ep.calls

    def refused(self, episode_id: str) -> None:
        """A call of `episode_id` was answered with a 4xx: `on_refused` is told when the episode is open."""
        with self._lock:
            known = episode_id in self._episodes
        if known and self.on_refused is not None:
            self.on_refused(episode_id)

    # ---- one call ----------------------------------------------------------------------------------
    def models(self, episode_id: str) -> dict[str, JSON]:
        self._episode(episode_id)
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "scalerl-mega"}]}

    def chat_completion(self, episode_id: str, body: object) -> dict[str, JSON]:
        """Serve one parsed request body (RequestError for bad input)."""
        self._episode(episode_id)
        req = _parse_request(body, default_max_tokens=self.default_max_tokens)
        sampling = SamplingParams(max_new_tokens=req["max_tokens"], temperature=req["temperature"],
                                  top_p=req["top_p"], seed=req["seed"],
                                  stop_token_ids=sorted(set(self.stop_token_ids) | set(self._stop_ids(req["stop"]))))
        prompt_ids, templated, templated_messages = self._prompt_ids(episode_id, req["messages"], req["tools"])
        sampling.max_new_tokens = self._fitting(len(prompt_ids), req["max_tokens"], given=req["max_tokens_given"])
        request = GenerateRequest(prompt_ids=prompt_ids, sampling=sampling, episode_id=episode_id)
        try:
            result = self.generate(request)
        except ValueError as e:
            raise RequestError(f"the engine refused the call: {e}") from None
        except Exception as e:  # noqa: BLE001 - the client gets the message, the log the traceback
            log.exception("agent endpoint: generate failed for episode %s", episode_id)
            raise RequestError(f"the engine call failed: {type(e).__name__}: {e}", status=500,
                               kind="server_error") from None
        stopped = bool(result.output_ids) and result.output_ids[-1] in sampling.stop_token_ids and \
            result.finish_reason in (FinishReason.STOP, FinishReason.INTERRUPTED)
        shown = result.output_ids[:-1] if stopped else result.output_ids
        text = self.tokenizer.decode(shown, skip_special_tokens=False)
        content, tool_calls = parse_tool_calls(text, id_seed=f"{episode_id}/{len(prompt_ids)}")
        reply_t = {"role": "assistant", "content": content or ""}
        if tool_calls:
            reply_t["tool_calls"] = template_tool_calls(tool_calls, where="reply")
        call = RecordedCall.of(request, result)
        call.messages = [*req["messages"], reply_t]
        # tokenizer coverage of what the endpoint templated, once the model has seen it (episodes/coverage.py)
        call.unknown_ids = self.coverage.count(templated, templated_messages)
        call.seen = self.coverage.seen(templated)
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is not None:  # closed meanwhile: the call is not recorded
                ep.calls.append(call)
                ep.turns.append(_Turn(messages=req["messages"], tools=req["tools"], reply=reply_t,
                                      ids=prompt_ids + list(result.output_ids), stopped=stopped))
        finish = {FinishReason.LENGTH: "length", FinishReason.ABORT: "length"}.get(result.finish_reason, "stop")
        message: dict[str, JSON] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
            finish = "tool_calls" if finish == "stop" else finish
        n_out = len(result.output_ids)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": req["model"] or self.model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                          "total_tokens": len(prompt_ids) + n_out}}

    def _fitting(self, n_prompt: int, max_tokens: int, *, given: bool) -> int:
        """`max_tokens` within the engine's sequence length: refused (400) when the call named it and it does not
        fit, else cut to what fits."""
        room = self.max_seq_len - n_prompt if self.max_seq_len else max_tokens
        if max_tokens <= room:
            return max_tokens
        if given or room < 1:
            raise RequestError(f"this model's maximum context length is {self.max_seq_len} tokens; the request has "
                               f"{n_prompt} tokens in the messages and asks for {max_tokens if given else 'at least 1'}"
                               f" in the completion (max_tokens): shorten the messages or lower max_tokens",
                               param="max_tokens" if given and room >= 1 else "messages",
                               code="context_length_exceeded")
        return room

    def _episode(self, episode_id: str) -> _Episode:
        with self._lock:
            ep = self._episodes.get(episode_id)
        if ep is None:
            raise RequestError(f"episode {episode_id!r} is not open on this endpoint", status=404,
                               kind="not_found_error")
        return ep

    def _stop_ids(self, stop: list[str]) -> list[int]:
        out = []
        for i, s in enumerate(stop):
            ids = self.tokenizer.encode(s, add_special_tokens=False)
            if len(ids) != 1:
                raise RequestError(f"stop[{i}]={s!r} is {len(ids)} tokens; only stop strings of exactly one token "
                                   f"are served (the endpoint keeps the engine's exact ids)", param="stop")
            out.append(ids[0])
        return out

    def _prompt_ids(self, episode_id: str, messages: list[dict[str, JSON]],
                    tools: Tools) -> tuple[list[int], list[int], list[dict[str, JSON]]]:
        """The previous call's ids + the template's ids for the new messages when the call extends it,
        else the messages templated afresh (module doc); with the ids templated here and their messages (what
        the tokenizer-coverage count looks at)."""
        with self._lock:
            turns = list(self._episodes[episode_id].turns) if episode_id in self._episodes else []
        for turn in reversed(turns):
            n = len(turn.messages)
            new = messages[n + 1:]
            if (len(messages) <= n + 1 or turn.tools != tools or messages[:n] != turn.messages
                    or not _same_reply(messages[n], turn.reply) or any(m["role"] == "assistant" for m in new)):
                continue
            try:
                env = self._template(self.splicer.environment_ids, [*turn.messages, turn.reply], new, tools=tools,
                                     stopped_with=turn.ids[-1] if turn.stopped else None)
            except TemplateError:  # not prefix-preserving for these messages: templated afresh below
                break
            return turn.ids + env, env, new
        opening = self._template(self.splicer.opening, messages, tools=tools)
        return opening, opening, messages

    @staticmethod
    def _template(fn: Callable[..., list[int]], *args: object, **kwargs: object) -> list[int]:
        """`fn` of the splicer; a template error other than TemplateError is the request's (e.g. a role the
        template refuses)."""
        try:
            return fn(*args, **kwargs)
        except TemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - any Jinja/template error: a 400 naming it
            raise RequestError(f"the chat template refused these messages: {type(e).__name__}: {e}",
                               param="messages") from None


def _same_reply(sent: dict[str, JSON], reply: dict[str, JSON]) -> bool:
    return (sent["role"] == "assistant" and (sent.get("content") or "") == reply["content"]
            and same_calls(sent.get("tool_calls") or [], reply.get("tool_calls") or []))


# ---- request validation ----------------------------------------------------------------------------
def _parse_request(body: object, *, default_max_tokens: int) -> dict[str, JSON]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    n = body.get("n", 1)
    if n is not None and (_is_bool(n) or n != 1):
        raise RequestError(f"n={n!r}: this endpoint serves n=1 only (one sample per call)", param="n")
    stream = body.get("stream")
    if stream is not None and not _is_bool(stream):
        raise RequestError(f"stream={stream!r} must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice={choice!r} is not served (only 'auto' or 'none')", param="tool_choice")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    given = limit is not None
    if limit is None:
        limit = default_max_tokens
    elif _is_bool(limit) or not isinstance(limit, int) or limit < 1:
        raise RequestError(f"max_tokens={limit!r} must be an integer >= 1", param="max_tokens")
    temperature = _number(body, "temperature", 1.0, lo=0.0, hi=2.0, lo_open=False)
    top_p = _number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True)
    seed = body.get("seed")
    if seed is not None and (_is_bool(seed) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise RequestError(f"seed={seed!r} must be a non-negative integer", param="seed")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them", param="stop")
    return {"model": model, "max_tokens": limit, "max_tokens_given": given, "temperature": temperature, "top_p": top_p, "seed": seed,
            "stop": stop, "tools": _tools(body.get("tools")), "messages": _messages(body.get("messages"))}


def stream_events(completion: dict[str, JSON], *, include_usage: bool) -> list[dict[str, JSON]]:
    """A finished `chat.completion` as OpenAI's `chat.completion.chunk` events for `stream=true`: the whole
    message in one delta (tool calls with their `index`), then the finish reason, then (`stream_options.
    include_usage`) the usage with no choices. The call is generated whole first, so streaming changes only
    the wire form, never the ids."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, JSON] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
    head = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    events = [head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]},
              head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"],
                                   "logprobs": None}]}]
    if include_usage:
        events.append(head | {"choices": [], "usage": completion["usage"]})
    return events


def _is_bool(x: object) -> bool:
    return isinstance(x, bool)


def _number(body: dict[str, JSON], key: str, default: float, *, lo: float, hi: float, lo_open: bool) -> float:
    x = body.get(key)
    if x is None:
        return default
    ok = isinstance(x, (int, float)) and not _is_bool(x) and (lo < x if lo_open else lo <= x) and x <= hi
    if not ok:
        raise RequestError(f"{key}={x!r} must be a number in {'(' if lo_open else '['}{lo}, {hi}]", param=key)
    return float(x)


def _tools(tools: object) -> list[dict[str, JSON]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {'type': 'function', 'function': {...}} objects", param="tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                               param="tools")
    return tools or None


def _messages(messages: object) -> list[dict[str, JSON]]:
    """The messages in template form: role, text content, tool_calls (arguments parsed) on assistant ones."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object", param="messages")
        role = m.get("role")
        if role not in _ROLES:
            raise RequestError(f"{where}.role={role!r} must be one of {sorted(_ROLES)}", param="messages")
        msg: dict[str, JSON] = {"role": _ROLES[role], "content": _content(m.get("content"), where=where)}
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be a list, on an assistant message", param="messages")
            try:
                if calls:
                    msg["tool_calls"] = template_tool_calls(calls, where=where)
            except ValueError as e:
                raise RequestError(str(e), param="messages") from None
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _content(content: object, *, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError(f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': ...}} "
                                   f"(only text is served)", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string, null or a list of text parts", param="messages")


# ---- HTTP ------------------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close joins them
    request_queue_size = 4096
    """The listen backlog (socketserver's default is 5): every episode's agent may connect at once
    (`env.concurrency`), and connections past the backlog are refused while the accept loop waits for the GIL."""
    endpoint: AgentEndpoint

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def track(self, sock: socket.socket, *, add: bool) -> None:
        with self._open_lock:
            (self._open.add if add else self._open.discard)(sock)

    def shut_connections(self) -> None:
        """Unblock request threads waiting on an idle client (their read returns end-of-file)."""
        with self._open_lock:
            socks = list(self._open)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RD)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 120  # an idle connection does not hold a thread forever

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (malformed request line, unknown method) as OpenAI error bodies."""
        self.close_connection = True
        self._reply(code, {"error": {"message": message or explain or "bad request", "type": "invalid_request_error",
                                     "param": None, "code": None}})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        log.debug("agent endpoint: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._serve(post=False)

    def do_POST(self) -> None:  # noqa: N802
        self._serve(post=True)

    def _serve(self, *, post: bool) -> None:
        m = _PATH.match(self.path.split("?", 1)[0])
        try:
            if m is None:
                raise RequestError(f"no route {self.path!r}: the endpoint serves /episodes/<id>/v1/chat/completions "
                                   f"and /episodes/<id>/v1/models", status=404, kind="not_found_error")
            episode_id, what = m.groups()
            if (what == "models") == post:
                raise RequestError(f"{self.command} is not allowed on {self.path!r}", status=405)
            if what == "models":
                return self._reply(200, self.server.endpoint.models(episode_id))
            body = self._body()
            completion = self.server.endpoint.chat_completion(episode_id, body)
            if body.get("stream") is True:  # validated by chat_completion
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return self._reply_events(stream_events(completion, include_usage=usage))
            self._reply(200, completion)
        except RequestError as e:
            if e.status < 500 and m is not None:
                self.server.endpoint.refused(m.group(1))
            self._reply(e.status, {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}})
        except Exception as e:  # noqa: BLE001 - never a traceback to the client; the log has it
            log.exception("agent endpoint: internal error on %s", self.path)
            self._reply(500, {"error": {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                                        "param": None, "code": None}})

    def _body(self) -> JSON:
        size = self.headers.get("Content-Length")
        if size is None or not size.strip().isdigit():
            raise RequestError(f"Content-Length header {size!r} must be a byte count", status=411)
        if int(size) > MAX_BODY_BYTES:
            raise RequestError(f"request body of {int(size)} bytes exceeds {MAX_BODY_BYTES}", status=413)
        raw = self.rfile.read(int(size))
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise RequestError(f"the request body is not valid JSON ({e})") from None

    def _reply_events(self, events: list[dict[str, JSON]]) -> None:
        """A whole completion as server-sent events (`data: <chunk>` each, then `data: [DONE]`)."""
        data = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._reply(200, data.encode("utf-8"), content_type="text/event-stream")

    def _reply(self, status: int, obj: dict[str, JSON] | bytes, *, content_type: str = "application/json") -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away
            self.close_connection = True
