"""Full-scale dry run (trainer/megatron/dry_run.py): the real Megatron layouts of the cluster scripts,
built on the meta device in one CPU process with a fake process group.

* the CLI contract (`dry_run=true output_dir=DIR` -> DIR/dry_run.json + table, exit 0; exit 2 naming
  the keys for a layout that cannot initialise), with Llama-3.1-8B's byte counts checked by hand;
* the startup net: every conf/experiment overlay at the layouts slurm/train_dense.sh and
  slurm/train_scout.sh launch, at their real world sizes;
* cluster/plan.py (tools/plan.py) agrees with the built buffers within 5% on H100, H200 and GB200.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scalerl_mega.cluster import plan as P

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dry_run_worker.py")
LLAMA_P = 8_030_261_248  # Llama-3.1-8B's published parameter count
LLAMA_HEAD = 128256 * 4096  # output layer (untied)


def run_cli(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "scalerl_mega.train", *overrides, "dry_run=true", f"output_dir={out}"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**_env(), "PYTHONPATH": str(REPO)})


def _env() -> dict:
    import os

    return dict(os.environ)


def run_worker(tmp_path: Path, cases: dict[str, list[str]]) -> dict:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    r = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**_env(), "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def test_cli_llama8b_dense_layout_by_hand(tmp_path):
    """Default config = slurm/train_dense.sh's: Llama-3.1-8B, 16 trainer GPUs, DP 16, bf16 body with the
    FP32 head, distributed optimizer on (DP > 1)."""
    r = run_cli(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    # a real bf16 build of 8B would need >= 16 GB: the child stayed far below (meta device)
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 3 * 1024**2  # KiB
    data = json.loads((tmp_path / "dry_run.json").read_text())
    assert data["world_size"] == 16 and list(data["ranks"]) == ["0"]
    rank = data["ranks"]["0"]
    assert set(rank) >= {"params", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"}
    body = LLAMA_P - LLAMA_HEAD
    assert rank["params"] == LLAMA_P
    assert rank["params_bytes"] == 2 * body + 4 * LLAMA_HEAD  # bf16 body, FP32 output layer
    assert rank["grads_bytes"] == pytest.approx(4 * LLAMA_P, rel=1e-3)  # FP32 grad buffers (padding only)
    # FP32 main copies of the bf16 body + Adam m, v of everything, sharded over DP 16
    assert rank["optimizer_bytes"] == pytest.approx((12 * body + 8 * LLAMA_HEAD) / 16, rel=1e-3)
    assert rank["dp"] == 16 and rank["distributed_optimizer"] is True
    assert rank["activations_bytes"] > 0
    assert data["layout"]["sequence_parallel"] is False and data["precision"]["params_dtype"] == "bfloat16"
    table = r.stdout
    assert "rank" in table and re.search(r"^\s+0 pp only\s+8,030,261,248", table, re.M), table


def test_cli_layout_that_cannot_initialise_exits_2_naming_keys(tmp_path):
    # Megatron's default expert TP = TP: 4 * 16 * 1 = 64 does not divide 16 ranks
    r = run_cli(tmp_path, "model=scout_17b16e", "parallel.tp=4", "parallel.ep=16", "parallel.etp=4")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "parallel.etp" in r.stderr and "parallel.ep" in r.stderr and "cluster.trainer_devices" in r.stderr
    assert not (tmp_path / "dry_run.json").exists()


# ----------------------------------------------------------------------------- startup net
def slurm_layout(script: str) -> dict:
    """The layout a slurm/train_*.sh launches: defaults of TP/PP/EP, MODEL, TRAINER_NODES x GPUS_PER_NODE."""
    text = (REPO / "slurm" / script).read_text()

    def default(name: str) -> str:
        m = re.search(rf"\b{name}=\$\{{{name}:-([^}}]+)\}}", text)
        assert m, f"{script}: no default for {name}"
        return m.group(1)

    world = int(default("TRAINER_NODES")) * int(default("GPUS_PER_NODE"))
    return {"model": default("MODEL"), "tp": int(default("TP")), "pp": int(default("PP")),
            "ep": int(default("EP")), "world": world}


def experiments() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def test_startup_net_every_experiment_at_the_slurm_layouts(tmp_path):
    cases = {}
    layouts = {s: slurm_layout(s) for s in ("train_dense.sh", "train_scout.sh")}
    assert layouts["train_scout.sh"]["world"] == 16 and layouts["train_scout.sh"]["ep"] == 16
    for exp in experiments():
        if exp == "demo" or exp.startswith("repro_"):  # CPU presets (slurm/train_tiny.sh, make reproduce):
            cases[exp] = [f"experiment={exp}"]            # their own model and a world of 1
            continue
        for script, lay in layouts.items():
            cases[f"{exp}@{script}"] = [
                f"experiment={exp}", f"model={lay['model']}", "cluster=slurm", f"cluster.trainer_devices={lay['world']}",
                f"parallel.tp={lay['tp']}", f"parallel.pp={lay['pp']}", f"parallel.ep={lay['ep']}"]
    results = run_worker(tmp_path, cases)
    errors = {k: v["error"] for k, v in results.items() if "error" in v}
    assert not errors, errors
    for name, res in results.items():
        assert res["ranks"] and all(e["params_bytes"] > 0 for e in res["ranks"].values()), name
    scout = results["scalerl@train_scout.sh"]
    assert scout["world_size"] == 16 and sorted(scout["ranks"], key=int) == ["0", "15"]
    assert scout["layout"] == {"tp": 4, "cp": 1, "pp": 1, "ep": 16, "etp": 1, "dp": 4, "expert_dp": 1,
                               "sequence_parallel": True, "distributed_optimizer": True}
    assert scout["ranks"]["15"]["ep_rank"] == 15
    # the bf16-head ablation really builds a bf16 output layer: 2 bytes less per head parameter
    for script, head in (("train_dense.sh", LLAMA_HEAD), ("train_scout.sh", 202048 * 5120 // 4)):
        fp32 = results[f"scalerl@{script}"]["ranks"]["0"]["params_bytes"]
        bf16 = results[f"loo_fp32@{script}"]["ranks"]["0"]["params_bytes"]
        assert fp32 - bf16 == 2 * head, script
    assert results["demo"]["precision"]["params_dtype"] == "float32" and results["demo"]["world_size"] == 1


# ----------------------------------------------------------------------------- planner reconciliation
def planner_layouts() -> dict[str, tuple[str, P.TrainLayout]]:
    """The planner's layouts for both models on H100, H200 and GB200: at 16 GPUs when one fits there,
    else the smallest that fits."""
    out = {}
    for model in (P.LLAMA3_8B, P.SCOUT_17B16E):
        for dev in (P.H100_80GB, P.H200, P.GB200):
            base = P.TrainLayout()
            lay = P.smallest_trainer_layout(model, dev, base=base, max_gpus=16, world=16) \
                or P.smallest_trainer_layout(model, dev, base=base, max_gpus=128)
            assert lay is not None, (model.name, dev.name)
            out[f"{model.name}@{dev.name}"] = (model.name, lay)
    return out


def test_planner_matches_the_dry_run_within_5_percent(tmp_path):
    layouts = planner_layouts()
    cases = {name: [f"model={m}", "cluster=slurm", f"cluster.trainer_devices={lay.world}", f"parallel.tp={lay.tp}",
                    f"parallel.pp={lay.pp}", f"parallel.ep={lay.ep}", f"parallel.etp={lay.etp}",
                    f"parallel.sequence_parallel={str(lay.sequence_parallel and lay.tp > 1).lower()}"]
             for name, (m, lay) in layouts.items()}
    results = run_worker(tmp_path, cases)
    for name, (m, lay) in layouts.items():
        res = results[name]
        assert "error" not in res, res
        model = P.MODELS[m]
        for rank in res["ranks"].values():
            planned = P.stage_static_bytes(model, lay, rank["pp_rank"])
            for ours, theirs in (("params_bytes", "weights"), ("grads_bytes", "grads"),
                                 ("optimizer_bytes", "optimizer")):
                assert rank[ours] == pytest.approx(planned[theirs], rel=0.05), (name, rank["role"], ours)
            chunked = replace(lay, logits_chunk_tokens=res["activations"]["logits_chunk_tokens"])  # fused CISPO head
            assert rank["activations_bytes"] == P.stage_activation_bytes(model, chunked, rank["pp_rank"])
