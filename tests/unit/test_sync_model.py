"""The planner's weight-sync model (cluster/sync_model.py): hand-worked seconds and floors for a small shape (one
sender and per-stage senders, into SGLang and local engines), the group cap, fused experts, `tools/plan.py --json`'s
`weight_sync` key, `--sync-table [--json]`, and the sender mode each shipped Slurm layout runs."""

from __future__ import annotations

import json
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.cluster.plan import ModelShape, TrainLayout
from scalerl_mega.cluster.sync_model import (GB, SyncLinks, estimate_sync, faster_senders, predict_sync, sender_bytes,
                                             stage_bytes)

ROOT = Path(__file__).resolve().parents[2]

# 2 layers, both MoE; hidden 10, 2 heads x head_dim 5, 1 KV head; 4 experts of ffn 3; vocab 100, untied.
M = ModelShape(name="toy", hidden=10, layers=2, heads=2, kv_heads=1, head_dim=5, ffn=7, vocab=100, num_experts=4,
               top_k=1, expert_ffn=3)
ATT = 10 * 2 * 5 * 2 + 10 * 1 * 5 * 2  # q, o + k, v = 300
NORM = 2 * 10
ROUTER = 10 * 4
EXPERTS = 4 * 3 * 10 * 3  # 360 per layer


def test_stage_bytes_by_hand():
    d0, e0 = stage_bytes(M, pp=2, stage=0, bytes_per_param=2)
    d1, e1 = stage_bytes(M, pp=2, stage=1, bytes_per_param=2)
    assert d0 == 2 * (ATT + NORM + ROUTER + 100 * 10)  # + embedding
    assert d1 == 2 * (ATT + NORM + ROUTER + 10 + 100 * 10)  # + final norm + head
    assert e0 == e1 == 2 * EXPERTS
    assert sum(sender_bytes(M, TrainLayout(pp=2, ep=2))) == 2 * M.total_params()


LINKS = SyncLinks(link_gbps=1e-6, recv_gbps=0.5e-6, gather_gbps=4e-6, bytes_per_param=2, bucket_bytes=100)
"""1000 B/s per sender NIC, 500 B/s per receiving rank, 4000 B/s gather, 100-byte buckets."""


def test_single_sender_by_hand():
    lay = TrainLayout(pp=2, ep=2)
    total = 2 * M.total_params()
    d1, e1 = stage_bytes(M, pp=2, stage=1, bytes_per_param=2)
    for backend in ("sglang", "local"):  # one group: the same on both
        e = estimate_sync(M, lay, LINKS, backend=backend, senders="single")
        # gather all at 4000 B/s, relay stage 1 at 1000 B/s, then the wire at min(1000, 500) B/s: in series
        assert e.seconds == pytest.approx(total / 4000 + (d1 + e1) / 1000 + total / 500)
        assert (e.floor_s, e.bound) == (pytest.approx(total / 500), "receiver_nic")  # the slower receiving NIC
        assert e.groups == 1 and e.total_bytes == total
    e = estimate_sync(M, lay, replace(LINKS, recv_gbps=1e-6), backend="sglang", senders="single")
    assert (e.floor_s, e.bound) == (pytest.approx(total / 1000), "sender_nic")  # a tie names the sender


