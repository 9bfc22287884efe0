"""Full-scale dry run (scalerl_mega/dry_run.py): the real Megatron layouts of the cluster scripts,
built on the meta device in one CPU process with a fake process group.

* the CLI contract (`dry_run=true output_dir=DIR` -> DIR/dry_run.json + table, exit 0; exit 2 naming
  the keys for a layout that cannot initialise), with Llama-3.1-8B's byte counts checked by hand;
* the startup net: every conf/experiment overlay at the layouts slurm/train_dense.sh,
  slurm/train_scout.sh and slurm/train_qwen3_moe.sh launch, at their real world sizes;
* the shipped Qwen3 layouts (8B on H100/H200, 30B-A3B on one 8xH100 node, 235B-A22B on H200/GB200):
  built at full size, within the planner and within each GPU type's memory;
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


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
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


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
def test_cli_layout_that_does_not_fit_exits_2(tmp_path):
    """The default layout (8B, DP 16: tools/plan.py plans 131.8 GiB) fits GB200 only: `dry_run_gpu=h100_80gb`
    exits 2 with the planner's figure (the table and dry_run.json are still written); gb200 exits 0."""
    planned = P.trainer_memory(P.LLAMA3_8B, P.TrainLayout(dp=16, sequence_parallel=False, fused_head=True),
                               P.H100_80GB).total_bytes
    r = run_cli(tmp_path, "dry_run_gpu=h100_80gb")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"plans {planned / P.GiB:.2f} GiB per GPU, more than h100_80gb's 75.67 GiB" in r.stderr, r.stderr
    assert f"planned peak {planned / P.GiB:.2f} GiB" in r.stdout and "h100_80gb NO" in r.stdout
    data = json.loads((tmp_path / "dry_run.json").read_text())
    assert data["devices"]["h100_80gb"] == {"planned_peak_bytes": planned, "budget_bytes": P.H100_80GB.budget_bytes,
                                            "fits": False}
    assert run_cli(tmp_path / "gb", "dry_run_gpu=gb200").returncode == 0
    bad = run_cli(tmp_path / "bad", "dry_run_gpu=a100")
    assert bad.returncode == 2 and "dry_run_gpu='a100' is not one of" in bad.stderr


def test_cli_layout_that_cannot_initialise_exits_2_naming_keys(tmp_path):
    # Megatron's default expert TP = TP: 4 * 16 * 1 = 64 does not divide 16 ranks
    r = run_cli(tmp_path, "model=scout_17b16e", "parallel.tp=4", "parallel.ep=16", "parallel.etp=4")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "parallel.etp" in r.stderr and "parallel.ep" in r.stderr and "cluster.trainer_devices" in r.stderr
    assert not (tmp_path / "dry_run.json").exists()


# ----------------------------------------------------------------------------- startup net
SCRIPTS = ("train_dense.sh", "train_scout.sh", "train_qwen3_moe.sh")
LAYOUT_SCRIPTS = (*SCRIPTS, "train_deepseek_v3.sh", "train_qwen3_next.sh")  # scripts whose header documents a layout per GPU type


def slurm_layout(script: str) -> dict:
    """The layout a slurm/train_*.sh launches: its defaults (scalerl_mega/cluster/layouts.py, the one source the
    script reads: SCALERL_LAYOUT) of TP/PP/EP, MODEL, RECOMPUTE, TRAINER_NODES x GPUS_PER_NODE."""
    from scalerl_mega.cluster.layouts import LAYOUTS

    name = Path(script).stem
    assert f"SCALERL_LAYOUT={name}" in (REPO / "slurm" / script).read_text(), f"{script} does not read its layout"
    sl = LAYOUTS[name]
    return {"model": sl.model, "tp": sl.tp, "pp": sl.pp, "ep": sl.ep, "world": sl.trainer_gpus,
            "recompute": sl.recompute, "gpus_per_node": sl.gpus_per_node, "trainer_nodes": sl.trainer_nodes}


