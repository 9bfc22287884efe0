"""`python -m scalerl_mega.cluster.launch_config OVERRIDES...`: compose and validate the trainer's
config on the batch node before any job step starts (slurm/common.sh), and print what the generator
steps must agree on as shell-sourceable `KEY=value` lines:

    PRECISION=fp32_head        (SGLang --enable-fp32-lm-head when fp32_head: paper Sec. 3.2)
    PARAMS_DTYPE=bfloat16      (SGLang --dtype)
    SEED=0                     (SGLang --random-seed)
    ROUTED_EXPERTS=1           (SGLang --enable-return-routed-experts: config.records_routes, i.e. an MoE
                                model with moe.routing_replay on or moe.record_routes=true)
    PAUSE_MODE=in_place        (PipelineRL's in-flight updates: SGLang --disable-radix-cache --disable-overlap-schedule,
                                rollout/sglang/launch.py IN_PLACE_FLAGS; retract otherwise)
    SIGTERM_GRACE_S=120        (train.sigterm_grace_s, whole seconds rounded up: torchrun --shutdown-timeout
                                is set above it, else torchrun SIGKILLs the ranks after its default 30 s)
    RUN_NAME=scalerl
    SEQUENCE_PARALLEL=1        (resolved parallel.sequence_parallel: the trainer step gets
                                CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron needs for SP/TP overlap)
    QUANTIZATION=none          (rollout.quantization: fp8 -> SGLang --quantization fp8; MODEL_PATH must then be a
                                blockwise FP8 checkpoint, which the trainer's init_from_hf dequantizes)
    KV_CACHE_DTYPE=auto        (rollout.kv_cache_dtype: fp8_e4m3 | fp8_e5m2 -> SGLang --kv-cache-dtype, the KV cache
                                the dry run's generator estimate counts)

A config error prints one line naming the key (`config error: <key>=<value> ...`) and exits 2, so a
bad sweep point or typo fails in seconds instead of after the servers loaded their weights.

`--gpu-mem-bytes N|auto` (GPU launches): the trainer layout's planned per-GPU peak (`dry_run.trainer_plan`:
buffers, activations, CUDA context, NCCL, head transients, route tensors, fragmentation; the figure
tools/plan.py and the meta-device dry run give for the same layout) must fit in N bytes less the planner's 5% margin, else exit 2
naming a layout that fits at the same world size (TP/PP/EP and SP, as the Slurm scripts' variables).
`auto` reads this node's GPUs with nvidia-ml-py (the smallest of them); without NVML or a GPU the
check is skipped with a note. The trainer nodes are taken to be of the batch node's GPU type.
`hydra.*` overrides are accepted and ignored (they only place the run directory). `--check-files`
(what a real submission passes; DRY_RUN does not) also requires `init_from_hf` and the data files to
exist on this node.
"""

from __future__ import annotations

import math
import sys


def compose(overrides: list[str], *, check_files: bool = False):
    """The validated TrainConfig of `scalerl-train OVERRIDES` (machine checks skipped: the batch
    node is not necessarily a trainer node). The model is that of the run: `model=hf` takes the shapes of
    `init_from_hf`'s config.json, and a preset is checked against it when that file is readable here
    (`model.hf_import.resolve_model`), before the layout's fit is planned. `check_files`: the data files and
    `init_from_hf` must exist here (shared storage), else ValueError naming the key."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from scalerl_mega.compose import compose_node
    from scalerl_mega.config import validate
    from scalerl_mega.model.hf_import import HF_MODEL_NAME, resolve_model

    cfg = OmegaConf.to_object(compose_node(overrides))
    if cfg.model.name == HF_MODEL_NAME or (cfg.init_from_hf and (Path(cfg.init_from_hf) / "config.json").is_file()):
        resolve_model(cfg)
    validate(cfg)
    if cfg.data.name != "synthetic" and not cfg.data.train_files:
        raise ValueError(f"data.train_files is empty: data={cfg.data.name} needs prompt files on a cluster run "
                         "(slurm scripts: TRAIN_FILES=/path/a.jsonl,/path/b.parquet)")
    if check_files:
        named = [("init_from_hf", cfg.init_from_hf)] if cfg.init_from_hf else []
        if cfg.data.name != "synthetic":
            named += [("data.train_files", f) for f in cfg.data.train_files]
            named += [("data.code_files", f) for f in cfg.data.code_files]
        for key, path in named:
            if not Path(path).exists():
                raise ValueError(f"{key}: {path!r} does not exist on this node (slurm scripts: MODEL_PATH, "
                                 "TRAIN_FILES, CODE_FILES must be on storage every node sees)")
    return cfg


def settings(cfg) -> dict[str, str]:
    from scalerl_mega.config import pause_mode, records_routes

    return {"PRECISION": str(cfg.precision.name), "PARAMS_DTYPE": str(cfg.precision.params_dtype),
            "SEED": str(int(cfg.seed)), "RUN_NAME": str(cfg.run_name),
            "ROUTED_EXPERTS": "1" if records_routes(cfg) else "0",
            "PAUSE_MODE": pause_mode(cfg.off_policy),
            "SIGTERM_GRACE_S": str(math.ceil(cfg.train.sigterm_grace_s)),
            "SEQUENCE_PARALLEL": "1" if cfg.parallel.sequence_parallel_on(cfg.model) else "0",
            "QUANTIZATION": str(cfg.rollout.quantization), "KV_CACHE_DTYPE": str(cfg.rollout.kv_cache_dtype)}


def gpu_memory_bytes() -> int | None:
    """Total memory of this node's smallest GPU by NVML (nvidia-ml-py), None without NVML or GPUs."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or library: no GPU
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        totals = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total for i in range(count)]
    finally:
        pynvml.nvmlShutdown()
    return min(totals) if totals else None


