"""What a tiny random checkpoint is for, recorded beside it: `tools/make_tiny_checkpoint.py` writes `RUN_FILE` into
the checkpoint's directory with the overrides that run it -- the synthetic task its 47-token tokenizer was cut for
(`data=synthetic`), its shapes from its own config.json (`model=hf`), on this machine's CPU (`rollout=local`,
`cluster=local`), at the CPU demo's sizes, with the demo's SFT warm start on the task's traces so that RL has
samples that differ. `scalerl-train experiment=qwen3 init_from_hf=DIR` then runs as it stands: the recorded
overrides join the command line's (`with_recorded`), each key the command line sets itself (or a group it
chooses) left out, so the command line always wins.

Why the checkpoint and not the machine: the checkpoint is the one thing that knows it is random weights over the
synthetic task's vocabulary (it can train nothing else), while choosing the rollout or cluster from the hardware
would make the same command compose differently on a login node and on the GPU node it is meant for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

RUN_FILE = "scalerl_run.json"

CPU_RUN: tuple[str, ...] = (
    "model=hf", "data=synthetic", "rollout=local", "cluster=local",
    "precision.params_dtype=float32",
    # the synthetic task's traces are <= ~33 tokens (conf/experiment/demo.yaml's lengths)
    "length.max_new_tokens=48", "length.interruption_min=36", "length.interruption_max=40",
    "length.answer_budget=8", 'length.interruption_phrase="</think>"',
    "off_policy.k=2",  # PipelineRL-2, as the demo: fresh samples at a small batch
    "optim.lr=1e-4", "optim.warmup_steps=0", "optim.adam_beta2=0.99", "optim.weight_decay=0.0",
    "train.steps=20", "train.prompts_per_step=8", "train.generations_per_prompt=8", "train.micro_batch_tokens=16384",
    "train.recompute=none", "train.val_every=10", "train.save_every=10", "data.val_prompts=64", "data.val_samples=2",
    "data.synthetic_max_digits=2", "data.synthetic_num_prompts=5000",  # 2-digit sums: the tiny models learn them
    "sft.steps=300", "sft.lr=3e-3", "sft.warmup_steps=50", "sft.batch_size=64",
    "rollout.engine_threads=1", "cluster.trainer_threads=1", "forecast.min_points=4",
)
"""The overrides a tiny checkpoint records: the CPU demo's settings (conf/experiment/demo.yaml) less its recipe
choices, which stay the experiment's; SFT at a higher learning rate than the demo's for the smaller models."""


def write_run_file(out: Path, *, arch: str, preset: str) -> Path:
    """`out`/RUN_FILE: what the tiny `arch` checkpoint in `out` is for and the overrides that run it."""
    path = out / RUN_FILE
    path.write_text(json.dumps({
        "for": f"a tiny random {arch} checkpoint (conf/model/{preset}.yaml's shapes) with the synthetic task's "
               "tokenizer, written by tools/make_tiny_checkpoint.py: it trains on the synthetic task on CPU",
        "overrides": list(CPU_RUN)}, indent=1) + "\n")
    return path


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def recorded_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides recorded beside `init_from_hf` (RUN_FILE in its directory) that `overrides` leave to it: none
    whose key the command line sets, or whose group (a prefix of the key) it chooses; [] when there is no such
    file. ValueError naming the file when it is unreadable."""
    given = [o for o in overrides if "=" in o and not o.startswith("-")]
    path = next((o.split("=", 1)[1] for o in given if _key(o) == "init_from_hf"), "")
    run = Path(path) / RUN_FILE if path else None
    if run is None or not run.is_file():
        return []
    try:
        recorded = json.loads(run.read_text())["overrides"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{run}: not a tiny checkpoint's run file ({exc}); remove it or rewrite the checkpoint "
                         "with tools/make_tiny_checkpoint.py") from None
    keys = {_key(o) for o in given}

    def chosen(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1))

    return [str(o) for o in recorded if not chosen(_key(str(o)))]


def with_recorded(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(`argv` with the recorded overrides inserted before the command line's first override, the overrides
    added). The command line's own keys are left out of the recorded ones, so its values win."""
    argv = list(argv)
    added = recorded_overrides(argv)
    if not added:
        return argv, []
    at = next(i for i, a in enumerate(argv) if "=" in a and not a.startswith("-"))
    return argv[:at] + added + argv[at:], added
