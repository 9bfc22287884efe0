"""Synthetic arithmetic task and its HF tokenizer (the CPU demo, conf/experiment/demo.yaml)."""

from __future__ import annotations

import pytest

from scalerl_mega.data.tasks.arith import (
    arith_prompts,
    chain_of_thought,
    make_prompt,
    prompt_text,
    sample_problems,
    sft_examples,
    sft_token_ids,
    target_text,
)
from scalerl_mega.data.tasks.tokenizer import INTERRUPTION_PHRASE, arith_vocab, build_arith_tokenizer
from scalerl_mega.rewards.math import score_math


def test_traces_match_the_calibrated_format():
    assert prompt_text(47, 38) == "Q:47+38="
    assert target_text(47, 38) == "<think>7+8+0=15 4+3+1=8</think>\\boxed{85}"
    assert target_text(95, 17) == "<think>5+7+0=12 9+1+1=11 c1</think>\\boxed{112}"
    assert target_text(5, 999) == "<think>5+9+0=14 0+9+1=10 0+9+1=10 c1</think>\\boxed{1004}"
    assert target_text(3, 4) == "<think>3+4+0=7</think>\\boxed{7}"
    assert chain_of_thought(999, 1)[1] == 3


def test_generation_is_deterministic_disjoint_and_graded():
    tr, va = arith_prompts(num_train=3000, num_val=200, seed=0)
    tr2, va2 = arith_prompts(num_train=3000, num_val=200, seed=0)
    assert [p.prompt_id for p in tr] == [p.prompt_id for p in tr2] and [p.text for p in va] == [p.text for p in va2]
    assert len(tr) == 3000 and len(va) == 200
    assert not {p.text for p in tr} & {p.text for p in va}
    assert {p.meta["difficulty"] for p in tr} == {1, 2, 3}
    one = sample_problems(40, seed=1, max_digits=3, difficulty_weights=[1, 0, 0])
    assert all(a < 10 and b < 10 for a, b in one)
    with pytest.raises(ValueError, match="distinct"):
        sample_problems(1000, seed=0, max_digits=1)
    with pytest.raises(ValueError, match="difficulty_weights"):
        sample_problems(5, seed=0, max_digits=2, difficulty_weights=[1.0])


def test_sft_targets_are_scored_correct_by_the_math_verifier():
    tr, _ = arith_prompts(num_train=30, num_val=5, seed=3)
    for (prompt, target), p in zip(sft_examples(tr), tr):
        assert prompt == p.text
        assert score_math(target, p.gold).passed
        assert not score_math(target.replace("\\boxed{", "\\boxed{1"), p.gold).passed


def test_tokenizer_round_trip_and_hf_loading(tmp_path):
    from transformers import AutoTokenizer

    tok = build_arith_tokenizer()
    assert len(tok) == len(arith_vocab()) == 47
    text = prompt_text(47, 38) + target_text(47, 38)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    # <think>, </think> and \boxed{ are single tokens; everything else is one char per token
    assert len(ids) == 1 + len(text) - (len("<think>") - 1) - (len("</think>") - 1) - (len("\\boxed{") - 1)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.unk_token_id not in ids
    phrase = tok(INTERRUPTION_PHRASE, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in phrase and tok.decode(phrase) == INTERRUPTION_PHRASE
    tok.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert loaded(text)["input_ids"] == ids
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    p_ids, t_ids = sft_token_ids(loaded, make_prompt(47, 38))
    assert p_ids + t_ids[:-1] == ids and t_ids[-1] == loaded.eos_token_id
    assert len(p_ids) + len(t_ids) <= 48  # fits the calibrated generation cap
