"""Memory planner: byte counts recomputed by hand from the formulas in the module docstring."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scalerl_mega.cluster import plan as P

ROOT = Path(__file__).resolve().parents[2]

TINY = P.ModelShape(name="tiny", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=1000)
BIG_DEVICE = P.Device(name="big", capacity_bytes=10**12, runtime_reserve_bytes=0)


def test_tiny_dense_by_hand():
    lay = P.TrainLayout(tp=2, pp=1, dp=2, seq_len=32, micro_batch=1, recompute="selective", fp32_head=False,
                        vocab_divisible_by=128)
    rep = P.trainer_memory(TINY, lay, BIG_DEVICE)
    # parameters on one GPU
    vpad = 1024  # ceil(1000 / (128*2)) * 256
    attn = 64 * 64 + 64 * 64 + 2 * 64 * 32  # q, o, k, v (kv dim = 2 heads * 16)
    mlp = 3 * 64 * 128
    per_gpu = 2 * (attn + mlp) // 2 + 2 * 2 * 64 + vpad * 64 // 2 * 2 + 64
    assert per_gpu == 102720
    assert rep.components["weights_bf16"] == 2 * per_gpu
    assert rep.components["grads_fp32"] == 4 * per_gpu
    assert rep.components["optimizer_fp32"] == 12 * per_gpu // 2
    # activations, N = 32 tokens, SP over t = 2
    n, h = 32, 64
    seq_region = (2 * 2 * n * h + 2 * n * h + 2 * n * h) / 2
    attn_act = 2 * n * h + 2 * 2 * n * 32 + 2 * n * h + 4 * 4 * n  # Q, K+V, O, fp32 lse
    mlp_act = 3 * 2 * n * 128
    layer = seq_region + (attn_act + mlp_act) / 2
    head = 2 * n * h / 2 + 2 * n * h / 2 + 4 * n * vpad / 2
    assert rep.components["activations"] == 2 * layer + head == 123392
    assert rep.fits


def test_no_recompute_adds_softmax_term_per_layer():
    lay = P.TrainLayout(tp=2, seq_len=32, recompute="selective")
    sel = P.layer_activation_bytes(TINY, lay, moe=False)
    none = P.layer_activation_bytes(TINY, replace(lay, recompute="none"), moe=False)
    a, s, b, t = 4, 32, 1, 2
    # Korthikanti's 5as^2b without the dropout terms is 2as^2b (softmax output, bf16); the selective
    # variant keeps the fp32 log-sum-exp 4*a*s*b instead.
    assert none - sel == (2 * a * s * s * b - 4 * a * s * b) // t


def test_full_recompute_and_no_sp():
    lay = P.TrainLayout(tp=2, seq_len=32, recompute="full")
    assert P.layer_activation_bytes(TINY, lay, moe=False) == 2 * 32 * 64 // 2
    nosp = P.TrainLayout(tp=2, seq_len=32, sequence_parallel=False)
    sp = P.TrainLayout(tp=2, seq_len=32)
    # without SP the 8Nh bytes of the norm/QKV/MLP inputs are replicated instead of split
    diff = P.layer_activation_bytes(TINY, nosp, moe=False) - P.layer_activation_bytes(TINY, sp, moe=False)
    assert diff == 8 * 32 * 64 - 8 * 32 * 64 // 2


@pytest.mark.parametrize("dp", [1, 2, 8])
def test_megatron_bytes_per_param_table(dp):
    """Megatron-Core dist-optimizer guide: bf16 params + fp32 grads = 18 B/param, or 6 + 12/d."""
    lay = P.TrainLayout(dp=dp, seq_len=8, fp32_head=False)
    n_params = sum(P.trainer_params_per_gpu(TINY, lay))
    rep = P.trainer_memory(TINY, lay, BIG_DEVICE)
    static = ("weights_bf16", "grads_fp32", "optimizer_fp32")
    assert sum(rep.components[c] for c in static) == n_params * 6 + n_params * 12 // dp
    rep2 = P.trainer_memory(TINY, replace(lay, distributed_optimizer=False), BIG_DEVICE)
    assert sum(rep2.components[c] for c in static) == 18 * n_params


def test_tiny_moe_expert_sharding_by_hand():
    moe = P.ModelShape(name="tmoe", hidden=32, layers=2, heads=2, kv_heads=2, head_dim=16, ffn=64, vocab=256,
                       num_experts=4, top_k=1, expert_ffn=48, shared_expert_ffn=48)
    lay = P.TrainLayout(tp=1, pp=1, dp=4, ep=2, seq_len=8, fp32_head=False)
    non_expert, expert = P.trainer_params_per_gpu(moe, lay)
    attn = 4 * 32 * 32  # q, o, k, v, all 32x32
    shared = 3 * 32 * 48
    router = 32 * 4
    assert non_expert == 2 * (attn + shared + 2 * 32 + router) + 256 * 32 * 2 + 32
    assert expert == 2 * (4 // 2) * 3 * 32 * 48
    rep = P.trainer_memory(moe, lay, BIG_DEVICE)
    # expert optimizer states shard over edp = tp*dp/ep = 2; the rest over dp = 4
    assert rep.components["optimizer_fp32"] == 12 * non_expert // 4 + 12 * expert // 2
    n = 8
    layer = 8 * n * 32 + (2 * n * 32 + 4 * n * 32 + 2 * n * 32 + 4 * 2 * n) + 4 * n * 4 \
        + n * 1 * (4 * 32 + 6 * 48) + 6 * n * 48 + 2 * n * 32
    assert P.layer_activation_bytes(moe, lay, moe=True) == layer


def test_fp32_head_bytes_by_hand():
    """FP32 head: output layer weights 4 B and no FP32 main copy (8 B of Adam moments, sharded)."""
    lay = P.TrainLayout(tp=1, pp=2, dp=2, seq_len=8)
    first, last = P.stage_params(TINY, lay, 0), P.stage_params(TINY, lay, 1)
    layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # attention, MLP, two norms
    assert first == {"body": layer + 1000 * 64, "head": 0, "expert": 0}
    assert last == {"body": layer + 64, "head": 1000 * 64, "expert": 0}
    got = P.stage_static_bytes(TINY, lay, 1)
    assert got == {"weights": 2 * (layer + 64) + 4 * 64000, "grads": 4 * (layer + 64 + 64000),
                   "optimizer": (12 * (layer + 64) + 8 * 64000) // 2}
    bf16 = P.stage_static_bytes(TINY, replace(lay, fp32_head=False), 1)
    assert bf16["weights"] == 2 * (layer + 64 + 64000) and bf16["optimizer"] == 12 * (layer + 64 + 64000) // 2


def test_expert_tensor_parallel_splits_experts_and_edp():
    moe = P.ModelShape(name="tmoe", hidden=32, layers=2, heads=2, kv_heads=2, head_dim=16, ffn=64, vocab=256,
                       num_experts=4, top_k=1, expert_ffn=48, shared_expert_ffn=48)
    one = P.TrainLayout(tp=2, dp=4, ep=2, etp=1)
    two = replace(one, etp=2)
    assert (one.edp, two.edp) == (4, 2)
    assert P.stage_params(moe, one, 0)["expert"] == 2 * P.stage_params(moe, two, 0)["expert"] == 2 * 2 * 3 * 32 * 48
    with pytest.raises(ValueError, match="etp=4"):
        P.trainer_memory(moe, replace(one, etp=4, ep=4), BIG_DEVICE)


def test_generator_kv_by_hand():
    g = P.GenLayout(tp=2, seq_len=100, mem_fraction_static=0.5, min_seqs=3)
    per_tok = 2 * 2 * (2 // 2) * 16 * 2  # K and V, layers, kv heads per rank, head_dim, bf16
    assert P.kv_bytes_per_token(TINY, g) == per_tok
    rep = P.generator_memory(TINY, g, BIG_DEVICE)
    assert rep.components["kv_cache_min"] == 3 * 100 * per_tok
    replicated = 2 * 2 * 64 + 64
    assert rep.components["weights_bf16"] == 2 * ((TINY.total_params() - replicated) // 2 + replicated)
    assert rep.budget_bytes == 5 * 10**11


def test_real_shapes():
    assert P.LLAMA3_8B.total_params() == 8_030_261_248  # Llama-3.1-8B's published parameter count
    scout = P.SCOUT_17B16E
    assert 107e9 < scout.total_params() < 109e9  # 109B includes the vision encoder
    assert 17.0e9 < scout.active_params() < 17.3e9


def test_scout_shape_matches_hf_defaults():
    from transformers import Llama4TextConfig

    c = Llama4TextConfig()
    s = P.SCOUT_17B16E
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim) == (
        c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    assert (s.num_experts, s.top_k, s.expert_ffn, s.vocab, s.moe_every) == (
        c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, c.vocab_size, c.interleave_moe_layer_step)
    assert s.tied_embeddings == c.tie_word_embeddings


def test_refuses_and_suggests_smallest():
    dev = P.H100_80GB
    bad = P.TrainLayout(tp=1, dp=1, seq_len=16384)
    assert not P.trainer_memory(P.LLAMA3_8B, bad, dev).fits
    sug = P.smallest_trainer_layout(P.LLAMA3_8B, dev, base=bad, max_gpus=16)
    assert sug is not None and P.trainer_memory(P.LLAMA3_8B, sug, dev).fits
    # nothing with fewer GPUs fits
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8):
            for d in range(1, 9):
                if t * p * d < sug.world:
                    lay = replace(bad, tp=t, pp=p, dp=d, sequence_parallel=True)
                    assert not P.trainer_memory(P.LLAMA3_8B, lay, dev).fits, lay


def test_validation_names_key():
    with pytest.raises(ValueError, match="tp=3"):
        P.trainer_memory(TINY, P.TrainLayout(tp=3), BIG_DEVICE)
    with pytest.raises(ValueError, match="ep=2"):
        P.trainer_memory(TINY, P.TrainLayout(ep=2), BIG_DEVICE)


def test_cli_refuses_with_exit_2_and_suggestion():
    r = subprocess.run([sys.executable, str(ROOT / "tools/plan.py"), "--model", "scout_17b16e", "--device",
                        "h100_80gb", "--tp", "8", "--gen-tp", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "REFUSED: trainer layout" in r.stdout and "smallest that fits: tp=" in r.stdout
    assert "REFUSED: generator tp=2" in r.stdout and "gen tp=4" in r.stdout
    ok = subprocess.run([sys.executable, str(ROOT / "tools/plan.py"), "--model", "llama3_8b", "--device", "gb200",
                         "--tp", "1", "--dp", "16"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_runtime_overheads_by_hand():
    """cluster/plan.py module doc: context, NCCL per communicator, fused-head transients on the last stage,
    MoE route tensors, 10% fragmentation of the dynamic bytes; the budget keeps a 5% margin."""
    moe = P.ModelShape(name="tmoe", hidden=32, layers=2, heads=2, kv_heads=2, head_dim=16, ffn=64, vocab=256,
                       num_experts=4, top_k=1, expert_ffn=48, shared_expert_ffn=48)
    lay = P.TrainLayout(tp=2, pp=2, dp=2, ep=4, etp=1, seq_len=8, micro_batch=2, logits_chunk_tokens=4)
    n, h, v, t = 16, 32, 256, 2
    # TP, DP, PP, model-parallel (TP x PP), EP, expert-TP 1 != TP 2 but size 1, edp = 4/4 = 1; + weight sync
    assert P.communicator_count(moe, lay) == 5 + 1
    last = P.runtime_bytes(moe, lay, 1, activations=1000)
    head = 4 * v // t * h + min(512 * 2**20, 4 * n * v // t) + 2 * 4 * n * h  # grad_W, dlogits, hidden + grad
    routes = 1 * 1 * (5 * n * 4 + 8 * n * 1) // t  # 1 micro-batch in flight on the last stage, 1 MoE layer
    assert last == {"cuda_context": P.GiB, "nccl": 6 * 512 * 2**20, "head_transients": head, "route_tensors": routes,
                    "fragmentation": int(0.1 * (1000 + head + routes))}
    first = P.runtime_bytes(moe, lay, 0, activations=1000)
    assert first["head_transients"] == 0 and first["route_tensors"] == 2 * routes  # pp = 2 micro-batches in flight
    rep = P.trainer_memory(moe, lay, BIG_DEVICE)
    assert rep.total_bytes == sum(rep.components.values()) and "fragmentation" in rep.components
    assert P.H100_80GB.budget_bytes == int(81559 * 2**20 * 0.95)
