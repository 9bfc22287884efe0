"""An OpenEnv 0.10 environment through `env=custom` (episodes/openenv_env.py): a real OpenEnv server (openenv's own
FastAPI app and WebSocket sessions under uvicorn, `tests/support/openenv_server.py`) started by the test, driven by
openenv's own client from the episodes' threads. Each episode's ids are the engine's generated ids and the arith
template's ids of the server's observations (computed here by hand), and its reward is the server's, recomputed
here from the replies. Skipped without the optional extra `[openenv]`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("openenv.core")

from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings  # noqa: E402
from scalerl_mega.episodes.env import EnvRunner  # noqa: E402
from scalerl_mega.episodes.pool import EpisodePool  # noqa: E402
from scalerl_mega.episodes.template import ChatSplicer  # noqa: E402
from scalerl_mega.types import SamplingParams  # noqa: E402
from tests.integration.test_loop_megatron import REPO  # noqa: E402
from tests.unit.test_episodes import EOS, TOK, Recording, _prompt, _spans  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STARTUP_S = 120.0
"""A hang guard for the server's start (polled on /health), not an assertion."""


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.openenv_server", str(port)], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the OpenEnv server did not start (exit {proc.poll()})") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_an_openenv_server_runs_episodes_with_exact_ids_and_its_rewards(server):
    rec = Recording()
    runner = EnvRunner(target="scalerl_mega.episodes.openenv_env.OpenEnvEnvironment",
                       kwargs={"base_url": server, "reset_fields": ["prompt"]})
    eng = EpisodeEngine(rec, runner=runner, splicer=ChatSplicer(TOK, template="arith", stop_token_ids=[EOS]),
                        decode=lambda ids: TOK.decode(ids, skip_special_tokens=True), pool=EpisodePool(size=8),
                        settings=EpisodeSettings(max_turns=4, budget=80, correct=1.0, step_timeout_s=60.0))
    prompts = [_prompt(2, 2), _prompt(13, 4)]
    stops = sorted({EOS, *range(0, len(TOK), 3)})  # every turn ends with a stop (a truncated turn ends the episode)
    try:
        for i, p in enumerate(prompts):
            eng.submit(p, SamplingParams(max_new_tokens=30, stop_token_ids=stops, seed=i), n=4, version=0)
        out = []
        for _ in range(200000):  # a hang guard
            out += eng.poll(0.05)
            if len(out) == 8:
                break
    finally:
        eng.close()
    assert len(out) == 8
    for ep in out:
        question = next(p.text for p in prompts if p.prompt_id == ep.prompt_id)
        replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        solved = [("4" in r) for r in replies]
        turns = solved.index(True) + 1 if any(solved) else 2  # the server's rule: done at a "4", else after 2 tries
        assert ep.turns == turns and len(replies) == turns
        assert ep.episode_result == ((1.0, True, "env") if any(solved) else (-1.0, False, "env"))
        assert ep.prompt_ids == [TOK.bos_token_id] + [TOK.convert_tokens_to_ids(ch) for ch in question]
        gen = [s for s in _spans(ep.mask()) if s[2] == 1]
        env = [s for s in _spans(ep.mask()) if s[2] == 0]
        assert len(gen) == turns and len(env) == turns - 1
        if env:  # the observation " no " + question, after the <eos> closing a turn that stopped on another id
            s, e, _ = env[0]
            first = ep.output_ids[gen[0][0]:gen[0][1]]
            feedback = [TOK.convert_tokens_to_ids(ch) for ch in " no " + question]
            assert ep.output_ids[s:e] == ([] if first[-1] == EOS else [EOS]) + feedback
        full = ep.prompt_ids + ep.output_ids
        for s, e, _ in gen:  # each generated span is what the engine returned for the ids before it
            assert any(c.prompt_ids == full[:len(ep.prompt_ids) + s] and c.output_ids == ep.output_ids[s:e]
                       and c.sample_index == ep.sample_index for c in rec.returned.values())
