"""verifiers 0.4 episodes as `env=agent` against a real scalerl-train run (docs/extending.md, "verifiers 0.4").

scalerl-train's own `main` (a subprocess, `tests/support/agent_train.py`, which records every episode's endpoint
calls) trains the embedded demo model for one step with `env.agent._target_` =
`tests.support.episode_envs.verifiers_addition_agent`: each episode runs `tools/verifiers_rollout.py` in
`.venv-verifiers` (verifiers' own interpreter, openai 2.x): verifiers' `SingleAgentEnv` over a tiny taskset
(`tests/support/verifiers_plugins/scalerl_vf_addition.py`), its chat program (streaming through verifiers'
interception server and `EvalClient`) talking to the episode's url, its rewards scoring the trace. Checked against
the endpoint's record and computed independently of the project's code:

- every trained episode's ids are the engine's: the opening is the arith template's (`<bos>` + the question), the
  output the ids the engine generated, the loss mask 1 exactly on them;
- verifiers saw those ids' text: its trace's messages are the question and the decoded generated ids (stop id
  left out);
- the reward is verifiers': `correct` (the gold sum in the reply) + 0.5 x `digits` (the reply's share of digit
  characters), recomputed from the decoded ids, and it is the episode's reward in `episodes.jsonl`;
- the trainer's log-probs of the generated ids agree with the engine's (`metrics.mismatch_mode=assert`).

Needs `make verifiers-env` (skipped without `.venv-verifiers`); slow (each episode starts verifiers twice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_loop_megatron import REPO, TINY

pytestmark = pytest.mark.slow

AGENT = [
    "env=agent", "env.agent._target_=tests.support.episode_envs.verifiers_addition_agent", "env.chat_template=arith",
    "env.max_turns=2", "env.step_timeout_s=900", "train.steps=1", "train.prompts_per_step=2",
    "train.generations_per_prompt=2", "train.val_every=0", "metrics.dump_episodes=true",
    "length=penalty", "length.penalty_max_len=1000", "length.penalty_cache_len=4",  # rewards as verifiers gave
    "off_policy=ppo_off_policy", "off_policy.k=1", "metrics.max_logprob_mismatch=1e-3", "metrics.mismatch_mode=assert",
]


def _verifiers_python() -> str:
    from scalerl_mega.episodes.verifiers_agent import verifiers_python

    return verifiers_python()


def _reward(reply: str, gold: str) -> float:
    """The taskset's rewards, by hand: verifiers scores the stripped last reply."""
    text = reply.strip()
    correct = 1.0 if gold in text else 0.0
    digits = sum(ch.isdigit() for ch in text) / len(text) if text else 0.0
    return correct + 0.5 * digits


def test_verifiers_episodes_run_against_the_trainers_endpoint_on_the_engines_ids(tmp_path):
    python = _verifiers_python()
    if not os.path.exists(python):
        pytest.skip(f"no verifiers interpreter at {python}: run `make verifiers-env`")
    from tests.support.episode_envs import VERIFIERS_RECORD_VAR

    out, calls_file, vf_file = tmp_path / "run", tmp_path / "calls.jsonl", tmp_path / "verifiers.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", SCALERL_VERIFIERS_PYTHON=python,
               **{VERIFIERS_RECORD_VAR: str(vf_file)})
    overrides = [o for o in TINY if not o.startswith(("train.steps=", "train.prompts_per_step=",
                                                      "train.generations_per_prompt=", "off_policy.k="))]
    cmd = [sys.executable, "-m", "tests.support.agent_train", str(calls_file), *overrides, f"output_dir={out}",
           *AGENT]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"scalerl-train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    tok = build_arith_tokenizer()
    eos = tok.eos_token_id
    (train,) = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert train["batch_samples"] == 4.0 and train["episode/turns"] == 1.0 and train["episode/broken_prefixes"] == 0.0
    assert train["train/onpolicy_abs_log_ratio_max"] < 1e-3
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    recorded = {line["episode_id"]: line["calls"] for line in map(json.loads, calls_file.read_text().splitlines())}
    verifiers = {line["episode_id"]: line for line in map(json.loads, vf_file.read_text().splitlines())}
    by_ids = {tuple(c[-1]["prompt_ids"] + c[-1]["output_ids"]): k for k, c in recorded.items()}
    rewards = []
    for e in episodes:
        episode_id = by_ids[tuple(e["ids"])]  # the episode is its call's prompt + the engine's generated ids
        (call,) = recorded[episode_id]
        question = call["messages"][0]["content"]
        a, b = question.removeprefix("Q:").removesuffix("=").split("+")
        opening = [tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in question]
        assert call["prompt_ids"] == opening and e["prompt_len"] == len(opening)
        assert e["loss_mask"] == [0] * len(opening) + [1] * len(call["output_ids"])
        shown = call["output_ids"][:-1] if call["output_ids"][-1:] == [eos] else call["output_ids"]
        reply = tok.decode(shown, skip_special_tokens=False)
        vf = verifiers[episode_id]
        assert vf["messages"] == [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        expected = _reward(reply, str(int(a) + int(b)))
        assert vf["reward"] == pytest.approx(expected, abs=1e-12) and e["reward"] == pytest.approx(expected, abs=1e-12)
        rewards.append(expected)
    assert max(rewards) > 0.0  # the untrained model's replies hold digits: the rewards carry information
