"""The default layouts of the GPU Slurm scripts, in one place: `slurm/train_<name>.sh` takes its defaults from here
(`python -m scalerl_mega.cluster.layouts defaults <name>`, read by slurm/common.sh before its own), and the memory
planner plans the same layout (`tools/plan.py --layout <name>`), so the plan command of docs/cluster_and_gpu.md and
the script's launch agree on every setting: GPUs per node, trainer nodes, TP/PP/EP, sequence parallelism and
activation recompute.

`gpu_type` is the GPU a layout is planned for (a key of `plan.DEVICES`): a launch with no NVML reading (a login
node, a dry run) checks the layout against that GPU's memory (`GPU_TYPE` in the scripts).

    python -m scalerl_mega.cluster.layouts defaults train_scout     # KEY=value lines for slurm/common.sh
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from scalerl_mega.cluster.plan import DEVICES, MODELS, TrainLayout
from scalerl_mega.config.run import TrainLoopConfig

RECOMPUTE_DEFAULT = TrainLoopConfig.recompute
"""The trainer's default activation recompute (`train.recompute`), the planner's default too (`plan.TrainLayout`)."""


@dataclass(frozen=True, kw_only=True)
class ScriptLayout:
    """One GPU script's default allocation and trainer layout."""

    model: str
    """`model=` group option and planner model (`plan.MODELS`)."""
    gpu_type: str
    """The GPU the layout is planned for (`plan.DEVICES`)."""
    gpus_per_node: int
    trainer_nodes: int
    gen_tp: int
    tp: int
    pp: int = 1
    ep: int = 1
    recompute: str = RECOMPUTE_DEFAULT
    sequence_parallel: bool = True
    """On whenever tp > 1 (Megatron requires it for MoE with TP; for a dense model it splits the norm activations)."""
    sync_senders: str = "single"
    """`rollout.weight_sync_senders` the script runs: the mode the weight-sync model (cluster/sync_model.py) predicts
    faster into SGLang for every model the script ships (tests/unit/test_sync_model.py checks it)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS or self.gpu_type not in DEVICES:
            raise ValueError(f"ScriptLayout: model {self.model!r} / gpu_type {self.gpu_type!r} unknown to the planner")

    @property
    def trainer_gpus(self) -> int:
        return self.gpus_per_node * self.trainer_nodes

    def train_layout(self, *, seq_len: int = 16384, micro_batch: int = 1) -> TrainLayout:
        """The planner's `TrainLayout` of this script's trainer (DP = trainer GPUs / (TP x PP))."""
        return TrainLayout(tp=self.tp, pp=self.pp, dp=self.trainer_gpus // (self.tp * self.pp), ep=self.ep,
                           sequence_parallel=self.sequence_parallel and self.tp > 1, recompute=self.recompute,
                           seq_len=seq_len, micro_batch=micro_batch, fused_head=True)

    def with_env(self, env: dict[str, str]) -> ScriptLayout:
        """This layout under a script's environment overrides (`MODEL`, `GPU_TYPE`, `GPUS_PER_NODE`,
        `TRAINER_NODES`, `GEN_TP`, `TP`, `PP`, `EP`, `RECOMPUTE`, `SYNC_SENDERS`; slurm/common.sh applies the same)."""
        from dataclasses import replace

        ints = {k.lower(): int(env[k]) for k in ("GPUS_PER_NODE", "TRAINER_NODES", "GEN_TP", "TP", "PP", "EP")
                if k in env}
        strs = {k.lower(): env[k] for k in ("MODEL", "GPU_TYPE", "RECOMPUTE", "SYNC_SENDERS") if k in env}
        return replace(self, **ints, **strs)

    def shell_defaults(self) -> dict[str, str]:
        """The script's environment defaults (slurm/common.sh applies each one the environment does not set)."""
        return {"MODEL": self.model, "GPU_TYPE": self.gpu_type, "GPUS_PER_NODE": str(self.gpus_per_node),
                "TRAINER_NODES": str(self.trainer_nodes), "GEN_TP": str(self.gen_tp), "TP": str(self.tp),
                "PP": str(self.pp), "EP": str(self.ep), "RECOMPUTE": self.recompute,
                "SEQUENCE_PARALLEL": "1" if self.sequence_parallel else "0", "SYNC_SENDERS": self.sync_senders}


