"""`python -m scalerl_mega.cluster.launch_config OVERRIDES...`: compose and validate the trainer's
config on the batch node before any job step starts (slurm/common.sh), and print what the generator
steps must agree on as shell-sourceable `KEY=value` lines:

    PRECISION=fp32_head        (SGLang --enable-fp32-lm-head when fp32_head: paper Sec. 3.2)
    PARAMS_DTYPE=bfloat16      (SGLang --dtype)
    SEED=0                     (SGLang --random-seed)
    ROUTED_EXPERTS=1           (SGLang --enable-return-routed-experts: MoE model and moe.record_routes)
    PAUSE_MODE=in_place        (PipelineRL's in-flight updates: SGLang --disable-radix-cache --disable-overlap-schedule,
                                rollout/sglang.py IN_PLACE_FLAGS; retract otherwise)
    SIGTERM_GRACE_S=120        (train.sigterm_grace_s, whole seconds rounded up: torchrun --shutdown-timeout
                                is set above it, else torchrun SIGKILLs the ranks after its default 30 s)
    RUN_NAME=scalerl

A config error prints one line naming the key (`config error: <key>=<value> ...`) and exits 2, so a
bad sweep point or typo fails in seconds instead of after the servers loaded their weights.
`hydra.*` overrides are accepted and ignored (they only place the run directory). `--check-files`
(what a real submission passes; DRY_RUN does not) also requires `init_from_hf` and the data files to
exist on this node.
"""

from __future__ import annotations

import math
import sys


def compose(overrides: list[str], *, check_files: bool = False):
    """The validated TrainConfig of `scalerl-train OVERRIDES` (machine checks skipped: the batch
    node is not necessarily a trainer node). `check_files`: the data files and `init_from_hf` must
    exist here (shared storage), else ValueError naming the key."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs, validate
    from scalerl_mega.train import CONF_DIR

    register_configs()
    kept = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        node = hydra_compose(config_name="train", overrides=[*kept, "output_dir=."])
    cfg = OmegaConf.to_object(node)
    validate(cfg)
    if cfg.data.name != "synthetic" and not cfg.data.train_files:
        raise ValueError(f"data.train_files is empty: data={cfg.data.name} needs prompt files on a cluster run "
                         "(slurm scripts: TRAIN_FILES=/path/a.jsonl,/path/b.parquet)")
    if check_files:
        from pathlib import Path

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
    return {"PRECISION": str(cfg.precision.name), "PARAMS_DTYPE": str(cfg.precision.params_dtype),
            "SEED": str(int(cfg.seed)), "RUN_NAME": str(cfg.run_name),
            "ROUTED_EXPERTS": "1" if cfg.moe.record_routes and cfg.model.is_moe else "0",
            "PAUSE_MODE": "in_place" if cfg.off_policy.name == "pipeline_rl" else "retract",
            "SIGTERM_GRACE_S": str(math.ceil(cfg.train.sigterm_grace_s))}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check_files = "--check-files" in args
    args = [a for a in args if a != "--check-files"]
    try:
        cfg = compose(args, check_files=check_files)
    except ValueError as exc:
        print(f"config error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors (unknown group option, bad key)
        print(f"config error: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    for key, value in settings(cfg).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