def check_memory_of(gpu_mem: str, gpu_type: str | None) -> tuple[int | None, str]:
    """The GPU memory to check the layout against: `gpu_mem` bytes, or with "auto" this node's NVML reading, else
    the planner's memory of `gpu_type` (`plan.DEVICES`: a login node or a dry run has no GPU). Returns (bytes or
    None, a line saying what was used when it is not this node's own reading)."""
    from scalerl_mega.cluster.plan import DEVICES

    if gpu_mem != "auto":
        return int(gpu_mem), ""
    mem = gpu_memory_bytes()
    if mem is not None:
        return mem, ""
    if not gpu_type:
        return None, "no GPU memory reading (nvidia-ml-py / NVML unavailable) and no GPU_TYPE: the layout's fit is not checked"
    if gpu_type not in DEVICES:
        return None, f"GPU_TYPE={gpu_type!r} is not one of {sorted(DEVICES)} (or set GPU_MEM_BYTES)"
    dev = DEVICES[gpu_type]
    return dev.capacity_bytes, (f"no NVML reading here: checked against GPU_TYPE={gpu_type} "
                                f"({dev.capacity_bytes / 2**30:.1f} GiB; set GPU_TYPE or GPU_MEM_BYTES for other GPUs)")


def _layout_vars(lay) -> str:
    """A planner layout as the Slurm scripts' variables (slurm/common.sh)."""
    sp = " SEQUENCE_PARALLEL=1" if lay.sequence_parallel and lay.tp > 1 else ""
    return f"TP={lay.tp} PP={lay.pp} EP={lay.ep} RECOMPUTE={lay.recompute}{sp}"


def fit_problem(cfg, gpu_mem_bytes: int) -> str | None:
    """None when the trainer layout's planned peak fits a GPU of `gpu_mem_bytes`, else the reason
    with a layout that fits at the same world size (from the planner), or the smallest that does."""
    from dataclasses import replace

    from scalerl_mega.build import megatron_config
    from scalerl_mega.cluster import plan
    from scalerl_mega.dry_run import model_shape, train_layout, trainer_plan

    world = int(cfg.cluster.trainer_devices)
    if world < 1:
        return None
    mcfg = megatron_config(cfg)
    layout = train_layout(cfg, mcfg, world)
    shape = model_shape(mcfg.model)
    dev = plan.Device(name="this node's GPU", capacity_bytes=int(gpu_mem_bytes))
    rep = trainer_plan(cfg, world_size=world, device=dev)
    if rep.fits:
        return None
    par = mcfg.parallel
    head = (f"trainer layout parallel.tp={par.tp} parallel.pp={par.pp} parallel.ep={par.ep} "
            f"(sequence_parallel={layout.sequence_parallel}, train.recompute={layout.recompute}, "
            f"{world} GPUs = cluster.trainer_devices) plans {rep.total_bytes / plan.GiB:.1f} GiB per GPU, more than "
            f"{rep.budget_bytes / plan.GiB:.1f} GiB ({gpu_mem_bytes / plan.GiB:.1f} GiB GPU less the "
            f"{plan.MARGIN_FRACTION:.0%} margin)")
    for base in (layout, replace(layout, recompute="full")):
        sug = plan.smallest_trainer_layout(shape, dev, base=base, max_gpus=world, world=world)
        if sug is not None:
            got = plan.trainer_memory(shape, sug, dev).total_bytes
            return f"{head}; a layout that fits at {world} GPUs: {_layout_vars(sug)} ({got / plan.GiB:.1f} GiB)"
    sug = plan.smallest_trainer_layout(shape, dev, base=replace(layout, recompute="full"), max_gpus=1024)
    more = f"the smallest that fits: {_layout_vars(sug)} on {sug.world} GPUs" if sug else "no layout up to 1024 GPUs fits"
    return f"{head}; no layout fits at {world} GPUs; {more}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check_files = "--check-files" in args
    args = [a for a in args if a != "--check-files"]
    gpu_mem = gpu_type = None
    for flag in ("--gpu-mem-bytes", "--gpu-type"):
        if flag in args:
            i = args.index(flag)
            if flag == "--gpu-type":
                gpu_type = args[i + 1]
            else:
                gpu_mem = args[i + 1]
            del args[i:i + 2]
    try:
        cfg = compose(args, check_files=check_files)
    except ValueError as exc:
        print(f"config error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors (unknown group option, bad key)
        print(f"config error: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if gpu_mem is not None:
        mem, why = check_memory_of(gpu_mem, gpu_type)
        if why:
            print(f"memory check: {why}", file=sys.stderr)
        if mem is None:
            return 2 if gpu_type else 0
        problem = fit_problem(cfg, mem)
        if problem:
            print(f"config error: {problem}", file=sys.stderr)
            return 2
    for key, value in settings(cfg).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
