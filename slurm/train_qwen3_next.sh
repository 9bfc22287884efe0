#!/usr/bin/env bash
# Qwen3-Next-80B-A3B with ScaleRL: a Gated DeltaNet hybrid (36 GDN layers, 12 gated full-attention layers, every
# layer MoE, top-10 of 512 experts + a gated shared expert; conf/model/qwen3_next_80b_a3b.yaml). Default: the trainer
# on two 8xH200 nodes (Megatron TP 2, EP 16, DP 8, sequence parallel, full recompute: with selective recompute it
# plans 155.1 GiB, over H200's budget, and needs 24 GPUs) and 2 generator nodes (4 SGLang servers of TP 2 each per
# node = 8). H200 is the GPU type with the fewest trainer nodes by the planner: no 16-GPU layout fits H100 (three
# nodes), and GB200's 4-GPU nodes need three as well.
# Layout per GPU type: planned per-GPU peak of the trainer (meta-device dry run + runtime overheads,
# cluster/plan.py) within the GPU's memory less 5%; tests/unit/test_docs_plan_tables.py checks each line
# (set `sbatch --nodes` to the generator nodes + TRAINER_NODES):
#   layout[h200]: (the defaults)                                                                98.2 of 124.8 GiB
#   layout[h100_80gb]: GPU_TYPE=h100_80gb TRAINER_NODES=3 TP=2 PP=3 EP=8 GEN_TP=4                    65.8 of 75.7 GiB
#   layout[gb200]: GPU_TYPE=gb200 GPUS_PER_NODE=4 TRAINER_NODES=3 TP=2 PP=3 EP=4 GEN_TP=2           121.0 of 164.6 GiB
# Generators: 80B in bf16 at GEN_TP 2 holds 74 GiB of weights per H200 (GEN_TP 4 on H100); SGLang caches K and V for
# the 12 full-attention layers only, plus each sequence's GDN recurrent and conv state (tools/plan.py).
# The launch reads the GPUs' memory (nvidia-ml-py) and refuses a layout that does not fit (exit 2,
# naming one that does).
# Weight sync: one sender per pipeline stage and expert pool (SYNC_SENDERS=per_stage, cluster/layouts.py), the mode
# the weight-sync model predicts faster into SGLang (tools/plan.py --sync-table).
# Submit from the repository root:
#   MODEL_PATH=/ckpt/Qwen3-Next-80B-A3B-Instruct TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_qwen3_next.sh
# Environment (slurm/common.sh lists all): MODEL_PATH (HF checkpoint: the servers load it, the trainer
# starts from it as init_from_hf and checks it against MODEL), TRAIN_FILES (comma-separated prompt files,
# data.train_files), DATA, CODE_FILES, TOKENIZER_PATH, EXPERIMENT, GEN_TP, TP/PP/EP, RECOMPUTE, EXTRA_OVERRIDES.
# The composed config is validated on the batch node before any server starts.
# Print the per-node commands only:
#   DRY_RUN=1 TRAIN_FILES=/data/polaris.jsonl SLURM_JOB_NODELIST='h[001-004]' bash slurm/train_qwen3_next.sh
#SBATCH --job-name=scalerl-qwen3-next
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# The default layout (GPUS_PER_NODE=8 TRAINER_NODES=2 GEN_TP=2 TP=2 PP=1 EP=16, sequence parallel, full recompute,
# GPU_TYPE=h200) is scalerl_mega/cluster/layouts.py's, the one `tools/plan.py --layout train_qwen3_next` plans
export SCALERL_LAYOUT=train_qwen3_next
export EXPERIMENT=${EXPERIMENT:-scalerl} ROLLOUT=${ROLLOUT:-sglang}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"
scalerl_main
