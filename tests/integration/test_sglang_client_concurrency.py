"""The SGLang client's /generate concurrency: servers x `max_inflight_per_server`
requests in flight at once on pooled connections of one event-loop thread (no thread per request),
against the model-free loopback stub (`tests/support/stub_server.py`). No timing: the stub's barrier answers
nothing until the expected number of requests is in flight together."""

from __future__ import annotations

import threading
import time

import pytest

from scalerl_mega.rollout.local import make_requests
from scalerl_mega.rollout.sglang import (
    SGLangEngineConfig,
    SGLangError,
    SGLangRolloutEngine,
    SGLangServer,
    ServerDown,
)
from scalerl_mega.rollout.sglang.engine import _ensure_open_files
from tests.support.stub_server import StubGenerateServer, expected_output
from scalerl_mega.weight_sync import WeightSyncConfig
from scalerl_mega.types import FinishReason, Prompt, SamplingParams


def _engine(stub: StubGenerateServer, **kw) -> SGLangRolloutEngine:
    return SGLangRolloutEngine([SGLangServer.attach(u) for u in stub.urls],
                               config=SGLangEngineConfig(sync=WeightSyncConfig(backend="gloo"), **kw))


def _prompt(i: int) -> Prompt:
    return Prompt(prompt_id=f"p{i}", text="", task="synthetic", gold="0", token_ids=[i % 97, 3, (7 * i) % 11])


def _collect(engine, n, *, deadline_s=180.0, stub=None):
    out, deadline = [], time.monotonic() + deadline_s
    while len(out) < n:
        if time.monotonic() > deadline:
            seen = f"; the stub saw at most {stub.peak} in flight at once" if stub is not None else ""
            raise AssertionError(f"got {len(out)}/{n} completions{seen}")
        out += engine.poll(0.5)
    return out


def _gen_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sglang-gen")]