def experiments() -> list[str]:
    root = REPO / "conf" / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in [*root.glob("*.yaml"), *root.glob("*/*.yaml")])


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
def test_startup_net_every_experiment_at_the_slurm_layouts(tmp_path):
    cases = {}
    layouts = {s: slurm_layout(s) for s in SCRIPTS}
    assert layouts["train_scout.sh"]["world"] == 16 and layouts["train_scout.sh"]["ep"] == 16
    assert layouts["train_qwen3_moe.sh"]["world"] == 8 and layouts["train_qwen3_moe.sh"]["ep"] == 8
    for exp in experiments():
        if exp == "demo" or exp.startswith("reproduction/"):  # CPU presets (train_tiny.sh, make reproduce):
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
    qwen = results["scalerl@train_qwen3_moe.sh"]  # Qwen3-30B-A3B on one 8-GPU node: TP 4 x EP 8, experts unsplit
    assert qwen["layout"] == {"tp": 4, "cp": 1, "pp": 1, "ep": 8, "etp": 1, "dp": 2, "expert_dp": 1,
                              "sequence_parallel": True, "distributed_optimizer": True}
    # the bf16-head ablation really builds a bf16 output layer: 2 bytes less per head parameter
    for script, head in (("train_dense.sh", LLAMA_HEAD // layouts["train_dense.sh"]["tp"]),
                         ("train_scout.sh", 202048 * 5120 // layouts["train_scout.sh"]["tp"])):
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


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
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


# ----------------------------------------------------------------------------- documented layouts per GPU type
def documented_layouts(script: str) -> list[tuple[str, dict[str, str]]]:
    """The `layout[<device>]: VAR=value ...` lines of a slurm/train_*.sh header (its per-GPU-type table)."""
    out = []
    for line in (REPO / "slurm" / script).read_text().splitlines():
        m = re.match(r"#\s+layout\[(\w+)\]:\s*(.*)$", line)
        if m:
            out.append((m.group(1), dict(re.findall(r"\b([A-Z_]+)=(\S*)", m.group(2)))))
    return out


def layout_overrides(script: str, env: dict[str, str]) -> list[str]:
    """What the script launches under `env` (its defaults otherwise): the same rules as the script text."""
    lay = slurm_layout(script)
    world = int(env.get("TRAINER_NODES", lay["trainer_nodes"])) * int(env.get("GPUS_PER_NODE", lay["gpus_per_node"]))
    tp, pp, ep = (int(env.get(k, lay[k.lower()])) for k in ("TP", "PP", "EP"))
    ovs = [f"model={env.get('MODEL', lay['model'])}", "cluster=slurm", f"cluster.trainer_devices={world}",
           f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.ep={ep}"]
    if tp > 1:  # every script adds sequence parallel for TP > 1
        ovs.append("parallel.sequence_parallel=true")
    ovs.append(f"train.recompute={env.get('RECOMPUTE', lay['recompute'])}")
    if env.get("MODEL", lay["model"]) == "moonlight_16b_a3b":  # train_deepseek_v3.sh: its 8,192-token context
        text = (REPO / "slurm" / script).read_text()
        ovs += re.search(r'MOONLIGHT_LENGTH="([^"]*)"', text).group(1).split()
    return ovs


def planned_layout(script: str, env: dict[str, str]) -> tuple[P.ModelShape, P.TrainLayout]:
    """cluster/plan.py's view of `layout_overrides` (the fused head's chunk as the trainer sizes it)."""
    from scalerl_mega.objective.fused_logprob import default_chunk_size

    ovs = dict(o.split("=", 1) for o in layout_overrides(script, env))
    model = P.MODELS[ovs["model"]]
    tp, pp, ep, world = (int(ovs[k]) for k in ("parallel.tp", "parallel.pp", "parallel.ep", "cluster.trainer_devices"))
    lay = P.TrainLayout(tp=tp, pp=pp, ep=ep, dp=world // (tp * pp), sequence_parallel=tp > 1,
                        recompute=ovs.get("train.recompute", "selective"),
                        logits_chunk_tokens=default_chunk_size(model.vocab // tp))
    return model, lay


def test_documented_layouts_fit_by_the_planner():
    """Fast twin of the dry-run test below: every `layout[device]` line fits that device by cluster/plan.py,
    and the layout TP 1 for 8B fits neither H100 nor H200."""
    for script in LAYOUT_SCRIPTS:
        for device, env in documented_layouts(script):
            model, lay = planned_layout(script, env)
            rep = P.trainer_memory(model, lay, P.DEVICES[device])
            assert rep.fits, (script, device, env, rep.total_bytes / P.GiB, rep.budget_bytes / P.GiB)
    model, lay = planned_layout("train_dense.sh", {"TP": "1"})
    assert [P.trainer_memory(model, lay, P.DEVICES[d]).fits for d in ("h100_80gb", "h200", "gb200")] == \
        [False, False, True]


@pytest.mark.slow
def test_each_script_documents_a_fitting_layout_per_gpu_type(tmp_path):
    """Every `layout[device]` line of the scripts fits that device by the dry run's planned peak (buffers as
    built, activations, CUDA context, NCCL, head transients, route tensors, fragmentation, 5% margin); the
    defaults are among them; 8B at TP 1 (119.7 GiB of buffers + activations) fits neither H100 nor H200."""
    cases, expect = {}, {}
    for script in LAYOUT_SCRIPTS:
        docs = documented_layouts(script)
        assert {d for d, _ in docs} == {"h100_80gb", "h200", "gb200"}, script
        assert any(not env for _, env in docs), f"{script}: its defaults are not documented"
        for i, (device, env) in enumerate(docs):
            name = f"{script}#{i}"
            cases[name], expect[name] = layout_overrides(script, env), device
    cases["8b_tp1"] = layout_overrides("train_dense.sh", {"TP": "1"})
    results = run_worker(tmp_path, cases)
    for name, device in expect.items():
        res = results[name]
        assert "error" not in res, (name, res)
        peak = max(e["peak_bytes"] for e in res["ranks"].values())
        assert res["devices"][device]["fits"], (name, cases[name], peak / P.GiB, res["devices"][device])
        for e in res["ranks"].values():  # peak = the parts, each runtime term as planned
            assert e["peak_bytes"] == sum(e[c] for c in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                         "activations_bytes")) + sum(e["runtime_bytes"].values())
    tp1 = results["8b_tp1"]
    rank = tp1["ranks"]["0"]
    assert (rank["params_bytes"] + rank["grads_bytes"] + rank["optimizer_bytes"] + rank["activations_bytes"]) / P.GiB \
        == pytest.approx(119.71, abs=0.01)
    assert not tp1["devices"]["h100_80gb"]["fits"] and not tp1["devices"]["h200"]["fits"]
    assert tp1["devices"]["gb200"]["fits"]
    # the runtime terms by hand for 8B TP1 DP16 (cluster/plan.py module doc): 1 GiB context; NCCL for DP and
    # the weight-sync group; grad_W 4*V*h + the 512 MiB dlogits buffer + FP32 hidden and its grad 2*4*N*h
    rt = rank["runtime_bytes"]
    n, h, v = 16384, 4096, 128256
    assert rt["cuda_context"] == P.GiB and rt["nccl"] == 2 * 512 * 2**20 and rt["route_tensors"] == 0
    assert rt["head_transients"] == 4 * v * h + 512 * 2**20 + 8 * n * h
    assert rt["fragmentation"] == int(0.10 * (rank["activations_bytes"] + rt["head_transients"]))


# ----------------------------------------------------------------------------- Qwen3 layouts
QWEN3_LAYOUTS = {  # name: (script, env of its `layout[...]` line, the GPU type it is documented for)
    "qwen3_8b@h100": ("train_dense.sh", {"MODEL": "qwen3_8b"}, "h100_80gb"),
    "qwen3_30b_a3b@8xh100": ("train_qwen3_moe.sh", {}, "h100_80gb"),
    "qwen3_235b_a22b@h200": ("train_qwen3_moe.sh", {"MODEL": "qwen3_235b_a22b", "TRAINER_NODES": "8", "TP": "4",
                                                    "PP": "2", "EP": "32", "GEN_TP": "8"}, "h200"),
    "qwen3_235b_a22b@gb200": ("train_qwen3_moe.sh", {"MODEL": "qwen3_235b_a22b", "GPUS_PER_NODE": "4",
                                                     "TRAINER_NODES": "8", "TP": "4", "PP": "2", "EP": "16",
                                                     "GEN_TP": "4"}, "gb200"),
}


DEEPSEEK_LAYOUTS = {
    "moonlight_16b_a3b@8xh100": ("train_deepseek_v3.sh", {}, "h100_80gb"),
    "deepseek_v3_671b@h200": ("train_deepseek_v3.sh", {"MODEL": "deepseek_v3_671b", "TRAINER_NODES": "32", "TP": "8",
                                                      "EP": "64", "GEN_TP": "16"}, "h200"),
    "deepseek_v3_671b@gb200": ("train_deepseek_v3.sh", {"MODEL": "deepseek_v3_671b", "GPUS_PER_NODE": "4",
                                                       "TRAINER_NODES": "32", "TP": "8", "EP": "64", "GEN_TP": "16"},
                               "gb200"),
}


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
def test_qwen3_layouts_build_at_full_size_and_fit(tmp_path):
    """Each shipped Qwen3 layout (documented in its script) initialises in Megatron at its real world size on
    the meta device (every pipeline / expert role); the built parameter, gradient and optimizer bytes are the
    planner's within 5%; the planned peak fits the GPU type it is documented for."""
    _check_full_size_layouts(tmp_path, QWEN3_LAYOUTS)


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
def test_deepseek_v3_layouts_build_at_full_size_and_fit(tmp_path):
    """The same for the DeepSeek-V3 architecture (MLA in the planner: model/deepseek.py's parameter count):
    Moonlight-16B-A3B on one 8xH100 node, DeepSeek-V3 671B on 256 H200 and on 128 GB200 (TP 8 x EP 64)."""
    _check_full_size_layouts(tmp_path, DEEPSEEK_LAYOUTS)


def _check_full_size_layouts(tmp_path, layouts):
    for name, (script, env, device) in layouts.items():  # a header line names GPU_TYPE where it is not the default
        documented = [(d, {k: v for k, v in e.items() if k != "GPU_TYPE"}) for d, e in documented_layouts(script)]
        assert (device, env) in documented, name
    cases = {name: layout_overrides(script, env) for name, (script, env, _) in layouts.items()}
    results = run_worker(tmp_path, cases)
    for name, (script, env, device) in layouts.items():
        res = results[name]
        assert "error" not in res, (name, res)
        model, lay = planned_layout(script, env)
        assert res["world_size"] == lay.world and res["devices"][device]["fits"], (name, res["devices"])
        roles = {e["role"] for e in res["ranks"].values()}  # first / middle / last stage, first and last EP rank
        assert len(roles) == len({0, min(1, lay.pp - 1), lay.pp - 1}) * (2 if lay.ep > 1 else 1), roles
        for rank in res["ranks"].values():
            planned = P.stage_static_bytes(model, lay, rank["pp_rank"])
            for ours, theirs in (("params_bytes", "weights"), ("grads_bytes", "grads"), ("optimizer_bytes", "optimizer")):
                assert rank[ours] == pytest.approx(planned[theirs], rel=0.05), (name, rank["role"], ours)
            stage = P.stage_params(model, lay, rank["pp_rank"])
            assert rank["params"] == stage["body"] + stage["head"] + stage["expert"], (name, rank["role"])
        peak = max(e["peak_bytes"] for e in res["ranks"].values())
        assert peak == pytest.approx(P.trainer_memory(model, lay, P.DEVICES[device]).total_bytes, rel=0.05), name
