"""Multi-turn episodes on the local engine (episodes/: template, env, driver): the exact-id invariants (decode-free:
every generated span is the engine's ids, every environment span the template's difference computed here by
hand), the broken-template refusal, failed episodes dropped and counted (or scored like a raising reward),
`env.max_turns` and the episode budget, scoring through the loop's `score_groups`."""

from __future__ import annotations

import pytest

from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer
from scalerl_mega.episodes.driver import EpisodeEngine, EpisodeSettings
from scalerl_mega.episodes.env import EnvRunner
from scalerl_mega.episodes.failures import EpisodeFailures
from scalerl_mega.episodes.pool import EpisodePool
from scalerl_mega.episodes.template import ChatSplicer, TemplateError
from scalerl_mega.rollout.core import CoreConfig
from scalerl_mega.rollout.inprocess import InProcessRolloutEngine
from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec
from scalerl_mega.types import FinishReason, Prompt, SamplingParams

TOK = build_arith_tokenizer()
EOS = TOK.eos_token_id
DIGITS = [TOK.convert_tokens_to_ids(d) for d in "0123456789"]
CFG = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recording:
    """The in-process engine, recording every request's ids and every completion it returns."""

    def __init__(self) -> None:
        self.engine = InProcessRolloutEngine(LocalEngineConfig(
            model=LocalModelSpec(arch="llama", config=CFG, init_seed=0), core=CoreConfig(max_batch=8, max_seq_len=200)))
        self.submitted: dict[str, list[int]] = {}
        self.returned: dict[str, object] = {}

    def submit(self, prompt, sampling, *, n, version, first_index=0):
        self.submitted[prompt.prompt_id] = list(prompt.token_ids)
        self.engine.submit(prompt, sampling, n=n, version=version, first_index=first_index)

    def poll(self, timeout_s=0.0):
        got = self.engine.poll(timeout_s)
        self.returned.update({c.prompt_id: c for c in got})
        return got

    def update_weights(self, named, *, version):
        self.engine.update_weights(named, version=version)

    def close(self):
        self.engine.close()


@pytest.fixture(scope="module")
def runner():
    return EnvRunner(target="tests.support.episode_envs.ScriptedEnv", kwargs={"turns": 3})


def _prompt(a: int, b: int, **meta) -> Prompt:
    text = f"Q:{a}+{b}="
    return Prompt(prompt_id=f"p{a}_{b}", text=text, task="synthetic", gold=str(a + b), meta=dict(meta),
                  token_ids=TOK(text)["input_ids"])


def _run(runner, prompts, *, n=2, budget=60, max_turns=5, max_new=6, version=0, max_seq_len=0, on_error="drop",
         on_blocked=None):
    """Run the episodes to their end. Deadlines run on a manual clock (10 s per call): `on_blocked(clock)` is called
    once an environment call blocks (`episode_envs.BLOCKED`)."""
    from tests.support.episode_envs import BLOCKED, ManualClock

    rec, clock = Recording(), ManualClock()
    BLOCKED.clear()
    eng = EpisodeEngine(rec, runner=runner, splicer=ChatSplicer(TOK, template="arith", stop_token_ids=[EOS]),
                        decode=lambda ids: TOK.decode(ids, skip_special_tokens=True),
                        pool=EpisodePool(size=4, clock=clock),
                        failures=EpisodeFailures(on_error=on_error, failure_reward=-1.0),
                        settings=EpisodeSettings(max_turns=max_turns, budget=budget, correct=1.0,
                                                 max_seq_len=max_seq_len, step_timeout_s=10.0, clock=clock))
    for i, p in enumerate(prompts):
        eng.submit(p, SamplingParams(max_new_tokens=max_new, stop_token_ids=[EOS, *DIGITS], seed=10 * i), n=n,
                   version=version)
    out = []
    for _ in range(20000):  # a hang guard: every poll either waits on the engine or on the environment threads
        out += eng.poll(0.05)
        if len(out) == n * len(prompts):
            break
        if on_blocked is not None and BLOCKED.is_set():
            on_blocked(clock)
            on_blocked = None
    assert len(out) == n * len(prompts) and eng.episodes_in_flight == 0
    eng.close()
    return out, rec


