"""`sft.checkpoint`: the fingerprint that decides whether a shared warm start may be reused."""

from __future__ import annotations

import dataclasses

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
