"""`sft.checkpoint`: the fingerprint that decides whether a shared warm start may be reused, and the
load-or-run-and-save decision of `train._warm_start_or_load` (the warm start itself is replaced by a
recorder here; tests/integration/test_reproduce_sweep.py runs the real one)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scalerl_mega import train
from scalerl_mega.config import TrainConfig
from scalerl_mega.train import fingerprint_diff, sft_fingerprint


def test_fingerprint_diff_names_nested_and_missing_keys():
    a = {"seed": 0, "sft": {"lr": 1e-3, "steps": 250}, "model": {"hidden": 128}, "x": 1}
    b = {"seed": 0, "sft": {"lr": 2e-3, "steps": 250}, "model": {"hidden": 128, "layers": 4}}
    assert fingerprint_diff(a, b) == ["model.layers", "sft.lr", "x"]
    assert fingerprint_diff(a, a) == []


def _cfg(**changes) -> TrainConfig:
    c = TrainConfig()
    for path, value in changes.items():
        obj = c
        *parents, leaf = path.split("__")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, value)
    return c


def test_rl_only_groups_do_not_change_the_fingerprint():
    base = sft_fingerprint(_cfg())
    for change in ({"loss__name": "dapo"}, {"filter__name": "none"}, {"curriculum__name": "uniform"},
                   {"train__steps": 7}, {"sft__checkpoint": "/elsewhere"}, {"sft__eval_every": 3}):
        assert sft_fingerprint(_cfg(**change)) == base, change


def test_what_the_warm_start_depends_on_changes_it():
    base = sft_fingerprint(_cfg())
    assert fingerprint_diff(base, sft_fingerprint(_cfg(seed=1))) == ["seed"]
    assert fingerprint_diff(base, sft_fingerprint(_cfg(sft__lr=5e-4))) == ["sft.lr"]
    assert fingerprint_diff(base, sft_fingerprint(_cfg(data__val_prompts=7))) == ["data.val_prompts"]
    assert fingerprint_diff(base, sft_fingerprint(_cfg(model__hidden_size=96))) == ["model.hidden_size"]
    assert fingerprint_diff(base, sft_fingerprint(_cfg(train__micro_batch_tokens=99))) == ["micro_batch_tokens"]


def test_head_precision_counts_for_16_bit_params_only():
    """bf16 params: an FP32 head is another model (its own dtype); FP32 params: the head is FP32 either way."""
    bf16 = dataclasses.replace(TrainConfig().precision, params_dtype="bfloat16")
    fp32 = dataclasses.replace(bf16, params_dtype="float32")
    a = sft_fingerprint(_cfg(precision=bf16, model__fp32_lm_head=True))
    b = sft_fingerprint(_cfg(precision=bf16, model__fp32_lm_head=False))
    assert fingerprint_diff(a, b) == ["model.fp32_lm_head"]
    a = sft_fingerprint(_cfg(precision=fp32, model__fp32_lm_head=True))
    b = sft_fingerprint(_cfg(precision=fp32, model__fp32_lm_head=False))
    assert fingerprint_diff(a, b) == []


class FakeTrainer:
    """Records the calls `_warm_start_or_load` makes; `save` writes what `checkpoint.latest_step` reads
    (`latest` -> step dir with a COMPLETE marker), as the Megatron trainer's collective save does."""

    def __init__(self):
        self.calls = []

    def save(self, path, *, step=None, extra_state=None):
        root = Path(path)
        (root / "step_00000000").mkdir(parents=True, exist_ok=True)
        (root / "step_00000000" / "COMPLETE").write_text(json.dumps({"step": 0}))
        (root / "latest").write_text("step_00000000")
        self.calls.append(("save", str(root)))

    def load(self, path):
        self.calls.append(("load", str(path)))
        return {}

    def reset_optimizer(self):
        self.calls.append(("reset_optimizer",))