def test_per_stage_local_and_sglang_by_hand():
    lay = TrainLayout(pp=2, ep=2)
    total = 2 * M.total_params()
    d0, e0 = stage_bytes(M, pp=2, stage=0, bytes_per_param=2)
    d1, e1 = stage_bytes(M, pp=2, stage=1, bytes_per_param=2)
    per = [d0 + e0 // 2, e0 // 2, d1 + e1 // 2, e1 // 2]  # stage leaders carry dense + half the experts
    assert sender_bytes(M, lay) == per and sum(per) == total
    largest = max(b / 4000 + b / 500 for b in per)  # a sender gathers, then its group moves at 500 B/s
    local = estimate_sync(M, lay, LINKS, backend="local", senders="per_stage")
    # all groups at once, but the engine rank takes every byte through its 500 B/s NIC
    assert local.seconds == pytest.approx(max(largest, total / 500)) == pytest.approx(total / 500)
    assert (local.floor_s, local.bound, local.groups, local.max_sender_bytes) == (
        pytest.approx(total / 500), "receiver_nic", 4, max(per))
    sgl = estimate_sync(M, lay, LINKS, backend="sglang", senders="per_stage")
    # one group at a time: the whole model at 500 B/s, plus the first 100-byte bucket's gather before the wire
    assert sgl.seconds == pytest.approx(100 / 4000 + total / 500)
    assert (sgl.floor_s, sgl.bound) == (pytest.approx(total / 500), "receiver_serial")
    # a fast receiver: the slowest sender's gather + send sets the local time; SGLang still serialises the groups
    fast = replace(LINKS, recv_gbps=1.0)
    assert estimate_sync(M, lay, fast, backend="local", senders="per_stage").seconds == pytest.approx(
        max(b / 4000 + b / 1000 for b in per))
    assert estimate_sync(M, lay, fast, backend="local", senders="per_stage").bound == "sender_nic"
    assert estimate_sync(M, lay, fast, backend="sglang", senders="per_stage").seconds == pytest.approx(
        100 / 4000 + total / 1000)
    pred = predict_sync(M, lay, LINKS)  # the shipped scripts' generators: SGLang
    assert (pred.single_sender_s, pred.multi_sender_s, pred.senders) == (
        estimate_sync(M, lay, LINKS, backend="sglang", senders="single").seconds, sgl.seconds, 4)
    assert faster_senders(M, lay, LINKS) == "per_stage"
    assert faster_senders(M, TrainLayout(), LINKS) == "single"  # PP 1, EP 1: one group, nothing to gain
    with pytest.raises(ValueError, match=r"backend='vllm'"):
        estimate_sync(M, lay, LINKS, backend="vllm", senders="single")
    assert GB == 1e9


def test_group_cap_and_fused_experts():
    capped = predict_sync(M, TrainLayout(pp=2, ep=4), max_groups=4)  # 4 // 2 = 2 pools of 2 ep ranks per stage
    assert capped.senders == 4
    fused = ModelShape(**{**M.__dict__, "name": "scout_17b16e"})
    assert predict_sync(fused, TrainLayout(pp=2, ep=4)).senders == 2  # experts travel with the stage leader
    with pytest.raises(ValueError, match=r"max_groups=1 \(groups per engine\) is smaller than the 2 pipeline stages"):
        predict_sync(M, TrainLayout(pp=2, ep=1), max_groups=1)


def test_plan_json_carries_weight_sync_and_the_table_lists_every_layout():
    from scalerl_mega.cluster.layouts import shipped_layouts

    out = subprocess.run([sys.executable, "tools/plan.py", "--layout", "train_qwen3_moe", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    ws = json.loads(out.stdout)["weight_sync"]
    assert set(ws) == {"single_sender_s", "multi_sender_s", "senders", "max_sender_bytes"}
    assert ws["senders"] == 8 and ws["multi_sender_s"] < ws["single_sender_s"]
    table = subprocess.run([sys.executable, "tools/plan.py", "--sync-table"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600).stdout
    assert all(f"| {name} |" in table for name in shipped_layouts()) and "assumed" not in table
    # Qwen3-235B-A22B on the layout its script header ships: 64 H200, TP 4 x PP 2 x EP 32
    row = next(r for r in table.splitlines() if r.startswith("| train_qwen3_moe/qwen3_235b_a22b@h200 |"))
    sl = shipped_layouts()["train_qwen3_moe/qwen3_235b_a22b@h200"]
    assert "| 4/2/32 |" in row and sl.trainer_gpus == 64 and sl.gpu_type == "h200"
    docs = (ROOT / "docs" / "cluster_and_gpu.md").read_text()
    bf16, fp8 = table.strip().split("\n\n")  # the bf16 table, then bf16 beside FP8
    assert bf16 in docs and fp8 in docs  # the docs tables are the tool's output


def test_sync_table_json_rows_and_the_scripts_run_the_faster_mode():
    from scalerl_mega.cluster.layouts import shipped_layouts
    from scalerl_mega.cluster.plan import MODELS

    out = subprocess.run([sys.executable, "tools/plan.py", "--sync-table", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    layouts = shipped_layouts()
    assert len(rows) == 8 * len(layouts)
    assert {(r["layout"], r["quantization"], r["backend"], r["senders"]) for r in rows} == {
        (n, q, b, s) for n in layouts for q in ("none", "fp8") for b in ("sglang", "local") for s in ("single", "per_stage")}
    assert all({"model", "layout", "backend", "senders", "seconds", "floor_s", "bound"} <= set(r) for r in rows)
    assert all(r["seconds"] >= r["floor_s"] > 0 for r in rows)
    row = {(r["layout"], r["backend"], r["senders"]): r for r in rows if r["quantization"] == "none"}
    # Qwen3-30B-A3B at TP 4 x EP 8 (PP 1: no relay), bf16, 25 GB/s links, 150 GB/s gathers
    total = 2 * MODELS["qwen3_30b_a3b"].total_params()
    one = row[("train_qwen3_moe", "sglang", "single")]
    assert one["model"] == "qwen3_30b_a3b" and one["seconds"] == round(total / 150e9 + total / 25e9, 3)
    assert (one["floor_s"], one["bound"]) == (round(total / 25e9, 3), "sender_nic")
    many = row[("train_qwen3_moe", "sglang", "per_stage")]  # 8 groups one after another, the first bucket gathered
    assert many["seconds"] == round((512 << 20) / 150e9 + total / 25e9, 3) and many["bound"] == "receiver_serial"
    assert row[("train_qwen3_moe", "local", "per_stage")]["bound"] == "receiver_nic"
    for name, sl in layouts.items():  # every script runs the mode the model predicts faster into SGLang
        assert sl.sync_senders == faster_senders(MODELS[sl.model], sl.train_layout()), name
        assert sl.shell_defaults()["SYNC_SENDERS"] == sl.sync_senders
    assert layouts["train_qwen3_moe/qwen3_235b_a22b@h200"].sync_senders == "per_stage"
    assert layouts["train_dense"].sync_senders == "single"
    big = [row[("train_qwen3_moe/qwen3_235b_a22b@h200", "sglang", s)]["seconds"] for s in ("single", "per_stage")]
    docs = " ".join((ROOT / "docs" / "cluster_and_gpu.md").read_text().split())
    assert f"Qwen3-235B-A22B: {big[0]:.2f} s to {big[1]:.2f} s" in docs


def test_cluster_sim_takes_sync_seconds_from_the_model():
    from scalerl_mega.cluster.layouts import LAYOUTS
    from scalerl_mega.cluster.plan import MODELS

    sl = LAYOUTS["train_qwen3_moe"]
    pred = predict_sync(MODELS[sl.model], sl.train_layout())
    sims = {}
    for senders in ("one", "many"):
        out = subprocess.run([sys.executable, "tools/cluster_sim.py", "--sync-layout", "train_qwen3_moe", "--senders",
                              senders, "--mode", "pipeline_rl", "--steps", "6", "--warmup-steps", "1", "--json"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        sims[senders] = json.loads(out.stdout)
        assert sims[senders]["weight_sync"] == pred.as_json()
    # PipelineRL pays the sync every step: the simulator's trainer-idle sync total follows the modelled seconds
    one, many = (sims[k]["results"][0] for k in ("one", "many"))
    assert one["samples_per_hour"] < many["samples_per_hour"]


def test_model_variants_are_the_script_headers_other_models():
    """`layouts.MODEL_VARIANTS` (the sync table's rows beyond the scripts' defaults) are exactly the
    `layout[<gpu>]: ... MODEL=...` lines of the slurm/train_*.sh headers, GPU type included."""
    import re

    from scalerl_mega.cluster.layouts import LAYOUTS, MODEL_VARIANTS, shipped_layouts

    header = []
    for script in LAYOUTS:
        for line in (ROOT / "slurm" / f"{script}.sh").read_text().splitlines():
            m = re.match(r"#\s+layout\[(\w+)\]:\s*(.*?)\s+[\d.]+ of [\d.]+", line)
            if m and "MODEL=" in m.group(2):
                env = dict(re.findall(r"\b([A-Z_]+)=(\S*)", m.group(2)))
                assert env["GPU_TYPE"] == m.group(1), line
                header.append((script, env))
    key = sorted((script, sorted(env.items())) for script, env in header)
    assert key == sorted((script, sorted(env.items())) for script, env in MODEL_VARIANTS.values())
    for name, sl in shipped_layouts().items():
        if name in MODEL_VARIANTS:
            script, env = MODEL_VARIANTS[name]
            assert name == f"{script}/{env['MODEL']}@{env['GPU_TYPE']}" and sl.model == env["MODEL"]
