"""The episodes' own pool (episodes/pool.py): environment calls and agent functions of every episode are in flight
at once (forced interleavings: a barrier only all of them together can pass, a gate only another episode's later
turn can open; serial calls would break the barrier or never open the gate), tool time overlaps generation, and the
dataset row reaches `reset` and agents whole (the row contract, episodes/env.py `task_row`)."""

from __future__ import annotations

import json
import threading

import pytest

from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
from scalerl_mega.episodes.env import EnvRunner, task_row
from scalerl_mega.episodes.pool import EpisodePool
from scalerl_mega.episodes.template import ChatSplicer, TemplateError
from scalerl_mega.types import Prompt, SamplingParams
from tests.support import episode_envs
from tests.unit.test_episodes import EOS, TOK, Recording, _prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SAFETY_S = 300.0
"""Only a hang guard: the barrier's own timeout (a serial run would break it there and fail the test)."""


def _engine(target: str, *, pool_size: int) -> tuple[EpisodeEngine, Recording]:
    rec = Recording()
    eng = EpisodeEngine(rec, runner=EnvRunner(target=target, kwargs={}),
                        splicer=ChatSplicer(TOK, template="arith", stop_token_ids=[EOS]),
                        decode=lambda ids: TOK.decode(ids, skip_special_tokens=True), pool=EpisodePool(size=pool_size),
                        settings=EpisodeSettings(max_turns=4, budget=60, correct=1.0, step_timeout_s=SAFETY_S,
                                                 episode_timeout_s=10 * SAFETY_S))
    return eng, rec


def _collect(eng, n: int) -> list:
    out = []
    for _ in range(200000):  # a hang guard; each poll waits on the engine or the environment threads
        out += eng.poll(0.05)
        if len(out) == n:
            return out
    raise AssertionError(f"{len(out)} of {n} episodes finished")



def _episode_results(eng, prompts) -> dict:
    """One episode of each prompt on `eng` (closed after): prompt id -> episode_result."""
    try:
        for p in prompts:
            eng.submit(p, SamplingParams(max_new_tokens=3, seed=0, stop_token_ids=[EOS]), n=1, version=0)
        return {c.prompt_id: c.episode_result for c in _collect(eng, len(prompts))}
    finally:
        eng.close()

def test_every_episodes_environment_step_is_in_flight_at_once():
    n = 8
    episode_envs.BARRIER[:] = [threading.Barrier(n, timeout=SAFETY_S)]
    eng, _ = _engine("tests.support.episode_envs.BarrierEnv", pool_size=n)
    try:
        for i in range(n // 2):
            eng.submit(_prompt(i, i + 1), SamplingParams(max_new_tokens=4, seed=i, stop_token_ids=[EOS]), n=2,
                       version=0)
        out = _collect(eng, n)
    finally:
        eng.close()
    assert [c.episode_result for c in out] == [(1.0, True, "env")] * n
    assert eng.pool.threads == n


def test_tool_time_overlaps_generation():
    """Episode A's first tool call blocks until episode B reaches its second step: B's second turn was generated
    while A's tool call was running. (Every id stops a turn: each turn is one generated id, finish reason stop.)"""
    episode_envs.GATE.clear()
    eng, rec = _engine("tests.support.episode_envs.GatedEnv", pool_size=2)
    one_id = SamplingParams(max_new_tokens=4, seed=0, stop_token_ids=list(range(TOK.vocab_size + 8)))
    try:
        eng.submit(_prompt(1, 1, mode="wait"), one_id, n=1, version=0)
        eng.submit(_prompt(2, 2, mode="go"), one_id, n=1, version=0)
        out = {c.prompt_id: c for c in _collect(eng, 2)}
    finally:
        episode_envs.GATE.set()
        eng.close()
    assert out["p1_1"].turns == 1 and out["p2_2"].turns == 2
    assert sorted(rec.returned) == ["p1_1#0.0", "p2_2#1.0", "p2_2#1.1"]


def test_the_pool_starts_threads_only_up_to_its_size_and_runs_blocking_calls_side_by_side():
    pool = EpisodePool(size=3)
    barrier = threading.Barrier(3, timeout=SAFETY_S)
    calls = [pool.submit(barrier.wait) for _ in range(3)]
    later = pool.submit(lambda: "after")
    for _ in range(200000):
        if all(c.done for c in [*calls, later]):
            break
        pool.wake.clear()
        pool.wait(0.05)
    assert all(c.error is None for c in calls) and later.value == "after" and pool.threads == 3
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(print)
    with pytest.raises(ValueError, match=r"size=0 must be >= 1 \(env.concurrency\)"):
        EpisodePool(size=0)


def test_every_agent_runs_at_once_with_a_blocking_openai_client():
    pytest.importorskip("openai")
    from tests.integration.test_agent_episodes import _agent_engine

    n = 6
    episode_envs.BARRIER[:] = [threading.Barrier(n, timeout=SAFETY_S)]
    eng, rec = _agent_engine("tests.support.episode_envs.barrier_agent")
    eng.pool = EpisodePool(size=n)
    try:
        for i in range(n):
            eng.submit(_prompt(i, 3), SamplingParams(max_new_tokens=4, seed=i, stop_token_ids=[EOS]), n=1, version=0)
        out = _collect(eng, n)
    finally:
        eng.close()
    assert [c.episode_result for c in out] == [(1.0, True, "agent")] * n and len(rec.returned) == n


# ---- the row contract ------------------------------------------------------------------------------------------
def _rows(tmp_path, rows: list[dict]):
    from scalerl_mega.data.sources import load_prompts

    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(f, schema="polaris").prompts
    for p in prompts:
        p.token_ids = TOK(p.text)["input_ids"]
    return prompts


def test_the_dataset_row_reaches_reset_and_agents_whole(tmp_path):
    rows = [{"problem": "1+2", "answer": "3", "final": "yes", "level": 2},
            {"problem": "4+4", "answer": "8", "final": "no", "level": 5}]
    prompts = _rows(tmp_path, rows)
    by_problem = {p.row["problem"]: p for p in prompts}
    for row in rows:
        p = by_problem[row["problem"]]
        assert task_row(p) == {**row, "prompt": p.text, "gold": row["answer"], "prompt_id": p.prompt_id}
    out = _episode_results(_engine("tests.support.episode_envs.RowEnv", pool_size=2)[0], prompts)
    assert out == {by_problem["1+2"].prompt_id: (1.0, True, "env"), by_problem["4+4"].prompt_id: (-1.0, False, "env")}
    pytest.importorskip("openai")
    from tests.integration.test_agent_episodes import _agent_engine

    got = _episode_results(_agent_engine("tests.support.episode_envs.row_agent")[0], prompts)
    assert got == {by_problem["1+2"].prompt_id: (1.0, True, "agent"),
                   by_problem["4+4"].prompt_id: (-1.0, False, "agent")}


def test_a_row_column_named_like_an_added_key_is_refused(tmp_path):
    (p,) = _rows(tmp_path, [{"problem": "1+2", "answer": "3", "gold": "three"}])
    with pytest.raises(ValueError, match=r"has the column\(s\) \['gold'\], which episodes add"):
        task_row(p)
    generated = Prompt(prompt_id="g", text="Q", task="synthetic", gold="1", meta={"a": 1, "b": 0})
    assert task_row(generated) == {"a": 1, "b": 0, "prompt": "Q", "gold": "1", "prompt_id": "g"}


def test_a_parquet_row_keeps_every_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from scalerl_mega.data.sources import load_prompts

    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"problem": ["1+2"], "answer": ["3"], "final": ["yes"]}), f)
    (p,) = load_prompts(f, schema="polaris").prompts
    assert p.row == {"problem": "1+2", "answer": "3", "final": "yes"}