LAYOUTS: dict[str, ScriptLayout] = {
    # Llama-4 Scout 17Bx16E on GB200 (paper App. A.3): 16 trainer GPUs, TP 4 x EP 16 x DP 4; full recompute (with
    # selective it plans 169.5 GiB per GPU, over GB200's budget)
    # weight sync: one sender; Scout's experts are one fused tensor per layer, so at PP 1 per-stage sync has one
    # group too and gains nothing
    "train_scout": ScriptLayout(model="scout_17b16e", gpu_type="gb200", gpus_per_node=4, trainer_nodes=4, gen_tp=2,
                                tp=4, ep=16, recompute="full", sync_senders="single"),
    # Llama-3.1-8B: 16 trainer GPUs, TP 2 (sequence parallel) x DP 8 on the same 4-GPU GB200 nodes; fits H100 80GB
    # and H200 too (slurm/train_dense.sh's header)
    # weight sync: one sender; a dense model at PP 1 is one group in either mode
    "train_dense": ScriptLayout(model="llama3_8b", gpu_type="gb200", gpus_per_node=4, trainer_nodes=4, gen_tp=1, tp=2,
                                sync_senders="single"),
    # Qwen3-30B-A3B: the trainer on one 8xH100 node, TP 4 x EP 8 x DP 2; full recompute (with selective it plans
    # 95.6 GiB per GPU, over H100's budget); 12 SGLang servers of TP 2 on 3 more nodes (slurm/train_qwen3_moe.sh)
    # weight sync: per stage; into SGLang the groups still arrive one at a time through each server rank's NIC, so
    # the gain is the gather (and at PP 2 the cross-stage relay) no longer done in series by rank 0: 30B-A3B
    # 2.85 -> 2.45 s, 235B-A22B 31.35 -> 18.82 s (tools/plan.py --sync-table)
    "train_qwen3_moe": ScriptLayout(model="qwen3_30b_a3b", gpu_type="h100_80gb", gpus_per_node=8, trainer_nodes=1,
                                    gen_tp=2, tp=4, ep=8, recompute="full", sync_senders="per_stage"),
    # DeepSeek-V3 architecture, default Moonlight-16B-A3B: the trainer on one 8xH100 node, TP 2 x EP 8 x DP 4, full
    # recompute (selective does not fit at TP 2); 24 SGLang servers of TP 1 on 3 more nodes
    # (slurm/train_deepseek_v3.sh; DeepSeek-V3 671B's H200 / GB200 layouts are in its header)
    # weight sync: per stage, for the same reason (no gather in series on rank 0; tools/plan.py --sync-table)
    "train_deepseek_v3": ScriptLayout(model="moonlight_16b_a3b", gpu_type="h100_80gb", gpus_per_node=8,
                                      trainer_nodes=1, gen_tp=1, tp=2, ep=8, recompute="full", sync_senders="per_stage"),
    # Qwen3-Next-80B-A3B (Gated DeltaNet hybrid): the fewest nodes the planner fits are H200's: the trainer on two
    # 8xH200 nodes, TP 2 x EP 16 x DP 8, full recompute (98.2 GiB; selective needs 24 GPUs); H100 needs three nodes
    # (slurm/train_qwen3_next.sh's header); 8 SGLang servers of TP 2 on 2 more nodes
    # weight sync: per stage (no gather in series on rank 0; tools/plan.py --sync-table)
    "train_qwen3_next": ScriptLayout(model="qwen3_next_80b_a3b", gpu_type="h200", gpus_per_node=8, trainer_nodes=2,
                                     gen_tp=2, tp=2, ep=16, recompute="full", sync_senders="per_stage"),
}


MODEL_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    # the other models a script ships, with their per-GPU-type layouts: (script, environment), exactly the
    # `layout[<gpu>]: ... MODEL=...` lines of its header (tests/unit/test_sync_model.py compares them)
    "train_dense/qwen3_8b@h100_80gb": ("train_dense", {"GPU_TYPE": "h100_80gb", "MODEL": "qwen3_8b"}),
    "train_dense/qwen3_8b@h200": ("train_dense", {"GPU_TYPE": "h200", "MODEL": "qwen3_8b"}),
    "train_qwen3_moe/qwen3_235b_a22b@h100_80gb": ("train_qwen3_moe", {
        "GPU_TYPE": "h100_80gb", "MODEL": "qwen3_235b_a22b", "TRAINER_NODES": "8", "TP": "4", "PP": "2", "EP": "32",
        "GEN_TP": "8"}),
    "train_qwen3_moe/qwen3_235b_a22b@h200": ("train_qwen3_moe", {
        "GPU_TYPE": "h200", "MODEL": "qwen3_235b_a22b", "TRAINER_NODES": "8", "TP": "4", "PP": "2", "EP": "32",
        "GEN_TP": "8"}),
    "train_qwen3_moe/qwen3_235b_a22b@gb200": ("train_qwen3_moe", {
        "GPU_TYPE": "gb200", "MODEL": "qwen3_235b_a22b", "GPUS_PER_NODE": "4", "TRAINER_NODES": "8", "TP": "4",
        "PP": "2", "EP": "16", "GEN_TP": "4"}),
    "train_deepseek_v3/deepseek_v3_671b@h200": ("train_deepseek_v3", {
        "GPU_TYPE": "h200", "MODEL": "deepseek_v3_671b", "TRAINER_NODES": "32", "TP": "8", "EP": "64", "GEN_TP": "16"}),
    "train_deepseek_v3/deepseek_v3_671b@gb200": ("train_deepseek_v3", {
        "GPU_TYPE": "gb200", "MODEL": "deepseek_v3_671b", "GPUS_PER_NODE": "4", "TRAINER_NODES": "32", "TP": "8",
        "EP": "64", "GEN_TP": "16"}),
}


def shipped_layouts() -> dict[str, ScriptLayout]:
    """Every layout the scripts ship: each script's defaults (by script name), then its other models'
    (`MODEL_VARIANTS`, by `<script>/<model>@<gpu>`)."""
    return {**LAYOUTS, **{name: LAYOUTS[script].with_env(env) for name, (script, env) in MODEL_VARIANTS.items()}}


def script_recompute(model: str) -> tuple[str, list[str]]:
    """The activation recompute the shipped scripts train `model` with, and the shipped layouts that train it
    (`shipped_layouts` names); a model no script ships gets the trainer's default (`train.recompute`) and no names.
    The memory planner's default for `--model` (tools/plan.py), so a layout typed from a script's header plans the
    header's figure. Raises ValueError when two shipped layouts of one model disagree (then no default is right)."""
    found = {name: sl.recompute for name, sl in shipped_layouts().items() if sl.model == model}
    modes = set(found.values())
    if len(modes) > 1:
        raise ValueError(f"shipped layouts of {model!r} disagree on recompute: {found}")
    return (modes.pop() if modes else RECOMPUTE_DEFAULT), sorted(found)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "defaults" or args[1] not in LAYOUTS:
        print(f"usage: python -m scalerl_mega.cluster.layouts defaults {{{','.join(LAYOUTS)}}}", file=sys.stderr)
        return 2
    for key, value in LAYOUTS[args[1]].shell_defaults().items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
