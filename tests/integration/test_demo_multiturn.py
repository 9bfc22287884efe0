"""`scalerl-train experiment=demo_multiturn` end to end at toy size (slow): the warm start on the protocol's traces,
then RL steps on `LookupArithmetic` episodes. Checked from the run's own output: every episode opens with the
hidden number (`Q:<a>+k=`); an episode that asked got exactly `k=<b>` spliced with loss mask 0; every passing
episode passed at turn 2 with the sum of the prompt's two numbers (none of these can pass blind); validation
reports the pass rate by turn, whose shares sum to the pass rate; report.md states them."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.test_loop_megatron import run_train

pytestmark = pytest.mark.slow

SMALL = [
    "experiment=demo_multiturn", "sft.steps=40", "sft.synthetic_num_prompts=400", "sft.batch_size=32",
    "data.synthetic_num_prompts=400", "data.val_prompts=8", "data.val_samples=2", "train.steps=2",
    "train.prompts_per_step=4", "train.generations_per_prompt=4", "train.val_every=2", "train.save_every=0",
    "filter=none", "metrics.dump_episodes=true", "metrics.tensorboard=false",
]


def _ids(text: str) -> list[int]:
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    return build_arith_tokenizer()(text, add_special_tokens=False)["input_ids"]


def test_demo_multiturn_trains_episodes_that_need_the_environments_number(tmp_path):
    out = tmp_path / "run"
    run_train(out, *SMALL)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in lines if r["kind"] == "validation"]
    assert [r["step"] for r in val] == [0, 2]
    for r in val:
        shares = [r["episode/pass_at_turn_1"], r["episode/pass_at_turn_2"]]
        assert sum(shares) == pytest.approx(r["val_pass_rate"], abs=1e-12)
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 4 * 4
    asked = 0
    for e in episodes:
        msgs, ids, mask = e["messages"], e["ids"], e["loss_mask"]
        m = re.fullmatch(r"Q:(\d+)\+k=", msgs[0]["content"])
        assert m and msgs[0]["role"] == "user"
        a = int(m.group(1))
        if e["turns"] == 2:
            asked += 1
            lookup = msgs[2]["content"]
            b = int(re.fullmatch(r"k=(\d+)", lookup).group(1))
            start = mask.index(0, e["prompt_len"])  # the first ids after the first reply not trained
            end = mask.index(1, start)  # (a forced interruption's phrase, later, is not trained either)
            assert ids[start:end] == _ids(lookup)  # the lookup is spliced, never trained
            if e["passed"]:
                assert msgs[3]["content"].endswith(f"\\boxed{{{a + b}}}")
        assert e["passed"] == (e["reward"] == 1.0)
    assert asked > 0
    report = (out / "report.md").read_text()
    assert "- passed at turn 2 (share of validation episodes):" in report
