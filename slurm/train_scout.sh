#!/usr/bin/env bash
# Llama-4 Scout 17Bx16E with ScaleRL on 80 GB200 GPUs (paper App. A.3): 16 generator nodes
# (2 SGLang servers of TP 2 each = 64 GPUs) + 4 trainer nodes (16 GPUs: Megatron TP 4, EP 16, DP 4,
# sequence parallel, full recompute: with selective recompute it plans 169.5 GiB, over GB200's budget).
# Layout per GPU type: planned per-GPU peak of the trainer (meta-device dry run + runtime overheads,
# cluster/plan.py) within the GPU's memory less 5%; tests/integration/test_dry_run.py checks each line
# (8-GPU H100/H200 nodes: set `sbatch --nodes` to the generator nodes + TRAINER_NODES):
#   layout[gb200]: (the defaults)                                             133.2 of 164.6 GiB
#   layout[h200]: GPU_TYPE=h200 GPUS_PER_NODE=8 TRAINER_NODES=4 TP=8 EP=16 GEN_TP=4 RECOMPUTE=selective  104.3 of 124.8 GiB
#   layout[h100_80gb]: GPU_TYPE=h100_80gb GPUS_PER_NODE=8 TRAINER_NODES=8 TP=8 PP=2 EP=16 GEN_TP=4 RECOMPUTE=selective  63.7 of 75.7
# The launch reads the GPUs' memory (nvidia-ml-py) and refuses a layout that does not fit (exit 2,
# naming one that does).
# Weight sync: one sender (SYNC_SENDERS=single, cluster/layouts.py): Scout's experts are one fused tensor per
# layer and travel with the stage's sender, so at PP 1 per-stage sync is one group too (tools/plan.py --sync-table).
# Submit from the repository root:
#   MODEL_PATH=/ckpt/Llama-4-Scout-17B-16E TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_scout.sh
# Environment (slurm/common.sh lists all): MODEL_PATH (HF checkpoint: the servers load it, the trainer
# starts from it as init_from_hf), TRAIN_FILES (comma-separated prompt files, data.train_files),
# DATA (data group, default the experiment's: polaris), CODE_FILES (math_code), TOKENIZER_PATH
# (default: MODEL_PATH's tokenizer), EXPERIMENT, GEN_TP, TP/PP/EP, EXTRA_OVERRIDES. The composed
# config is validated on the batch node before any server starts; SGLang gets --dtype, --random-seed
# and --enable-fp32-lm-head (precision=fp32_head) from it.
# Print the per-node commands only:
#   DRY_RUN=1 TRAIN_FILES=/data/polaris.jsonl SLURM_JOB_NODELIST='gb[001-020]' bash slurm/train_scout.sh
#SBATCH --job-name=scalerl-scout
#SBATCH --nodes=20
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# The default layout (GPUS_PER_NODE=4 TRAINER_NODES=4 GEN_TP=2 TP=4 PP=1 EP=16 RECOMPUTE=full, sequence parallel,
# GPU_TYPE=gb200) is scalerl_mega/cluster/layouts.py's, the one `tools/plan.py --layout train_scout` plans
export SCALERL_LAYOUT=train_scout
export EXPERIMENT=${EXPERIMENT:-scalerl} ROLLOUT=${ROLLOUT:-sglang}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"
scalerl_main
