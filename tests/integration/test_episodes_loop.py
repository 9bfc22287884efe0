"""`scalerl-train env=custom` end to end (Megatron-Core trainer, the local engine process, the environment on the
episodes' own threads): one sample per episode through the groups, the batch and the optimizer step; `episodes.jsonl`; the
episode metrics; and the on-policy agreement of a multi-turn run at PPO-off-policy k=1 in FP32: every generated
token of every episode (turn 2 included, after spliced environment ids) has the trainer's log-prob within 1e-3 of
the engine's (asserted by the loop itself, `metrics.mismatch_mode=assert`), with rollout routing replay of the
routes each turn's forward chose."""

from __future__ import annotations

import json

from tests.integration.test_loop_megatron import run_train

EPISODES = [
    "env=custom", "env.chat_template=arith", "env.max_turns=2", "env.max_tokens=64",
    "env.custom._target_=scalerl_mega.episodes.examples.RetryArithmetic", "+env.custom.kwargs.attempts=2",
    "length=penalty", "length.penalty_max_len=1000", "length.penalty_cache_len=4",  # no penalty: rewards as the env gave
    "off_policy=ppo_off_policy", "off_policy.k=1", "train.val_every=0", "metrics.dump_episodes=true",
    "metrics.max_logprob_mismatch=1e-3", "metrics.mismatch_mode=assert",
    "moe.routing_replay=ids",  # the demo's MoE replays every turn's routes (episodes/driver.py concat_routes)
]


def _arith_ids(text: str) -> list[int]:
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    tok = build_arith_tokenizer()
    return [tok.convert_tokens_to_ids(ch) for ch in text]


def test_episodes_train_end_to_end_on_policy_at_ppo_k1(tmp_path):
    out = tmp_path / "run"
    run_train(out, *EPISODES)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    onpol = [r["train/onpolicy_abs_log_ratio_max"] for r in train if "train/onpolicy_abs_log_ratio_max" in r]
    assert len(onpol) == 4 and max(onpol) < 1e-3
    print(f"multi-turn on-policy max |logprob diff| = {max(onpol):.3g}")
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 * 4 * 4 and sorted({e["step"] for e in episodes}) == [1, 2, 3, 4]
    two = 0
    for e in episodes:
        ids, mask, msgs = e["ids"], e["loss_mask"], e["messages"]
        assert len(ids) == len(mask) and e["turns"] in (1, 2) and msgs[0]["role"] == "user"
        question = msgs[0]["content"]
        assert ids[:e["prompt_len"]] == [1] + _arith_ids(question) and not any(mask[:e["prompt_len"]])
        assert [m["role"] for m in msgs].count("assistant") == e["turns"]
        assert e["passed"] == (e["reward"] == 1.0)
        if e["finish_reason"] == "length" and e["turns"] == 1:  # truncated after a wrong first try
            assert e["reward"] in (0.0, 1.0)
        else:  # solved (1) or wrong twice (-1)
            assert e["reward"] in (1.0, -1.0)
        if e["turns"] == 2:  # the feedback is spliced as the template's ids, loss mask 0
            two += 1
            feedback = _arith_ids(" no " + question)
            zeros = [i for i, m in enumerate(mask) if i >= e["prompt_len"] and m == 0]
            assert [ids[i] for i in zeros] == feedback and zeros == list(range(zeros[0], zeros[0] + len(feedback)))
    assert two > 0
    for r in train:
        assert 1.0 <= r["episode/turns"] <= 2.0 and r["episode/env_errors"] == 0.0
        assert r["episode/length"] == r["episode/generated_tokens"] + r["episode/env_tokens"]
    assert any(r["episode/turns"] > 1.0 for r in train)
