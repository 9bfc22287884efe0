"""router._Router: the bounded, interruptible wait on the engines."""

from __future__ import annotations

import pytest


def test_router_stall_and_stop_request():
    """The loop's waits on engines: no completion for rollout.stall_timeout_s with requests in flight
    is an error naming the key; a stop request (SIGTERM) surfaces as Preempted at the next poll."""
    from scalerl_mega.inflight import Preempted, _Pending, _Router
    from scalerl_mega.types import Prompt, SamplingParams

    class Silent:  # an engine that accepts requests and never answers
        def submit(self, *a, **k):
            pass

        def poll(self, timeout_s=0.0):
            return []

    stop = {"now": False}
    router = _Router(Silent(), group_size=2, poll_timeout_s=0.0, stall_timeout_s=1e-9, stop_requested=lambda: stop["now"])
    p = Prompt(prompt_id="x", text="", task="synthetic", gold="1", token_ids=[1])
    router.submit(_Pending(seq=0, prompt=p, version=0), [SamplingParams(max_new_tokens=4)] * 2)
    with pytest.raises(RuntimeError, match=r"2 requests in flight \(rollout.stall_timeout_s=1e-09\)"):
        router.pump()
    stop["now"] = True
    with pytest.raises(Preempted):
        router.pump()