def test_2000_requests_are_all_in_flight_at_once():
    """4 servers x 500 = 2,000 requests in flight together: the stub releases none before the 2,000th
    arrives, so completing at all proves it. Results are the stub's per request (seed per sample),
    and the process gained one thread (the loop), not one per request."""
    N, SERVERS = 2000, 4
    stub = StubGenerateServer(num_ports=SERVERS, barrier=N).start()
    before = threading.active_count()
    engine = _engine(stub, max_inflight_per_server=N // SERVERS, seed=5)
    try:
        assert engine.max_concurrency == N
        sp = SamplingParams(max_new_tokens=3)
        reqs = {}
        for i in range(N // 4):
            engine.submit(_prompt(i), sp, n=4, version=0)
            for r in make_requests(_prompt(i), sp, n=4, version=0, base_seed=5):
                reqs[(r.prompt_id, r.sample_index)] = r
        done = _collect(engine, N, stub=stub)
        assert stub.peak == N and stub.served == N
        # one loop thread, not one per request (the stub's own handler threads come and go: only a bound is exact)
        assert len(_gen_threads()) == 1 and threading.active_count() - before < 50
        assert sorted((c.prompt_id, c.sample_index) for c in done) == sorted(reqs)
        for c in done:
            r = reqs[(c.prompt_id, c.sample_index)]
            ids, lps = expected_output(r.prompt_ids, seed=r.seed, max_new_tokens=3)
            assert (c.output_ids, c.gen_logprobs) == (ids, lps)
            assert c.weight_versions == [0, 0, 0] and c.finish_reason == FinishReason.LENGTH
        # every server got its share: least-loaded dispatch over the 4 ports
        assert len({r.seed for r in reqs.values()}) == N
    finally:
        engine.close()
        stub.stop()
    assert not _gen_threads()


def test_per_server_limit_is_respected():
    """2 servers x 5: the stub answers in gates of 10 arrivals, so each gate opens only with exactly
    10 in flight, never more (a client without the limit would send all 30 at once); the 10 pooled
    connections carry all 30 requests."""
    stub = StubGenerateServer(num_ports=2, barrier=10).start()
    engine = _engine(stub, max_inflight_per_server=5)
    try:
        engine.submit(_prompt(1), SamplingParams(max_new_tokens=2), n=30, version=0)
        assert len(_collect(engine, 30, stub=stub)) == 30
        assert stub.peak == 10 and stub.served == 30
        assert stub.accepted == 10  # keep-alive: the 2 x 5 connections carried all 30 requests
    finally:
        engine.close()
        stub.stop()


def test_close_cancels_in_flight_requests_and_leaks_no_thread_or_socket():
    import os

    import psutil

    stub = StubGenerateServer(num_ports=2).start()
    stub.hold()
    engine = _engine(stub, max_inflight_per_server=50)
    try:
        engine.submit(_prompt(2), SamplingParams(max_new_tokens=4), n=120, version=0)
        deadline = time.monotonic() + 60
        while stub.in_flight < 100:  # the limit: 2 x 50 reach the server, 20 wait client-side
            assert time.monotonic() < deadline, f"only {stub.in_flight} requests reached the stub"
            time.sleep(0.01)
        assert stub.open_connections == 100 and engine.poll(0.0) == []
        inflight = list(engine._inflight)
        engine.close()
        assert all(f.cancelled() for f in inflight) and not _gen_threads()
        me = psutil.Process(os.getpid())
        ports = set(stub.ports)
        assert not [c for c in me.net_connections("tcp") if c.raddr and c.raddr.port in ports
                    and c.status == psutil.CONN_ESTABLISHED]
        assert stub.served == 0
    finally:
        stub.release()
        engine.close()
        stub.stop()


def test_timeout_and_error_answers():
    """A request past `request_timeout_s` raises ServerDown (as with the blocking client: the engine
    then checks the server and re-queues); an HTTP error answer raises SGLangError out of poll."""
    stub = StubGenerateServer(fail_on_seed=None).start()
    stub.hold()
    engine = _engine(stub, request_timeout_s=0.3)
    try:
        req = make_requests(_prompt(3), SamplingParams(max_new_tokens=2), n=1, version=0, base_seed=0)[0]
        with pytest.raises(ServerDown, match="no answer within 0.3s"):
            engine._generate(engine._clients[0], req)
    finally:
        stub.release()
        engine.close()
        stub.stop()
    req = make_requests(_prompt(4), SamplingParams(max_new_tokens=2), n=1, version=0, base_seed=0)[0]
    stub = StubGenerateServer(fail_on_seed=req.seed).start()
    engine = _engine(stub)
    try:
        engine.submit(_prompt(4), SamplingParams(max_new_tokens=2), n=1, version=0)
        with pytest.raises(SGLangError, match="HTTP 400.*stub refuses"):
            _collect(engine, 1)
    finally:
        engine.close()
        stub.stop()


def test_concurrency_config_is_validated_and_sized_from_rollout_config():
    from scalerl_mega.build import build_sglang_engine
    from scalerl_mega.cluster.launch_config import compose

    with pytest.raises(ValueError, match="max_inflight_per_server=0"):
        SGLangEngineConfig(max_inflight_per_server=0)
    base = ["experiment=demo", "rollout=sglang"]
    with pytest.raises(ValueError, match="rollout.max_batch_size=0"):
        compose([*base, "rollout.max_batch_size=0"])
    stub = StubGenerateServer(num_ports=3).start()
    cfg = compose([*base, f"rollout.engine_urls=[{','.join(stub.urls)}]", "rollout.num_engines=3",
                   "rollout.max_batch_size=700", "cluster.device=cpu"])
    engine = build_sglang_engine(cfg, None, None)
    try:
        assert engine.config.max_inflight_per_server == 700 and engine.max_concurrency == 2100
    finally:
        engine.close()
        stub.stop()


def test_open_file_limit_is_raised_or_refused(monkeypatch):
    import resource

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: calls.append(lim))
    _ensure_open_files(900, what="x")
    assert calls == []
    _ensure_open_files(3000, what="x")
    assert calls == [(3000, 4096)]
    with pytest.raises(ValueError, match="RLIMIT_NOFILE=4096.*rollout.max_batch_size"):
        _ensure_open_files(5000, what="64 server(s) x max_inflight_per_server=256")
