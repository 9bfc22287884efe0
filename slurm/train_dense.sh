#!/usr/bin/env bash
# Llama-3.1-8B (or a Qwen3 dense checkpoint) with ScaleRL on 80 GPUs (paper App. A.3): 16 generator nodes
# (4 SGLang servers of TP 1 each = 64 GPUs) + 4 trainer nodes (16 GPUs: Megatron TP 2 with sequence parallel, DP 8).
# Layout per GPU type: planned per-GPU peak of the trainer (meta-device dry run + runtime overheads,
# cluster/plan.py) within the GPU's memory less 5%; tests/integration/test_dry_run.py checks each line:
#   layout[h100_80gb]: GPU_TYPE=h100_80gb                        70.7 of 75.7 GiB
#   layout[h200]: GPU_TYPE=h200                             70.7 of 124.8 GiB
#   layout[gb200]: (the defaults)                            70.7 of 164.6 GiB
#   layout[gb200]: TP=1                                      131.8 of 164.6 GiB (DP 16, no TP traffic)
#   layout[h100_80gb]: GPU_TYPE=h100_80gb MODEL=qwen3_8b                        72.5 of 75.7 GiB
#   layout[h200]: GPU_TYPE=h200 MODEL=qwen3_8b                             72.5 of 124.8 GiB
# TP 1 (DP 16) needs 131.8 GiB per GPU (Qwen3-8B: 135.3): it does not fit H100 or H200.
# Qwen3 dense: a MODEL_PATH whose config.json says model_type "qwen3" (Qwen3-0.6B ... 32B) runs with model=hf
# (every shape from that config.json) unless MODEL is set; MODEL=qwen3_8b checks the checkpoint against the
# preset. The launch reads the GPUs' memory (nvidia-ml-py) and refuses a layout that does not fit (exit 2,
# naming one that does).
# Weight sync: one sender (SYNC_SENDERS=single, cluster/layouts.py): a dense model at PP 1 is one group in
# either mode, so per-stage sync would gain nothing (tools/plan.py --sync-table).
# Submit from the repository root:
#   MODEL_PATH=/ckpt/Llama-3.1-8B TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_dense.sh
#   MODEL_PATH=/ckpt/Qwen3-8B TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_dense.sh
# Environment (slurm/common.sh lists all): MODEL_PATH (HF checkpoint: the servers load it, the trainer
# starts from it as init_from_hf), TRAIN_FILES (comma-separated prompt files, data.train_files),
# DATA (data group, default the experiment's: polaris), CODE_FILES (math_code), TOKENIZER_PATH
# (default: MODEL_PATH's tokenizer), EXPERIMENT, GEN_TP, TP/PP/EP, EXTRA_OVERRIDES. The composed
# config is validated on the batch node before any server starts; SGLang gets --dtype, --random-seed
# and --enable-fp32-lm-head (precision=fp32_head) from it.
# Print the per-node commands only:
#   DRY_RUN=1 TRAIN_FILES=/data/polaris.jsonl SLURM_JOB_NODELIST='gb[001-020]' bash slurm/train_dense.sh
#SBATCH --job-name=scalerl-8b
#SBATCH --nodes=20
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# The default layout (GPUS_PER_NODE=4 TRAINER_NODES=4 GEN_TP=1 TP=2 PP=1 EP=1, sequence parallel when TP > 1,
# GPU_TYPE=gb200) is scalerl_mega/cluster/layouts.py's, the one `tools/plan.py --layout train_dense` plans
export SCALERL_LAYOUT=train_dense
# A Qwen3 dense checkpoint (its config.json says model_type "qwen3") runs with model=hf unless MODEL is set
if [[ -z ${MODEL:-} && -f ${MODEL_PATH:-}/config.json ]] &&
  grep -Eq '"model_type"[[:space:]]*:[[:space:]]*"qwen3"' "$MODEL_PATH/config.json"; then
  export MODEL=hf
fi
export EXPERIMENT=${EXPERIMENT:-scalerl} ROLLOUT=${ROLLOUT:-sglang}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"
scalerl_main