class ThreadNoting(ChatSplicer):
    """The arith splicer, noting the thread of every opening and splice it templates; `refuse_after` splices
    raise the template's refusal."""

    def __init__(self, *, refuse_after: int | None = None) -> None:
        super().__init__(TOK, template="arith", stop_token_ids=[EOS])
        self.threads: list[str] = []
        self.refuse_after = refuse_after

    def opening(self, messages, *, tools=None):
        self.threads.append(threading.current_thread().name)
        return super().opening(messages, tools=tools)

    def environment_ids(self, history, new, *, stopped_with, tools=None):
        self.threads.append(threading.current_thread().name)
        if self.refuse_after is not None and len(self.threads) > self.refuse_after:
            raise TemplateError("refused on purpose")
        return super().environment_ids(history, new, stopped_with=stopped_with, tools=tools)


def _noting_engine(splicer: ThreadNoting) -> EpisodeEngine:
    return EpisodeEngine(Recording(), runner=EnvRunner(target="tests.support.episode_envs.ScriptedEnv",
                                                       kwargs={"turns": 3}),
                         splicer=splicer, decode=lambda ids: TOK.decode(ids, skip_special_tokens=True),
                         pool=EpisodePool(size=4, name="episodes"),
                         settings=EpisodeSettings(max_turns=3, budget=60, step_timeout_s=SAFETY_S,
                                                  episode_timeout_s=10 * SAFETY_S))


def test_openings_and_splices_are_templated_on_the_pool_threads_not_the_polling_one():
    """Every episode's opening and every environment splice is templated on a thread of the episodes' pool (the
    thread that polls drives generation only); the ids are those the driver's exact-id tests check."""
    splicer = ThreadNoting()
    eng = _noting_engine(splicer)
    any_id = SamplingParams(max_new_tokens=3, seed=0, stop_token_ids=list(range(TOK.vocab_size + 8)))
    try:
        for i in range(4):
            eng.submit(_prompt(i, i + 2), any_id, n=1, version=0)
        out = _collect(eng, 4)
    finally:
        eng.close()
    assert [c.turns for c in out] == [3] * 4  # one id a turn, 3 turns: 4 openings and 8 splices templated
    assert len(splicer.threads) == 4 + 4 * 2
    assert threading.current_thread().name not in splicer.threads
    assert all(name.startswith("episodes-") for name in splicer.threads)
    texts = {p.prompt_id: p.text for p in (_prompt(i, i + 2) for i in range(4))}
    for c in out:  # the arith template by hand: after a generated id, <eos> unless it was the stop, then the feedback
        gen = [i for i, m in zip(c.output_ids, c.loss_mask) if m]
        feedback = list(TOK(" no " + texts[c.prompt_id], add_special_tokens=False)["input_ids"])
        spliced = [[*([EOS] if g != EOS else []), *feedback] for g in gen[:2]]
        assert c.prompt_ids == [TOK.bos_token_id, *TOK(texts[c.prompt_id], add_special_tokens=False)["input_ids"]]
        assert c.output_ids == [gen[0], *spliced[0], gen[1], *spliced[1], gen[2]]


def test_a_template_refusal_on_a_pool_thread_stops_the_run_from_poll():
    """The template's refusal mid-episode is no failure of the episode (not dropped, not scored): it is raised by
    `poll`, on the thread that drives the run, as when the driver templated there."""
    eng = _noting_engine(ThreadNoting(refuse_after=1))
    try:
        eng.submit(_prompt(1, 2), SamplingParams(max_new_tokens=3, seed=0, stop_token_ids=list(range(TOK.vocab_size + 8))),
                   n=1, version=0)
        with pytest.raises(TemplateError, match="refused on purpose"):
            _collect(eng, 1)
    finally:
        eng.close()
