#!/usr/bin/env bash
# DeepSeek-V3 architecture (MLA, shared experts, sigmoid group-limited routing) with ScaleRL. Default:
# Moonlight-16B-A3B (64 experts, top-6) with the trainer on one 8xH100 node (Megatron TP 2, EP 8, DP 4, sequence
# parallel, full recompute: selective does not fit at TP 2) and 3 generator nodes (8 SGLang servers of TP 1 each).
# DeepSeek-V3 671B: MODEL=deepseek_v3_671b with the layout of its GPU type below; its 61 layers (a prime) leave
# PP 1, so the trainer shards experts (EP 64, experts unsplit) and everything else over TP 8 (sequence parallel) and
# the distributed optimizer; its published weights are FP8: dequantize them to bf16 for MODEL_PATH first.
# Layout per GPU type: planned per-GPU peak of the trainer (meta-device dry run + runtime overheads,
# cluster/plan.py) within the GPU's memory less 5%; tests/integration/test_dry_run.py checks each line
# (set `sbatch --nodes` to the generator nodes + TRAINER_NODES):
#   layout[h100_80gb]: (the defaults)                                                         43.8 of 75.7 GiB
#   layout[h200]: GPU_TYPE=h200                                                                   43.8 of 124.8 GiB
#   layout[gb200]: GPU_TYPE=gb200 GPUS_PER_NODE=4 TRAINER_NODES=2                                            43.8 of 164.6 GiB
#   layout[h200]: GPU_TYPE=h200 MODEL=deepseek_v3_671b TRAINER_NODES=32 TP=8 EP=64 GEN_TP=16                107.8 of 124.8 GiB
#   layout[gb200]: GPU_TYPE=gb200 MODEL=deepseek_v3_671b GPUS_PER_NODE=4 TRAINER_NODES=32 TP=8 EP=64 GEN_TP=16   137.1 of 164.6 GiB
# Generators (MLA caches the compressed KV + RoPE key: (512 + 64) x layers x 2 bytes per token, on every TP rank):
# Moonlight at GEN_TP 1 holds 29.7 GiB of bf16 weights per H100 (31,104 KV bytes per token). DeepSeek-V3's servers
# need GEN_TP 16 in bf16 (78.3 GiB of weights per GPU, 70,272 KV bytes per token: >= 31 sequences of 16k on H200;
# at GEN_TP 8 the plan is 173.6 GiB per GPU): each server spans GEN_TP / GPUS_PER_NODE nodes (2 H200 or 4 GB200
# nodes; SGLang --nnodes/--node-rank, one step per node), so allocate a multiple of that beside the 32 trainer
# nodes, e.g. `sbatch --nodes=36` on H200 for 2 servers (tools/plan.py --model deepseek_v3_671b --gen-tp 16).
# The launch reads the GPUs' memory (nvidia-ml-py) and refuses a layout that does not fit (exit 2,
# naming one that does).
# Weight sync: one sender per expert pool (SYNC_SENDERS=per_stage, cluster/layouts.py): the weight-sync model
# predicts it faster into SGLang (no whole-model gather on rank 0 in series with the wire); each server rank's
# NIC still takes every byte (tools/plan.py --sync-table).
# Submit from the repository root:
#   MODEL_PATH=/ckpt/Moonlight-16B-A3B-Instruct TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_deepseek_v3.sh
# Environment (slurm/common.sh lists all): MODEL_PATH (HF checkpoint: the servers load it, the trainer
# starts from it as init_from_hf and checks it against MODEL), TRAIN_FILES, DATA, CODE_FILES, TOKENIZER_PATH,
# EXPERIMENT, GEN_TP, TP/PP/EP, RECOMPUTE, EXTRA_OVERRIDES (e.g. moe.routing_replay=ids). The routers'
# score-correction biases are loaded and kept frozen (no aux-free update in RL).
# Print the per-node commands only:
#   DRY_RUN=1 TRAIN_FILES=/data/polaris.jsonl SLURM_JOB_NODELIST='h[001-004]' bash slurm/train_deepseek_v3.sh
#SBATCH --job-name=scalerl-deepseek-v3
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# The default layout (GPUS_PER_NODE=8 TRAINER_NODES=1 GEN_TP=1 TP=2 PP=1 EP=8, sequence parallel, full recompute,
# GPU_TYPE=h100_80gb) is scalerl_mega/cluster/layouts.py's, the one `tools/plan.py --layout train_deepseek_v3` plans
export SCALERL_LAYOUT=train_deepseek_v3
export EXPERIMENT=${EXPERIMENT:-scalerl} ROLLOUT=${ROLLOUT:-sglang}
# Moonlight's context is 8,192 tokens: the recipe's prompts of up to 2,048 leave 6,144 to generate (interruption
# drawn in [3k, 4k], then the 2k answer budget)
MOONLIGHT_LENGTH="length.max_new_tokens=6144 length.interruption_min=3072 length.interruption_max=4096"
if [[ ${MODEL:-moonlight_16b_a3b} == moonlight_16b_a3b ]]; then
  export EXTRA_OVERRIDES="$MOONLIGHT_LENGTH ${EXTRA_OVERRIDES:-}"
fi
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"
scalerl_main
