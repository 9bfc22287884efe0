"""The multi-turn demo's environment (episodes/examples.py `LookupArithmetic`): its rules as the docs state them
(a pass needs the number the environment gives after the request; a blind answer passes only for the one hidden
number it guesses, with the probability computed exactly from the synthetic task's draw), its messages in the
demo tokenizer's alphabet, its warm-start traces (episodes/demonstrations.py), the pass rate by turn
(`val_window.pass_at_turn`) on hand-made episode records, and the start banner's environment line."""

from __future__ import annotations

from fractions import Fraction

import pytest

from scalerl_mega.data.tasks.arith import target_text
from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer
from scalerl_mega.episodes.examples import LookupArithmetic
from scalerl_mega.episodes.template import ChatSplicer

TOK = build_arith_tokenizer()
UNK = TOK.unk_token_id


def _row(a: int, b: int) -> dict:
    return {"prompt": f"Q:{a}+{b}=", "gold": str(a + b), "prompt_id": "p", "task": "synthetic"}


def _support() -> dict[int, Fraction]:
    """The synthetic draw of one operand (data/tasks/arith.py `sample_problems`, 3 digits, uniform weights), by
    hand: a digit count of 1, 2 or 3 with probability 1/3 each, then a value uniform among 0-9, 10-99 or 100-999."""
    out = {}
    for lo, hi in ((0, 9), (10, 99), (100, 999)):
        for v in range(lo, hi + 1):
            out[v] = Fraction(1, 3) / (hi - lo + 1)
    return out


def test_the_protocol_passes_at_turn_two_with_the_environments_number():
    env = LookupArithmetic()
    assert env.reset(_row(47, 385)) == [{"role": "user", "content": "Q:47+k="}]  # the second number is hidden
    assert env.step("ask") == ([{"role": "user", "content": "k=385"}], 0.0, False)
    assert env.step("<think>7+5+0=12 4+8+1=13 0+3+1=4</think>\\boxed{432}") == ([], 1.0, True)
    env.reset(_row(47, 385))
    env.step("ask")
    assert env.step("<think></think>\\boxed{431}") == ([], -1.0, True)  # a wrong sum after the lookup
    env.reset(_row(47, 385))
    assert env.step("\\boxed{432}") == ([], -1.0, True)  # no `</think>`: no answer, no request
    env.reset(_row(47, 385))
    env.step("ask")
    assert env.step("ask") == ([], -1.0, True)  # one lookup per episode (asks=1)
    assert LookupArithmetic(asks=2).reset(_row(1, 2)) == [{"role": "user", "content": "Q:1+k="}]
    with pytest.raises(ValueError, match="is not 'Q:<a>\\+<b>='"):
        env.reset({"prompt": "What is 2+2?", "gold": "4"})
    with pytest.raises(ValueError, match="asks=0"):
        LookupArithmetic(asks=0)


def test_a_blind_answer_passes_only_for_the_hidden_number_it_guesses():
    support = _support()
    assert sum(support.values()) == 1
    a = 47
    best = Fraction(0)
    for guess in (47, 52, 56, 85, 146, 1046, 7):
        passing = []
        for b in support:
            env = LookupArithmetic()
            env.reset(_row(a, b))
            _, reward, done = env.step(f"<think></think>\\boxed{{{guess}}}")
            assert done
            if reward == 1.0:
                passing.append(b)
        assert passing == ([guess - a] if 0 <= guess - a <= 999 else [])
        p = sum((support[b] for b in passing), Fraction(0))
        best = max(best, p)
    # the best blind answer guesses a one-digit hidden number: 1/3 x 1/10
    assert best == Fraction(1, 30)


def test_every_message_is_in_the_demo_tokenizers_alphabet():
    env = LookupArithmetic()
    for a, b in ((0, 0), (999, 999), (47, 385), (5, 60)):
        messages = env.reset(_row(a, b)) + env.step("ask")[0]
        for m in messages:
            ids = TOK(m["content"], add_special_tokens=False)["input_ids"]
            assert UNK not in ids and TOK.decode(ids) == m["content"]
    for text in ("ask", target_text(47, 385)):
        assert UNK not in TOK(text, add_special_tokens=False)["input_ids"]