def _spans(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, mask value) of the runs of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_episode_ids_are_the_engines_ids_and_the_templates_difference(runner):
    prompts = [_prompt(47, 38), _prompt(5, 9)]
    episodes, rec = _run(runner, prompts)
    multi = 0
    for ep in episodes:
        p = next(p for p in prompts if p.prompt_id == ep.prompt_id)
        assert ep.prompt_ids == [1] + [TOK.convert_tokens_to_ids(ch) for ch in p.text]  # <bos> + characters
        turns = sorted((k for k in rec.submitted if k.startswith(f"{p.prompt_id}#")),
                       key=lambda k: (int(k.split("#")[1].split(".")[0]), int(k.split(".")[-1])))
        mine = [k for k in turns if rec.returned[k].sample_index == ep.sample_index
                and rec.submitted[k][:len(ep.prompt_ids)] == ep.prompt_ids
                and (ep.prompt_ids + ep.output_ids)[:len(rec.submitted[k])] == rec.submitted[k]]
        assert len(mine) == ep.turns
        full = ep.prompt_ids + ep.output_ids
        gen_spans = [s for s in _spans(ep.mask()) if s[2] == 1]
        env_spans = [s for s in _spans(ep.mask()) if s[2] == 0]
        assert len(gen_spans) == ep.turns and len(env_spans) == ep.turns - 1
        feedback = [TOK.convert_tokens_to_ids(ch) for ch in " no " + p.text]  # the template's difference by hand
        env_tokens = 0
        for t, key in enumerate(mine):
            c = rec.returned[key]
            s, e, _ = gen_spans[t]
            assert rec.submitted[key] == full[:len(ep.prompt_ids) + s]  # each turn continues the full id list
            assert ep.output_ids[s:e] == c.output_ids and ep.gen_logprobs[s:e] == c.gen_logprobs
            assert ep.weight_versions[s:e] == c.weight_versions
            if t < ep.turns - 1:
                s2, e2, _ = env_spans[t]
                # the arith template closes an assistant turn with <eos>: generated when the turn stopped on it,
                # else (a stop on a digit) spliced before the feedback
                env = ([] if c.output_ids[-1] == EOS else [EOS]) + feedback
                assert ep.output_ids[s2:e2] == env
                assert ep.gen_logprobs[s2:e2] == [0.0] * len(env)
                assert ep.weight_versions[s2:e2] == [c.weight_versions[-1]] * len(env)
                env_tokens += len(env)
        assert ep.env_tokens == env_tokens
        assert len(ep.output_ids) == len(ep.gen_logprobs) == len(ep.weight_versions) == len(ep.loss_mask) <= 60
        if ep.turns == 3:  # the environment ends it at its 3rd step: 0.25 + 0.25 + 1.0
            multi += 1
            assert ep.episode_result == (1.5, True, "env")
            assert ep.finish_reason == rec.returned[mine[-1]].finish_reason  # the last turn's
        else:  # a turn ran out of its tokens: the episode ends there, truncated
            assert ep.finish_reason == FinishReason.LENGTH
            assert ep.episode_result == (0.25 * ep.turns, False, "env")
        assert [m["role"] for m in ep.messages][:2] == ["user", "assistant"]
    assert multi >= 1


def test_max_turns_and_the_episode_budget(runner):
    episodes, _ = _run(runner, [_prompt(12, 34)], n=4, max_turns=2, max_new=6)
    for ep in episodes:
        assert ep.turns <= 2 and not (ep.turns == 2 and ep.episode_result[0] != 0.5)
    episodes, _ = _run(runner, [_prompt(12, 34)], n=4, budget=14, max_new=6)
    for ep in episodes:  # a turn generates at most what is left; the feedback (12 ids) does not fit after a turn
        assert len(ep.output_ids) <= 14 and ep.turns == 1


def test_the_engines_sequence_length_caps_an_episode(runner):
    """The opening (here `<bos>Q:12+34=`, 9 ids) + every turn's ids stay within `max_seq_len` (9 + 20) although
    the budget (60) is larger: a turn generates at most what is left of it, and the feedback (12 ids, 13 after a
    turn that did not stop on <eos>) is not spliced when it leaves no room for one more generated id."""
    episodes, rec = _run(runner, [_prompt(12, 34)], n=4, budget=60, max_new=6, max_seq_len=29)
    for ep in episodes:
        assert len(ep.prompt_ids) == 9 and len(ep.prompt_ids) + len(ep.output_ids) <= 29
        assert ep.turns <= 2 and (ep.turns == 2 or ep.finish_reason == FinishReason.LENGTH
                                  or ep.episode_result[0] == 1.5)
    assert all(len(ids) < 29 for ids in rec.submitted.values())
    assert any(ep.finish_reason == FinishReason.LENGTH for ep in episodes)