@pytest.fixture
def warm_starts(monkeypatch):
    ran = []
    monkeypatch.setattr(train, "_warm_start", lambda config, task, trainer, *, out: ran.append(int(config.seed)))
    return ran


def _run(cfg, tmp_path):
    t = FakeTrainer()
    train._warm_start_or_load(cfg, None, t, out=tmp_path / "run", channel=None)
    return t.calls


def test_first_run_writes_the_warm_start_the_next_loads_it(tmp_path, warm_starts):
    ck = str(tmp_path / "sft")
    cfg = _cfg(sft__steps=5, sft__checkpoint=ck)
    assert _run(cfg, tmp_path) == [("save", ck)] and warm_starts == [0]
    assert json.loads((tmp_path / "sft" / train.SFT_FINGERPRINT).read_text()) == sft_fingerprint(cfg)
    # another recipe, same seed: loaded, fresh optimizer, no warm start
    assert _run(_cfg(sft__steps=5, sft__checkpoint=ck, loss__name="dapo"), tmp_path) == \
        [("load", ck), ("reset_optimizer",)]
    assert warm_starts == [0]


def test_mismatch_is_an_error_naming_the_keys_unless_only_the_seed_and_any_seed(tmp_path, warm_starts):
    ck = str(tmp_path / "sft")
    _run(_cfg(sft__steps=5, sft__checkpoint=ck), tmp_path)
    with pytest.raises(ValueError, match=r"sft\.checkpoint=.*: seed differ"):
        _run(_cfg(seed=1, sft__steps=5, sft__checkpoint=ck), tmp_path)
    with pytest.raises(ValueError, match=r"sft\.lr differ"):
        _run(_cfg(seed=1, sft__steps=5, sft__lr=5e-4, sft__checkpoint=ck, sft__any_seed=True), tmp_path)
    assert _run(_cfg(seed=1, sft__steps=5, sft__checkpoint=ck, sft__any_seed=True), tmp_path) == \
        [("load", ck), ("reset_optimizer",)]
    assert warm_starts == [0]


def test_another_micro_batching_loads_the_same_warm_start(tmp_path, warm_starts, caplog):
    """micro_batch_tokens is in the fingerprint but changes only the summation order: the same-maths control
    (the reference batch in ~8 micro-batches) loads the reference's warm start."""
    import logging

    ck = str(tmp_path / "sft")
    _run(_cfg(sft__steps=5, sft__checkpoint=ck, train__micro_batch_tokens=16384), tmp_path)
    with caplog.at_level(logging.INFO, logger="scalerl_mega.train"):
        assert _run(_cfg(sft__steps=5, sft__checkpoint=ck, train__micro_batch_tokens=2048), tmp_path) == \
            [("load", ck), ("reset_optimizer",)]
    assert "micro_batch_tokens=16384, this run has 2048" in caplog.text
    assert warm_starts == [0]
    with pytest.raises(ValueError, match=r"sft\.lr differ"):  # other keys still refuse
        _run(_cfg(sft__steps=5, sft__lr=5e-4, sft__checkpoint=ck, train__micro_batch_tokens=2048), tmp_path)


def test_a_save_without_its_complete_checkpoint_is_redone(tmp_path, warm_starts):
    ck = tmp_path / "sft"
    ck.mkdir()
    (ck / train.SFT_FINGERPRINT).write_text("{}")  # killed after the fingerprint, before the save completed
    assert _run(_cfg(sft__steps=5, sft__checkpoint=str(ck)), tmp_path) == [("save", str(ck))]
    assert warm_starts == [0]
    # no sft.checkpoint: the plain warm start, nothing saved
    assert _run(_cfg(sft__steps=5), tmp_path) == [] and warm_starts == [0, 0]


def _grown(**changes) -> TrainConfig:
    """A small synthetic set (600 prompts, 50 held out) whose warm start trains on the first 300 of the draws."""
    return _cfg(**{"sft__steps": 5, "data__synthetic_num_prompts": 600, "data__val_prompts": 50,
                   "data__synthetic_max_digits": 3, "sft__synthetic_num_prompts": 300, **changes})


