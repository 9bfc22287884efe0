"""The pure pieces of tools/gpu_check.sh: pytest's summary line, the head entry, the RL resume comparison
(bench/gpu_summary.py, bench/rl_loop.py) and the MFU arithmetic (metrics/compute.py), on hand-made inputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from scalerl_mega.metrics.compute import dense_bf16_peak_tflops, train_flops
from scalerl_mega.model.config import ModelConfig

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pytest_counts_read_the_last_summary_line():
    gs = _load("gpu_summary")
    log = "x\n3 passed in 1s\n....F.s\n=== 1 failed, 22 passed, 2 skipped, 1 error in 190.2s ===\n"
    assert gs.pytest_counts(log) == {"passed": 22, "failed": 1, "skipped": 2, "errors": 1}
    assert gs.pytest_counts("25 skipped in 4.77s") == {"passed": 0, "failed": 0, "skipped": 25, "errors": 0}
    assert gs.pytest_counts("") == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}


def test_head_entry_is_the_trainer_at_the_largest_shape():
    gs = _load("gpu_summary")
    err = {"err_loss_rel": 1e-7, "err_logp_abs": 3e-6, "err_grad_h_rel": 4e-6, "err_grad_w_rel": 1e-6}
    rows = [dict(variant="naive", N=256, H=8, V=16, time_s=1.0, peak_gib=1.0),
            dict(variant="trainer", N=256, H=8, V=16, time_s=9.0, peak_gib=1.0, **err),
            dict(variant="naive", N=16384, H=4096, V=131072, time_s=1.0, peak_gib=24.0),
            dict(variant="trainer", N=16384, H=4096, V=131072, time_s=0.4, peak_gib=3.0, **err),
            dict(variant="triton", N=16384, H=4096, V=131072, time_s=1.13, peak_gib=2.75)]
    h = gs.head_summary(rows)
    assert h["shape"] == [16384, 4096, 131072] and h["within_bounds"]
    assert h["time_over_naive"] == pytest.approx(0.4) and h["mem_over_naive"] == pytest.approx(0.125)
    assert h["tf32x3_time_over_naive"] == pytest.approx(1.13)
    rows[3] = {**rows[3], "err_grad_h_rel": 3e-5}  # above the GPU suite's 2e-5 for FP32 gradients
    assert not gs.head_summary(rows)["within_bounds"]
    assert gs.head_summary([]) == {"measured": False}


def _rec(step, loss, prompts=("a", "b"), tokens=10.0, sha="x"):
    return {"step": step, "train/loss": loss, "prompt_ids": list(prompts), "generated_tokens": tokens,
            "gen/weights_sha256": sha}


def test_resume_check_matches_only_the_same_prompts_tokens_and_losses():
    rl = _load("rl_loop")
    a = [_rec(1, 0.5), _rec(2, 0.4), _rec(3, 0.3), _rec(4, 0.2)]
    same = rl.resume_check(a, [_rec(3, 0.3), _rec(4, 0.2)])
    assert same["matched"] and same["weights_bitwise"] and same["steps"] == [3, 4]
    near = rl.resume_check(a, [_rec(3, 0.3), _rec(4, 0.2 * (1 + 5e-6), sha="y")])
    assert near["matched"] and not near["weights_bitwise"]  # within RESUME_LOSS_TOL, weights differ in bits
    assert not rl.resume_check(a, [_rec(3, 0.3), _rec(4, 0.201)])["matched"]  # a lost Adam state moves it
    assert not rl.resume_check(a, [_rec(3, 0.3, prompts=("a", "c"))])["matched"]
    assert not rl.resume_check(a, [_rec(3, 0.3, tokens=11.0)])["matched"]
    assert not rl.resume_check(a, [_rec(5, 0.3)])["matched"]
    assert not rl.resume_check(a, [])["matched"]


def test_train_flops_by_hand():
    m = ModelConfig(vocab_size=100, hidden_size=8, ffn_hidden_size=16, num_layers=2, num_attention_heads=2,
                    num_query_groups=1)
    # per layer: q 8*2*4 + k,v 2*8*1*4 + o 2*4*8 + norms 2*8 = 64+64+64+16 = 208; MLP 3*8*16 = 384 -> 592
    # matmul parameters: 2 layers (1184) + final norm 8 + LM head 100*8 (the input embedding is a lookup)
    p = 2 * 592 + 8 + 800
    assert m.num_params()["total"] == p + 800
    d = 2 * 4
    assert train_flops(m, [3, 5]) == pytest.approx(6 * p * 8 + 6 * 2 * d * (9 + 25))
    assert dense_bf16_peak_tflops("NVIDIA H200") == 989.0 and dense_bf16_peak_tflops("NVIDIA GB200") == 2500.0
    assert dense_bf16_peak_tflops("cpu") is None
