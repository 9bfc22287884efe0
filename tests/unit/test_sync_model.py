"""The planner's weight-sync model (cluster/sync_model.py): hand-worked seconds for a small shape, the
group cap, fused experts, and `tools/plan.py --json`'s `weight_sync` key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.cluster.plan import ModelShape, TrainLayout
from scalerl_mega.cluster.sync_model import GB, SyncLinks, predict_sync, sender_bytes, stage_bytes

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


def test_single_and_multi_sender_seconds_by_hand():
    links = SyncLinks(link_gbps=1e-6, gather_gbps=4e-6, nics_per_node=8, bytes_per_param=2)  # 1000 B/s, 4000 B/s
    lay = TrainLayout(pp=2, ep=2)
    pred = predict_sync(M, lay, links)
    total = 2 * M.total_params()
    d0, e0 = stage_bytes(M, pp=2, stage=0, bytes_per_param=2)
    d1, e1 = stage_bytes(M, pp=2, stage=1, bytes_per_param=2)
    assert pred.total_bytes == total
    # one sender: gather all at 4000 B/s, relay stage 1 at 1000 B/s, send all at 1000 B/s
    assert pred.single_sender_s == pytest.approx(total / 4000 + (d1 + e1) / 1000 + total / 1000)
    # four senders: stage leaders carry dense + half the experts; each sender gathers and sends its own bytes
    per = [d0 + e0 // 2, e0 // 2, d1 + e1 // 2, e1 // 2]
    assert sender_bytes(M, lay) == per and pred.senders == 4 and pred.max_sender_bytes == max(per)
    assert pred.multi_sender_s == pytest.approx(max(b / 4000 + b / 1000 for b in per))
    # a receiving node with one NIC takes every byte through it: the floor wins
    one_nic = predict_sync(M, lay, SyncLinks(link_gbps=1e-6, gather_gbps=4e-6, nics_per_node=1))
    assert one_nic.multi_sender_s == pytest.approx(max(total / 1000, max(b / 4000 + b / 1000 for b in per)))
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
                         capture_output=True, text=True, timeout=120)
    ws = json.loads(out.stdout)["weight_sync"]
    assert set(ws) == {"single_sender_s", "multi_sender_s", "senders", "max_sender_bytes"}
    assert ws["senders"] == 8 and ws["multi_sender_s"] < ws["single_sender_s"]
    table = subprocess.run([sys.executable, "tools/plan.py", "--sync-table"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120).stdout
    assert all(f"| {name} |" in table for name in shipped_layouts()) and "assumed" not in table
    # Qwen3-235B-A22B on the layout its script header ships: 64 H200, TP 4 x PP 2 x EP 32
    row = next(r for r in table.splitlines() if r.startswith("| train_qwen3_moe/qwen3_235b_a22b@h200 |"))
    sl = shipped_layouts()["train_qwen3_moe/qwen3_235b_a22b@h200"]
    assert "| 4/2/32 |" in row and sl.trainer_gpus == 64 and sl.gpu_type == "h200"
    docs = (ROOT / "docs" / "cluster_and_gpu.md").read_text()
    assert table.strip() in docs  # the docs table is the tool's output


def test_cluster_sim_takes_sync_seconds_from_the_model():
    from scalerl_mega.cluster.layouts import LAYOUTS
    from scalerl_mega.cluster.plan import MODELS

    sl = LAYOUTS["train_qwen3_moe"]
    pred = predict_sync(MODELS[sl.model], sl.train_layout(), SyncLinks(nics_per_node=sl.gpus_per_node))
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