def test_a_warm_start_on_fewer_prompts_has_the_fingerprint_of_a_run_on_that_set():
    """sft.synthetic_num_prompts=N: the warm start is the one a run with data.synthetic_num_prompts=N writes, so
    the predictability design's warm start on its first 102,400 prompts is that of a run on them."""
    grown = _grown()
    small = _cfg(sft__steps=5, data__synthetic_num_prompts=300, data__val_prompts=50, data__synthetic_max_digits=3)
    assert sft_fingerprint(grown) == sft_fingerprint(small)
    assert fingerprint_diff(sft_fingerprint(_grown(sft__synthetic_num_prompts=0)), sft_fingerprint(small)) == \
        ["data.synthetic_num_prompts"]


def test_the_warm_start_trains_on_the_smaller_set_and_never_on_a_held_out_prompt(tmp_path, monkeypatch, caplog):
    import logging

    from scalerl_mega import build

    cfg = _grown()
    task = build.build_task(cfg)
    small = build.build_task(_cfg(data__synthetic_num_prompts=300, data__val_prompts=50, data__synthetic_max_digits=3))
    got = []
    monkeypatch.setattr(train, "_warm_start", lambda config, task, trainer, *, out: got.append(task))
    with caplog.at_level(logging.INFO, logger="scalerl_mega.train"):
        train._warm_start_or_load(cfg, task, FakeTrainer(), out=None, channel=None)
    (used,) = got
    assert [p.text for p in used.train_prompts] == [p.text for p in small.train_prompts]
    assert len(used.train_prompts) == 250 and len(task.train_prompts) == 550
    held = {p.text for p in task.val_prompts}
    assert not held & {p.text for p in used.train_prompts}
    # the held-out prompts of the larger set that lie in the first 300 draws are held out there too
    first300 = {p.text for p in small.train_prompts} | {p.text for p in small.val_prompts}
    shared = len(held & first300)
    assert 0 < shared == len(held & {p.text for p in small.val_prompts})
    assert f"({shared} held out there too)" in caplog.text
    # without the key, the warm start uses the run's own task
    got.clear()
    train._warm_start_or_load(_grown(sft__synthetic_num_prompts=0), task, FakeTrainer(), out=None, channel=None)
    assert got == [task]


def test_a_held_out_prompt_among_the_warm_starts_training_prompts_is_an_error():
    from scalerl_mega import build

    cfg = _grown()
    task = build.build_task(cfg)
    small = build.build_task(_cfg(data__synthetic_num_prompts=300, data__val_prompts=50, data__synthetic_max_digits=3))
    leak = small.train_prompts[7]
    task.val_prompts = [*task.val_prompts[:-1], leak]  # e.g. another held-out rule
    with pytest.raises(ValueError, match=r"sft\.synthetic_num_prompts=300: 1 of this run's 50 held-out prompts .* "
                                         + repr(leak.text).replace("+", r"\+")):
        train.warm_start_task(cfg, task)


@pytest.mark.parametrize("changes,match", [
    ({"sft__synthetic_num_prompts": 700}, r"sft\.synthetic_num_prompts=700 needs .* <= data\.synthetic_num_prompts=600"),
    ({"sft__synthetic_num_prompts": 50}, r"sft\.synthetic_num_prompts=50 needs .*data\.val_prompts=50 < it"),
    ({"data__name": "polaris"}, r"sft\.synthetic_num_prompts=300 needs data\.name=synthetic \(is 'polaris'\)"),
])
def test_the_prompt_count_is_checked_against_the_data_config(changes, match):
    """(the predictability design's valid setting passes `validate`: tests/unit/test_config.py)"""
    from scalerl_mega.config.tree import _validate_across_groups

    with pytest.raises(ValueError, match=match):
        _validate_across_groups(_grown(**changes))
