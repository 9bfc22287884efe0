"""The pure pieces of tools/gpu_check.sh: pytest's summary line, the head entry, the RL resume comparison
(bench/gpu_summary.py, bench/rl_loop.py) and the MFU arithmetic (metrics/compute.py), on hand-made inputs."""

from __future__ import annotations

import importlib.util
import json
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
    assert gs.pytest_counts(log) == {"summary_line": True, "passed": 22, "failed": 1, "skipped": 2, "errors": 1}
    assert gs.pytest_counts("25 skipped in 4.77s") == {"summary_line": True, "passed": 0, "failed": 0,
                                                       "skipped": 25, "errors": 0}
    # killed mid-suite: progress dots and a test's own "3 passed" output, no summary line: no counts, not zeros
    assert gs.pytest_counts("") == {"summary_line": False}
    assert gs.pytest_counts("....F\nlog: 3 passed the check\n..") == {"summary_line": False}


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
    near = rl.resume_check(a, [_rec(3, 0.3), _rec(4, 0.2 * (1 + 5e-6))])
    assert near["matched"] and near["loss_rel_diff"] == pytest.approx(5e-6, rel=1e-6)  # within RESUME_LOSS_TOL
    bits = rl.resume_check(a, [_rec(3, 0.3), _rec(4, 0.2, sha="y")])
    assert not bits["weights_bitwise"] and not bits["matched"]  # same losses, weights differ in bits: counts
    assert not rl.resume_check(a, [_rec(3, 0.3, sha=None)])["matched"]  # no digest at a compared step
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


DEVICE = {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "megatron-core": "0.19.2", "cuda": "13.0"}
"""The first H200 session's software (bench/results/2026-11-28_h200/README.md) with this kit's megatron-core."""


def test_version_mismatches_against_the_rehearsed_ranges():
    gs = _load("gpu_summary")
    assert gs.version_mismatches(DEVICE, mode="gpu") == []
    assert gs.version_mismatches({**DEVICE, "torch": "2.14.1"}, mode="gpu") == []  # the range's top, inclusive
    found = {**DEVICE, "torch": "2.10.0+cu128", "triton": "3.5.1", "megatron-core": None, "cuda": "12.8"}
    assert gs.version_mismatches(found, mode="gpu") == [
        "torch 2.10.0+cu128 is outside the rehearsed 2.11 .. 2.14.1", "triton 3.5.1 is outside the rehearsed 3.6 .. 3.9",
        "megatron-core: not installed (rehearsed 0.16.1 .. 0.19.2)", "cuda 12.8 is outside the rehearsed 13.0 .. 13.0"]
    assert gs.version_mismatches({**DEVICE, "python": "3.13.0", "cuda": None}, mode="cpu") == [
        "python 3.13.0 is outside the rehearsed 3.11 .. 3.12"]  # CPU: no CUDA to compare
    assert gs.version_mismatches(None, mode="gpu") == ["no versions were recorded"]


def test_summary_of_a_killed_run_names_what_finished(tmp_path):
    """The exit trap's summary after a kill in the GPU suite: versions done, install skipped, the suite killed with
    no pytest summary line, the head and RL stages not reached; a cut last line of stages.jsonl is ignored."""
    gs = _load("gpu_summary")
    (tmp_path / "versions.txt").write_text("mode gpu\nversions " + json.dumps(DEVICE) + "\n")
    events = [{"stage": "versions", "status": "running", "limit_s": 40},
              {"stage": "versions", "status": "done", "rc": 0, "wall_s": 6},
              {"stage": "install", "status": "skipped"}, {"stage": "gpu_suite", "status": "running", "limit_s": 180},
              {"stage": "gpu_suite", "status": "killed", "rc": 143}]
    (tmp_path / "stages.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"stage": "he')
    (tmp_path / "gpu_suite.log").write_text("tests/gpu/test_megatron_gpu.py ..")
    s = gs.summarize(tmp_path, mode="gpu")
    assert {k: v["status"] for k, v in s["stages"].items()} == {
        "versions": "done", "install": "skipped", "gpu_suite": "killed", "head": "not reached",
        "rl_loop": "not reached"}
    assert s["stages"]["gpu_suite"]["rc"] == 143 and s["version_mismatches"] == []
    assert s["gpu_suite"] == {"summary_line": False} and s["head"] == {"measured": False}
    assert s["rl_loop"] == {"measured": False} and s["ok"] is False


def test_rl_loop_keeps_run_a_table_when_the_resume_fails(tmp_path, monkeypatch):
    """bench/rl_loop.py writes run A's step table before run B starts; a failed run B leaves it, with why."""
    rl = _load("rl_loop")
    runs = []

    def fake_run_train(out, overrides, *, log, timeout_s, triton_cache):
        runs.append((out.name, timeout_s, triton_cache))
        if out.name == "b":
            assert json.loads((tmp_path / "rl.json").read_text())["run_b"] == "not started"
            raise RuntimeError("run b timed out after 10 s")
        return 12.5

    rec = {"batch/prompt_tokens_mean": 3.0, "batch/gen_lengths": [2, 4], "timing/train_step_s": 0.5, "step_s": 2.0,
           "batch/tokens": 13.0, "generated_tokens": 6.0, "tokens_per_s": 3.0, "gen/decode_tokens": 6.0,
           "gen/busy_s": 1.5, "weight_sync_s": 0.25, "train/loss": 0.5}
    m = ModelConfig(vocab_size=100, hidden_size=8, ffn_hidden_size=16, num_layers=2, num_attention_heads=2,
                    num_query_groups=1)
    monkeypatch.setattr(rl, "run_train", fake_run_train)
    monkeypatch.setattr(rl, "_train_records", lambda run: [{**rec, "step": 1}, {**rec, "step": 2}])
    monkeypatch.setattr(rl, "_model", lambda run: m)
    monkeypatch.setattr(rl, "_run_config", lambda run: {"precision": {"params_dtype": "bfloat16"}})
    with pytest.raises(RuntimeError, match="run b timed out"):
        rl.main(["--cpu", "--work", str(tmp_path / "w"), "--json", str(tmp_path / "rl.json"), "--budget", "100"])
    out = json.loads((tmp_path / "rl.json").read_text())
    assert out["run_b"] == "run b timed out after 10 s" and out["resume"] is None and out["resume_matched"] is None
    assert out["params_dtype"] == "bfloat16" and [r["step"] for r in out["per_step"]] == [1, 2]
    assert out["per_step"][0]["train_tokens_per_s"] == pytest.approx(13.0 / 0.5)
    assert out["per_step"][0]["engine_tokens_per_s"] == pytest.approx(6.0 / 1.5)
    # run A gets its share of the budget, run B what is left; both share one Triton cache (pinned autotuning)
    assert [r[0] for r in runs] == ["a", "b"] and runs[0][1] == pytest.approx(rl.A_SHARE * 100)
    assert 0 < runs[1][1] <= 100
    assert runs[0][2] == runs[1][2] == tmp_path / "w" / "triton-cache"
