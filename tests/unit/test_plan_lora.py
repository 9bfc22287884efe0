"""The LoRA memory plan (cluster/plan_lora.py): the adapters a GPU holds, counted by hand for the shipped
Qwen3-235B-A22B layout; the `lora[...]` line of slurm/train_qwen3_moe.sh and the table of docs/cluster_and_gpu.md
are the planner's figures, the same that `tools/plan.py --peft lora` and the launch check (`dry_run.trainer_plan`
of a `peft=lora` config) give; one node is the fewest there can be, and full training on it does not fit."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scalerl_mega.cluster.plan import DEVICES, MODELS, GiB, TrainLayout, trainer_memory  # noqa: E402
from scalerl_mega.cluster.plan_lora import lora_trainer_memory, stage_adapter_params  # noqa: E402
from scalerl_mega.config.peft import DEFAULT_TARGETS, target_kinds  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL, DEVICE = MODELS["qwen3_235b_a22b"], DEVICES["h100_80gb"]
KINDS = target_kinds(list(DEFAULT_TARGETS))
SHIPPED = TrainLayout(tp=4, pp=2, dp=1, ep=4, recompute="full", fused_head=True)


def _header() -> tuple[dict[str, str], float, float]:
    for line in (REPO / "slurm" / "train_qwen3_moe.sh").read_text().splitlines():
        m = re.match(r"#\s+lora\[h100_80gb\]:\s*(.*?)\s+([\d.]+) of ([\d.]+) GiB", line)
        if m:
            env = dict(re.findall(r'\b([A-Z_]+)=("[^"]*"|\S*)', m.group(1)))
            return {k: v.strip('"') for k, v in env.items()}, float(m.group(2)), float(m.group(3))
    raise AssertionError("no lora[h100_80gb] line in slurm/train_qwen3_moe.sh")


def test_adapters_per_gpu_by_hand():
    # Qwen3-235B-A22B: hidden 4096, 64 query heads and 4 kv heads of 128, 128 experts of width 1536, 94 layers, all
    # MoE. Stage 0 of PP 2 holds 47 layers; TP 4; EP 4 (32 experts per GPU); r = 8. Per layer:
    # qkv A 8 x 4096 (replicated) + B 8 x (64 + 8) x 128 / 4; o A 8 x 8192 / 4 + B 8 x 4096 (replicated)
    body = 8 * 4096 + 8 * 72 * 128 // 4 + 8 * 8192 // 4 + 8 * 4096
    expert = 32 * (8 * (4096 + 2 * 1536) + 8 * (1536 + 4096))
    assert (body, expert) == (100_352, 3_276_800)
    got = stage_adapter_params(MODEL, SHIPPED, 0, rank=8, kinds=KINDS)
    assert got == {"body": 47 * body, "expert": 47 * expert}


def test_shipped_lora_layout_is_the_planners_and_one_node():
    env, planned, budget = _header()
    assert (env["MODEL"], env["TRAINER_NODES"], env["TP"], env["PP"], env["EP"]) == ("qwen3_235b_a22b", "1", "4", "2", "4")
    assert env["EXTRA_OVERRIDES"] == "peft=lora peft.rank=8" and env["GPU_TYPE"] == "h100_80gb"
    rep = lora_trainer_memory(MODEL, SHIPPED, DEVICE, rank=8, kinds=KINDS)
    assert rep.fits and round(rep.total_bytes / GiB, 1) == planned and round(rep.budget_bytes / GiB, 1) == budget
    assert SHIPPED.world == 8  # one 8-GPU node: the fewest nodes a trainer can have
    assert not trainer_memory(MODEL, SHIPPED, DEVICE).fits  # full training on it: the base's grads and Adam state
    assert round(trainer_memory(MODEL, SHIPPED, DEVICE).total_bytes / GiB, 1) == 501.0
    wide = lora_trainer_memory(MODEL, SHIPPED, DEVICE, rank=32, kinds=KINDS)
    assert round(wide.total_bytes / GiB, 1) == 75.3 and wide.fits


def test_docs_table_rows_are_the_planners():
    doc = (REPO / "docs" / "cluster_and_gpu.md").read_text()
    rows = re.findall(r"^\| qwen3_235b_a22b \| h100_80gb \| (full|LoRA r=8)[^|]*\| (\d+) \| tp=(\d+) pp=(\d+) dp=(\d+) "
                      r"ep=(\d+) \| ([\d.]+) \|$", doc, re.M)
    assert len(rows) == 2
    for kind, nodes, tp, pp, dp, ep, gib in rows:
        lay = TrainLayout(tp=int(tp), pp=int(pp), dp=int(dp), ep=int(ep), recompute="full", fused_head=True)
        assert lay.world == 8 * int(nodes)
        rep = (trainer_memory(MODEL, lay, DEVICE) if kind == "full"
               else lora_trainer_memory(MODEL, lay, DEVICE, rank=8, kinds=KINDS))
        assert rep.fits and round(rep.total_bytes / GiB, 1) == float(gib)


def test_plan_tool_and_launch_check_give_the_same_figure(capsys):
    spec = importlib.util.spec_from_file_location("plan_tool", REPO / "tools" / "plan.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    rc = tool.main(["--model", "qwen3_235b_a22b", "--device", "h100_80gb", "--tp", "4", "--pp", "2", "--dp", "1",
                    "--ep", "4", "--recompute", "full", "--gen-tp", "8", "--peft", "lora", "--rank", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    expected = lora_trainer_memory(MODEL, SHIPPED, DEVICE, rank=8, kinds=KINDS).total_bytes
    assert rc == 0 and out["trainer"]["total_bytes"] == expected

    from test_config import _compose

    from scalerl_mega.dry_run import trainer_plan

    cfg = _compose("experiment=scalerl", "model=qwen3_235b_a22b", "rollout=sglang", "cluster=slurm",
                   "rollout.sglang_tp_size=8", "parallel.tp=4", "parallel.pp=2", "parallel.ep=4",
                   "parallel.sequence_parallel=true", "train.recompute=full", "cluster.devices_per_node=8",
                   "cluster.trainer_devices=8", "data.train_files=[/data/polaris.jsonl]", "peft=lora", "peft.rank=8")
    assert trainer_plan(cfg, world_size=8, device=DEVICE).total_bytes == expected