def _score(prompts, episodes, *, stop_error_rate=None):
    from scalerl_mega.config import LengthConfig
    from scalerl_mega.inflight import _Pending, score_groups

    class Comps:
        def decode(self, ids):
            return TOK.decode(ids, skip_special_tokens=True)

        def reward_fn(self, prompts, texts):
            raise AssertionError("episodes are scored by their environment")

    pend = [_Pending(seq=i, prompt=p, version=0, completions=[c for c in episodes if c.prompt_id == p.prompt_id])
            for i, p in enumerate(prompts)]
    return score_groups(pend, Comps(), LengthConfig(name="interruption"), stop_error_rate=stop_error_rate,
                        where="step 1")


@pytest.fixture
def released():
    """Lets `sleep_step` environments return at the end of the test (their deadline has fired by then)."""
    from tests.support.episode_envs import RELEASE

    RELEASE.clear()
    yield
    RELEASE.set()


def _past_the_step_deadline(clock):
    clock.advance(10.5)


def test_failed_episodes_are_dropped_and_counted_by_reason(runner, released, caplog):
    """A raising reset, a raising step and a step that never returns (it blocks until the test ends; the deadline
    clock passes its 10 s once it blocks) end their episodes; by default they are not trained: moved out of their
    group into `Group.dropped`, counted by reason, each kind logged once."""
    from scalerl_mega.episodes.records import episode_metrics
    from scalerl_mega.inflight import RewardErrorStop, reward_error_metrics

    prompts = [_prompt(1, 2, mode="raise_reset"), _prompt(3, 4, mode="raise_step"), _prompt(7, 8)]
    episodes, _ = _run(runner, prompts, n=1, max_new=4)
    hung = _prompt(5, 6, mode="sleep_step")
    late, _ = _run(runner, [hung], n=1, max_new=4, on_blocked=_past_the_step_deadline)
    episodes, prompts = episodes + late, prompts + [hung]
    by = {c.prompt_id: c for c in episodes}
    reset = by["p1_2"].episode_result
    assert reset[:2] == (0.0, False) and reset[2].startswith("dropped: env_error: error: RuntimeError at episode_envs.py")
    assert by["p1_2"].output_ids == [] and by["p1_2"].turns == 0
    step = by["p3_4"]
    assert step.turns in (1, 2)
    if step.turns == 2:  # the second step raised
        assert step.episode_result[2].startswith("dropped: env_error: error: ValueError at episode_envs.py")
    assert by["p5_6"].episode_result == (0.0, False, "dropped: step_timeout: tests.support.episode_envs.ScriptedEnv"
                                                     ".step ran past env.step_timeout_s=10 s")
    groups = _score(prompts, episodes)
    kept = [s.completion.prompt_id for g in groups for s in g.samples]
    assert "p1_2" not in kept and "p5_6" not in kept and "p7_8" in kept
    m = episode_metrics(groups)
    n_env = 2 if step.turns == 2 else 1
    assert m["episode/dropped"] == 1.0 + n_env and m["episode/dropped_by_reason"] == {"env_error": n_env,
                                                                                      "step_timeout": 1}
    assert reward_error_metrics(groups)["reward/errors"] == 0.0  # not scored: nothing to count there
    logged = [r.getMessage() for r in caplog.records if r.name == "scalerl_mega.episodes"]
    assert len(logged) == 1 + n_env and sum("step_timeout" in line for line in logged) == 1
    with pytest.raises(RewardErrorStop, match=rf"episode error: {1 + n_env} of 4 episodes of step 1 were dropped "
                                              r"\(.*step_timeout 1.*\).*reward.stop_error_rate=0.5"):
        _score(prompts, episodes, stop_error_rate=0.5)
    _score(prompts, episodes, stop_error_rate=1.0)  # below the rate: trains on
    _score(prompts, episodes, stop_error_rate=None)
    with pytest.raises(RewardErrorStop, match=r"all 1 episodes .* every episode was dropped: nothing is left to train"):
        _score([hung], late, stop_error_rate=None)  # null trains on, but not on nothing


