#!/usr/bin/env bash
# Qwen3-MoE with ScaleRL. Default: Qwen3-30B-A3B (128 experts, top-8) with the trainer on one 8xH100 node
# (Megatron TP 4, EP 8, DP 2, sequence parallel, full recompute: with selective recompute it plans
# 95.6 GiB, over H100's budget) and 3 generator nodes (4 SGLang servers of TP 2 each per node = 12).
# Qwen3-235B-A22B: MODEL=qwen3_235b_a22b with the layout of its GPU type below.
# Layout per GPU type: planned per-GPU peak of the trainer (meta-device dry run + runtime overheads,
# cluster/plan.py) within the GPU's memory less 5%; tests/integration/test_dry_run.py checks each line
# (set `sbatch --nodes` to the generator nodes + TRAINER_NODES):
#   layout[h100_80gb]: (the defaults)                                               70.9 of 75.7 GiB
#   layout[h200]: GPU_TYPE=h200                                                    70.9 of 124.8 GiB
#   layout[gb200]: GPU_TYPE=gb200 GPUS_PER_NODE=4 TRAINER_NODES=2                                  70.9 of 164.6 GiB
#   layout[h100_80gb]: GPU_TYPE=h100_80gb MODEL=qwen3_235b_a22b TRAINER_NODES=8 TP=4 PP=2 EP=32 GEN_TP=8    75.5 of 75.7 GiB (0.2 GiB spare)
#   layout[h200]: GPU_TYPE=h200 MODEL=qwen3_235b_a22b TRAINER_NODES=8 TP=4 PP=2 EP=32 GEN_TP=8    75.5 of 124.8 GiB
#   layout[gb200]: GPU_TYPE=gb200 MODEL=qwen3_235b_a22b GPUS_PER_NODE=4 TRAINER_NODES=8 TP=4 PP=2 EP=16 GEN_TP=4  136.3 of 164.6
# LoRA (peft=lora: the base frozen in bf16, adapters of rank 8 on attention and every expert trained, optimizer state
# for the adapters only; cluster/plan_lora.py, `tools/plan.py --peft lora`): Qwen3-235B-A22B's trainer fits ONE 8xH100
# node instead of 8 (checked by tests/unit/test_plan_lora.py; set `sbatch --nodes` to the generator nodes + 1):
#   lora[h100_80gb]: GPU_TYPE=h100_80gb MODEL=qwen3_235b_a22b TRAINER_NODES=1 TP=4 PP=2 EP=4 GEN_TP=8 EXTRA_OVERRIDES="peft=lora peft.rank=8"    66.1 of 75.7 GiB
# Generators: 30B-A3B at GEN_TP 2 holds 30.5 GiB of bf16 weights per H100; 235B-A22B at GEN_TP 8 on H200
# (4 KV heads, each on 2 GPUs) 55 GiB, at GEN_TP 4 on GB200 110 GiB, leaving KV for >= 51 sequences of 16k;
# on H100 the same 55 GiB per GPU leaves far less room for the KV cache.
# The launch reads the GPUs' memory (nvidia-ml-py) and refuses a layout that does not fit (exit 2,
# naming one that does).
# Weight sync: one sender per pipeline stage and expert pool (SYNC_SENDERS=per_stage, cluster/layouts.py): the
# weight-sync model predicts it faster into SGLang for both models, since rank 0 no longer gathers (and at PP 2
# relays) the whole model in series with the wire; SGLang still takes the groups one at a time, so each
# server rank's NIC bounds it (tools/plan.py --sync-table).
# Submit from the repository root:
#   MODEL_PATH=/ckpt/Qwen3-30B-A3B TRAIN_FILES=/data/polaris.jsonl sbatch slurm/train_qwen3_moe.sh
# Environment (slurm/common.sh lists all): MODEL_PATH (HF checkpoint: the servers load it, the trainer
# starts from it as init_from_hf and checks it against MODEL), TRAIN_FILES (comma-separated prompt files,
# data.train_files), DATA (data group, default the experiment's: polaris), CODE_FILES (math_code),
# TOKENIZER_PATH (default: MODEL_PATH's tokenizer), EXPERIMENT, GEN_TP, TP/PP/EP, RECOMPUTE, EXTRA_OVERRIDES
# (e.g. moe.routing_replay=ids; model.moe_aux_loss_coeff=0 turns the load-balancing loss off). The composed
# config is validated on the batch node before any server starts; SGLang gets --dtype, --random-seed and
# --enable-fp32-lm-head (precision=fp32_head) from it.
# Print the per-node commands only:
#   DRY_RUN=1 TRAIN_FILES=/data/polaris.jsonl SLURM_JOB_NODELIST='h[001-004]' bash slurm/train_qwen3_moe.sh
#SBATCH --job-name=scalerl-qwen3-moe
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# The default layout (GPUS_PER_NODE=8 TRAINER_NODES=1 GEN_TP=2 TP=4 PP=1 EP=8, sequence parallel, full recompute,
# GPU_TYPE=h100_80gb) is scalerl_mega/cluster/layouts.py's, the one `tools/plan.py --layout train_qwen3_moe` plans
export SCALERL_LAYOUT=train_qwen3_moe
export EXPERIMENT=${EXPERIMENT:-scalerl} ROLLOUT=${ROLLOUT:-sglang}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"
scalerl_main
