"""`env=agent` end to end through scalerl-train's own `main` (a subprocess, `tests/support/agent_train.py`): agent
code written against the real `openai` client (`tests.support.episode_envs.retry_agent`: ask, then ask again after
the feedback " no " + the question) talks to the per-episode endpoint in front of the embedded demo model's local
engine; 2 RL steps at PPO k=1 with the loop's own on-policy assert. Checked against the endpoint's recorded calls
(the exact ids sent to and returned by the engine) and computed independently of the project's code:

- every trained episode's ids are its last call's prompt + generated ids, the second call extends the first;
- the loss mask is 1 exactly on the ids the engine generated in the two calls, 0 on the opening and on the
  environment ids, which are the arith template's: `<eos>` closing a turn the engine did not end itself, then the
  characters of " no " + the question;
- the reward is the agent's: 1 when the gold sum (from the question) is in the second reply, else -1;
- the trainer's log-probs of the generated ids agree with the engine's (`metrics.mismatch_mode=assert`);
- the run ends (exit 0, agents of the next steps still in flight) without an error or a traceback in its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_loop_megatron import REPO, TINY

pytest.importorskip("openai")

AGENT = [
    "env=agent", "env.agent._target_=tests.support.episode_envs.retry_agent", "env.chat_template=arith",
    "env.max_turns=2", "train.steps=2", "train.val_every=0", "metrics.dump_episodes=true",
    "length=penalty", "length.penalty_max_len=1000", "length.penalty_cache_len=4",  # rewards as the agent gave
    "off_policy=ppo_off_policy", "off_policy.k=1", "moe.routing_replay=ids",
    "metrics.max_logprob_mismatch=1e-3", "metrics.mismatch_mode=assert",
]


def _arith():
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    return build_arith_tokenizer()


def test_env_agent_trains_through_scalerl_train_with_the_engines_ids(tmp_path):
    out, record = tmp_path / "run", tmp_path / "calls.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tests.support.agent_train", str(record), *TINY, f"output_dir={out}", *AGENT]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"scalerl-train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    logged = proc.stdout + proc.stderr  # a normal end with agents in flight logs no error, no traceback
    assert "[ERROR]" not in logged and "Traceback" not in logged and "shutting down" not in logged, logged[-6000:]
    tok = _arith()
    eos = tok.eos_token_id
    chars = lambda text: [tok.convert_tokens_to_ids(ch) for ch in text]  # noqa: E731 - the arith vocabulary
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["batch_samples"] == 16.0 and r["train/update_successful"] == 1.0
        assert r["episode/turns"] == 2.0 and r["episode/broken_prefixes"] == 0.0 and r["episode/env_errors"] == 0.0
        assert r["train/onpolicy_abs_log_ratio_max"] < 1e-3
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 4 * 4 and sorted({e["step"] for e in episodes}) == [1, 2]
    by_ids = {}
    for line in map(json.loads, record.read_text().splitlines()):
        last = line["calls"][-1]
        by_ids[tuple(last["prompt_ids"] + last["output_ids"])] = line["calls"]
    rewards = set()
    for e in episodes:
        calls = by_ids[tuple(e["ids"])]  # the episode is its last call's prompt + the engine's generated ids
        assert len(calls) == 2 and e["turns"] == 2
        first, second = calls
        question = first["messages"][0]["content"]
        a, b = question.removeprefix("Q:").removesuffix("=").split("+")
        opening = [tok.bos_token_id] + chars(question)
        assert first["prompt_ids"] == opening and e["prompt_len"] == len(opening)
        turn1 = first["prompt_ids"] + first["output_ids"]
        assert second["prompt_ids"][:len(turn1)] == turn1  # the second call extends the first on exact ids
        closing = [] if first["output_ids"][-1:] == [eos] else [eos]
        assert second["prompt_ids"][len(turn1):] == closing + chars(" no " + question)
        generated = {*range(len(opening), len(turn1)),
                     *range(len(second["prompt_ids"]), len(second["prompt_ids"]) + len(second["output_ids"]))}
        assert e["loss_mask"] == [int(i in generated) for i in range(len(e["ids"]))]
        reply = second["output_ids"][:-1] if second["output_ids"][-1:] == [eos] else second["output_ids"]
        expected = 1.0 if str(int(a) + int(b)) in tok.decode(reply, skip_special_tokens=False) else -1.0
        assert e["reward"] == expected and e["passed"] == (expected == 1.0)
        rewards.add(e["reward"])
        assert [m["role"] for m in e["messages"]] == ["user", "assistant", "user", "assistant"]
        assert e["messages"][2]["content"] == " no " + question
    assert rewards <= {1.0, -1.0}