def test_score_incorrect_keeps_failed_episodes_as_a_raising_reward(runner, released):
    from scalerl_mega.inflight import reward_error_metrics

    prompts = [_prompt(1, 2, mode="raise_reset")]
    episodes, _ = _run(runner, prompts, n=1, max_new=4, on_error="score_incorrect")
    hung = _prompt(5, 6, mode="sleep_step")
    late, _ = _run(runner, [hung], n=1, max_new=4, on_error="score_incorrect", on_blocked=_past_the_step_deadline)
    episodes, prompts = episodes + late, prompts + [hung]
    by = {c.prompt_id: c for c in episodes}
    assert by["p1_2"].episode_result[:2] == (-1.0, False)
    assert by["p1_2"].episode_result[2].startswith("error: RuntimeError at episode_envs.py")
    assert by["p5_6"].episode_result == (-1.0, False, "pool_timeout")
    groups = _score(prompts, episodes)
    assert all(len(g.samples) == 1 and not g.dropped for g in groups)
    m = reward_error_metrics(groups)
    assert m["reward/timeouts"] == 1.0 and m["reward/errors"] == 1.0


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path):
    strip = tmp_path / "strip_think.jinja"
    strip.write_text("{{ bos_token }}{% for m in messages %}{% set c = m['content'] %}"
                     "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}"
                     "{% endif %}{{ c }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}")
    with pytest.raises(TemplateError, match=r"env.chat_template='.*strip_think.jinja' is not prefix-preserving.*"
                                            r"strips earlier <think> blocks.*set env.chat_template"):
        ChatSplicer(TOK, template=str(strip), stop_token_ids=[EOS])
    with pytest.raises(TemplateError, match="the tokenizer has no chat template"):
        ChatSplicer(TOK, stop_token_ids=[EOS])


def test_routes_of_an_episode_are_each_turns_own_positions():
    """Routing replay across turns: turn 1 (prompt 3 ids, 2 generated) routed positions 0-3; turn 2 re-ran the whole
    prefix (7 ids) and generated 2, routing positions 0-7: the episode keeps turn 1's routes for 0-3 (they produced
    its tokens) and turn 2's for 4-7: 8 positions = 9 ids - 1, as the batch expects."""
    import numpy as np

    from scalerl_mega.episodes.driver import concat_routes
    from scalerl_mega.types import Routes

    L, K = 1, 2
    t1 = Routes(num_layers=L, topk=K, expert_ids=np.arange(4 * K, dtype=np.uint8),
                weights=np.full(4 * K, 0.5, np.float32), versions=[0] * 4)
    t2 = Routes(num_layers=L, topk=K, expert_ids=np.arange(100, 100 + 8 * K, dtype=np.uint8),
                weights=np.full(8 * K, 0.25, np.float32), versions=[1] * 8)
    r = concat_routes([(t1, 0), (t2, 4)])
    r.check(where="episode")
    assert r.num_positions == 8 and r.versions == [0] * 4 + [1] * 4
    assert r.expert_ids.tolist() == list(range(8)) + list(range(108, 116))
    assert r.weights.tolist() == [0.5] * 8 + [0.25] * 8
    no_weights = concat_routes([(Routes(num_layers=L, topk=K, expert_ids=t1.expert_ids, weights=[], versions=[0] * 4),
                                 0), (Routes(num_layers=L, topk=K, expert_ids=t2.expert_ids, weights=[],
                                             versions=[1] * 8), 4)])
    assert len(no_weights.weights) == 0 and no_weights.num_positions == 8
    assert concat_routes([]) is None


def test_the_python_tool_runs_code_in_the_sandbox_and_scores_the_final_answer():
    from scalerl_mega.episodes.examples import PythonTool

    env = PythonTool(time_limit_s=600.0)  # a safety net only: neither program below may end by the time limit
    opening = env.reset({"prompt": "What is 6 times 7?", "gold": "42"})
    assert [m["role"] for m in opening] == ["system", "user"] and opening[1]["content"] == "What is 6 times 7?"
    msgs, reward, done = env.step("Let me compute.\n```python\nprint(sum(range(7)) * 2)\n```")
    assert msgs == [{"role": "tool", "content": "42\n"}] and (reward, done) == (0.0, False)
    msgs, reward, done = env.step("```python\nimport socket\nsocket.create_connection(('1.1.1.1', 80), 2)\n```")
    # no network inside the sandbox: the connect fails at once (refused there, not ended by the time limit)
    assert done is False and "Error" in msgs[0]["content"] and "timed out" not in msgs[0]["content"], msgs
    assert env.step("The answer is 42.") == ([], 1.0, True)
    assert env.step("It is 41") == ([], -1.0, True)
