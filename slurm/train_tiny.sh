#!/usr/bin/env bash
# The CPU embedded default (`experiment=demo`) laid out like the cluster runs: one job step runs the
# project's local engine (the "generator"), another the Megatron trainer under torchrun (1 process).
# On one node both steps share it (srun --exact, one CPU each).
#   sbatch slurm/train_tiny.sh                      (from the repository root)
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
export EXPERIMENT=${EXPERIMENT:-demo} MODEL=${MODEL:-tiny_moe} ROLLOUT=${ROLLOUT:-local} CLUSTER=${CLUSTER:-local}
export HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-300}
if [[ -z ${SCALERL_REPO:-} ]]; then
  if [[ -f ${SLURM_SUBMIT_DIR:-}/slurm/common.sh ]]; then SCALERL_REPO=$SLURM_SUBMIT_DIR; else SCALERL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); fi
fi
export SCALERL_REPO
# shellcheck source=slurm/common.sh
source "$SCALERL_REPO/slurm/common.sh"

# The local engine served over HTTP on this node (module provided with the RL loop's rollout code).
scalerl_generator_cmd() {
  CMD=("$SCALERL_PYTHON" -m scalerl_mega.rollout.server --host 0.0.0.0 --port "$2"
       "experiment=$EXPERIMENT" "model=$MODEL")
  : "$1" "$3"
}
scalerl_health_url() { echo "$1/health"; }

scalerl_main
