"""`env=single` is the one-turn episode of the episode engine (episodes/single.py): every run's engine is an episode
engine (one rollout path, found through the static call graph from `scalerl-train`'s entry), and the one-turn
episode of a demo-sized request is exactly the engine's own completion of it (ids, log-probs, versions, loss mask,
finish reason, interruption point), with the reply text the loop's decode gives and the reward left to the reward
group."""

from __future__ import annotations

import ast
import random

import pytest

from scalerl_mega.build import build_engine, build_task, local_engine_config
from scalerl_mega.compose import compose
from scalerl_mega.episodes.driver import EpisodeEngine
from scalerl_mega.episodes.single import OneTurn
from scalerl_mega.inflight import _Pending, _Router, sampling_params, score_groups
from scalerl_mega.interfaces import LoopComponents
from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
from scalerl_mega.types import FinishReason

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENGINE_MAKERS = ("build_local_engine", "build_sglang_engine")


def _returns(key) -> list[ast.expr]:
    from callgraph import node_of

    return [n.value for n in ast.walk(node_of(key)) if isinstance(n, ast.Return) and n.value is not None]


def test_every_run_engine_is_built_under_an_episode_engine():
    """From `train.main`, the engines are made only by `build.build_engine`, every return of which is
    `episode_engine(...)` over them; and `episodes.assemble.episode_engine` never returns the engine it was given."""
    from callgraph import callees, reach

    run = reach([("scalerl_mega.train", "main")])
    makers = {c for k in run for c in callees(k) if c[1] in ENGINE_MAKERS}
    assert makers == {("scalerl_mega.build", m) for m in ENGINE_MAKERS}  # the test looks at the real makers
    callers = {k for k in run if any(c in makers for c in callees(k))}
    assert callers == {("scalerl_mega.build", "build_engine")}
    wrapped = _returns(("scalerl_mega.build", "build_engine"))
    assert len(wrapped) == 2 and all(isinstance(r, ast.Call) and ast.unparse(r.func) == "episode_engine"
                                     for r in wrapped)
    over = _returns(("scalerl_mega.episodes.assemble", "episode_engine"))
    assert over and all(isinstance(r, ast.Call) for r in over), [ast.unparse(r) for r in over]


@pytest.fixture(scope="module")
def demo():
    cfg = compose(["experiment=demo", "rollout.in_process=true"])
    return cfg, build_task(cfg)


def _step(engine, cfg, task, *, prompts: int, texts: list[str] | None = None):
    """A demo-sized admission of `prompts` prompts x G samples through the loop's router, completed and scored
    by `score_groups` with a reward that records the texts it is given (1.0 for an even length)."""
    G = cfg.train.generations_per_prompt

    def reward(ps, ts):
        if texts is not None:
            texts.extend(ts)
        return [(float(len(t) % 2 == 0), len(t) % 2 == 0, "parity") for t in ts]

    comps = LoopComponents(engine=engine, trainer=None, sampler=None, val_prompts=[], reward_fn=reward,
                           decode=task.decode, encode=task.encode, stop_token_ids=list(task.stop_token_ids),
                           interruption_ids=list(task.interruption_ids))
    rng, router = random.Random(0), _Router(engine, group_size=G, poll_timeout_s=0.05)
    for seq, prompt in enumerate(task.train_prompts[:prompts]):
        prompt.token_ids = task.encode(prompt.text)
        sp = sampling_params(cfg.length, cfg.rollout, comps, rng, seed=seq * 101, n=G)
        router.submit(_Pending(seq=seq, prompt=prompt, version=0), sp)
    while not router.oldest_complete(prompts):
        router.pump()
    pendings = router.pop(prompts)
    completions = [sorted(p.completions, key=lambda c: c.sample_index) for p in pendings]
    return completions, score_groups(pendings, comps, cfg.length)


FIELDS = ("prompt_id", "sample_index", "prompt_ids", "output_ids", "gen_logprobs", "weight_versions", "finish_reason",
          "loss_mask", "interrupted_at", "submitted_version", "routes")


def test_the_one_turn_episode_is_the_engines_own_completion(demo):
    cfg, task = demo
    episodes = build_engine(cfg, task, trainer=None)
    assert isinstance(episodes, EpisodeEngine) and isinstance(episodes.runner, OneTurn)
    texts: list[str] = []
    try:
        got, groups = _step(episodes, cfg, task, prompts=2, texts=texts)
    finally:
        episodes.close()
    raw = InProcessRolloutEngine(local_engine_config(cfg, task))  # the same engine (weights, seeds) on its own
    try:
        want, want_groups = _step(raw, cfg, task, prompts=2)
    finally:
        raw.close()
    flat_got, flat_want = [c for cs in got for c in cs], [c for cs in want for c in cs]
    assert len(flat_got) == len(flat_want) == 2 * cfg.train.generations_per_prompt
    for c, w in zip(flat_got, flat_want):
        assert {f: getattr(c, f) for f in FIELDS} == {f: getattr(w, f) for f in FIELDS}
        assert (c.turns, c.env_tokens, c.episode_result) == (1, 0, None)  # the reward group scores it
        assert c.timings.keys() == w.timings.keys() == {"queue_s", "generate_s"}
        assert c.text == task.decode(w.output_ids)
    # the demo's sampling makes both kinds of ending: an interruption phrase injected, and a plain stop or cut
    assert any(w.interrupted_at is not None for w in flat_want)
    assert any(w.interrupted_at is None for w in flat_want)
    assert {w.finish_reason for w in flat_want} & {FinishReason.INTERRUPTED, FinishReason.LENGTH}
    assert texts == [task.decode(w.output_ids) for w in flat_want]  # what the reward group was given
    assert [s.reward for g in groups for s in g.samples] == [float(len(t) % 2 == 0) for t in texts]
    assert [s.reward for g in groups for s in g.samples] == [s.reward for g in want_groups for s in g.samples]