def test_the_warm_start_traces_are_the_protocol_spliced_with_the_environment_unmasked():
    from scalerl_mega.episodes.demonstrations import demonstration, has_demonstrations
    from scalerl_mega.sft import sft_batch

    splicer = ChatSplicer(TOK, template="arith", stop_token_ids=[TOK.eos_token_id])
    prompt, target, mask = demonstration(LookupArithmetic(), _row(47, 385), splicer, correct=1.0)
    ids = lambda s: TOK(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = TOK.eos_token_id
    assert prompt == [TOK.bos_token_id, *ids("Q:47+k=")]
    cot = ids(target_text(47, 385))
    assert target == [*ids("ask"), eos, *ids("k=385"), *cot, eos]
    assert mask == [1, 1, 1, 1] + [0] * 5 + [1] * (len(cot) + 1)
    assert has_demonstrations(LookupArithmetic) and not has_demonstrations(object)

    class Wrong(LookupArithmetic):
        def reference_replies(self, task):
            return ["ask", "<think></think>\\boxed{1}"]

    with pytest.raises(ValueError, match="do not pass: reward -1"):
        demonstration(Wrong(), _row(47, 385), splicer, correct=1.0)
    batch = sft_batch([(prompt, target, mask), (prompt, target)])  # with and without a mask
    P = len(prompt)
    assert batch.loss_mask_BT[0, P - 1:P - 1 + len(target)].tolist() == [float(m) for m in mask]
    assert batch.loss_mask_BT[1, P - 1:P - 1 + len(target)].tolist() == [1.0] * len(target)
    assert batch.loss_mask_BT[0].sum().item() == sum(mask)
    with pytest.raises(ValueError, match="loss mask of 3"):
        sft_batch([(prompt, target, [1, 1, 1])])


def test_pass_at_turn_on_hand_made_episode_records():
    from scalerl_mega.metrics.val_window import pass_at_turn, val_metrics

    # (turns, passed): 2 pass at turn 1, 3 at turn 2, 1 at turn 3; 4 fail
    records = [(1, True), (1, True), (2, True), (2, True), (2, True), (3, True), (1, False), (2, False),
               (2, False), (3, False)]
    got = pass_at_turn(records, max_turns=3)
    assert got == {"episode/pass_at_turn_1": 0.2, "episode/pass_at_turn_2": 0.3, "episode/pass_at_turn_3": 0.1}
    assert pass_at_turn(records, max_turns=2)["episode/pass_at_turn_2"] == 0.4  # a 3rd turn counts at the cap
    # validation outcomes: [index, domain, passed, reward, truncated, version, turns]; six fields: one turn
    outcomes = [[0, "synthetic", 1, 1.0, 0, 0.0, 2], [0, "synthetic", 0, -1.0, 0, 0.0, 2],
                [1, "synthetic", 1, 1.0, 0, 0.0], [1, "synthetic", 0, -1.0, 0, 0.0, 1]]
    vm = val_metrics(outcomes, max_turns=2)
    assert (vm["val_pass_rate"], vm["episode/pass_at_turn_1"], vm["episode/pass_at_turn_2"]) == (0.5, 0.25, 0.25)
    assert not any(k.startswith("episode/") for k in val_metrics(outcomes))  # single-turn runs: none
    with pytest.raises(ValueError, match="no episodes"):
        pass_at_turn([], max_turns=2)


def test_the_banner_names_the_environment_and_its_turns():
    from scalerl_mega.run_dir import start_banner
    from tests.unit.test_config import _compose

    lines = start_banner(_compose("experiment=demo_multiturn")).splitlines()
    assert lines[-1] == ("  env     custom: scalerl_mega.episodes.examples.LookupArithmetic(); at most 2 turns and "
                         "64 ids per episode, chat template arith")
    lines = start_banner(_compose("experiment=demo", "env=custom", "+env.custom.kwargs.attempts=3",
                                  "env.max_turns=3")).splitlines()
    assert lines[-1].startswith("  env     custom: scalerl_mega.episodes.examples.RetryArithmetic(attempts=3); "
                                "at most 3 turns and 144 ids")
    assert not any(line.startswith("  env ") for line in start_banner(_compose("experiment=demo")).splitlines())


def test_report_states_the_pass_rate_by_turn_at_the_first_and_last_validation(tmp_path):
    import json

    from scalerl_mega.report import write_report

    rows = [{"kind": "validation", "step": s, "compute_device_hours": c, "val_pass_rate": p1 + p2,
             "episode/pass_at_turn_1": p1, "episode/pass_at_turn_2": p2}
            for s, c, p1, p2 in ((0, 0.01, 0.0, 0.35), (10, 0.02, 0.0025, 0.5), (20, 0.03, 0.005, 0.6))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(tmp_path, title="t").read_text()
    assert "- passed at turn 1 (share of validation episodes): 0.000 at step 0 -> 0.005 at step 20\n" in md
    assert "- passed at turn 2 (share of validation episodes): 0.350 at step 0 -> 0.600 at step 20\n" in md
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "metrics.jsonl").write_text(
        json.dumps({"kind": "validation", "step": 0, "compute_device_hours": 0.01, "val_pass_rate": 0.5}) + "\n")
    assert "passed at turn" not in write_report(tmp_path / "single", title="t").read_text()
