#!/usr/bin/env bash
# The CPU embedded default (`experiment=demo`) laid out like the cluster runs: one job step runs the
# project's local engine behind SGLang's HTTP API (`python -m scalerl_mega.serve`, the
# "generator"), another the Megatron trainer under torchrun (CPU_RANKS=2 ranks: rank 0 drives the
# loop, both train their data-parallel half), attached to it with
# `rollout=sglang rollout.engine_urls=[...]`: the same HTTP client and weight-sync protocol
# (torch.distributed broadcast, gloo on CPU) as the SGLang servers of train_scout.sh / train_dense.sh.
# Single node: both steps share it (srun --exact, one CPU each: the trainer's two ranks share its CPU);
# the server binds 127.0.0.1.
#   sbatch slurm/train_tiny.sh                      (from the repository root; the full demo)
#   EXTRA_OVERRIDES="train.steps=3 sft.steps=5" sbatch slurm/train_tiny.sh
#   DRY_RUN=1 SLURM_JOB_NODELIST=node1 bash slurm/train_tiny.sh
#SBATCH --job-name=scalerl-tiny
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --time=60
#SBATCH --requeue
#SBATCH --signal=B:USR1@60
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
export GPUS_PER_NODE=0 TRAINER_NODES=1 GEN_TP=1 TP=1 PP=1 EP=1
export CPU_RANKS=${CPU_RANKS:-2} CPUS_PER_GEN=${CPUS_PER_GEN:-1} CPUS_PER_TRAINER=${CPUS_PER_TRAINER:-1}
export EXPERIMENT=${EXPERIMENT:-demo} MODEL=${MODEL:-tiny_moe} ROLLOUT=${ROLLOUT:-sglang} CLUSTER=${CLUSTER:-local}
export HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-300}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"

# The local engine served over SGLang's HTTP API on this node (same config overrides as the trainer).
scalerl_generator_cmd() {
  local extra=()
  read -r -a extra <<<"$EXTRA_OVERRIDES"
  CMD=("$SCALERL_PYTHON" -m scalerl_mega.serve --host 127.0.0.1 --port "$2"
       "experiment=$EXPERIMENT" "model=$MODEL" "${extra[@]}")
  : "$1" "$3"
}
# One node only: the generator listens on 127.0.0.1, which a trainer on another node cannot reach.
if [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
  mapfile -t tiny_nodes < <(scalerl_hostnames "$SLURM_JOB_NODELIST")
  if ((${#tiny_nodes[@]} > 1)); then
    scalerl_die "train_tiny.sh runs on one node: its generator listens on 127.0.0.1 only, unreachable from a trainer on another node; SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST has ${#tiny_nodes[@]} nodes (sbatch --nodes=1)"
  fi
fi
scalerl_main
