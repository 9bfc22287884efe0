#!/usr/bin/env bash
# Shared launch helper for slurm/train_*.sh (sourced, not executed).
#
# Layout: the allocation's nodes are split into generator nodes (inference servers, one per TP group
# of GEN_TP devices) and the last TRAINER_NODES nodes (one `srun` step running `torchrun` with the
# Megatron TP/PP/EP layout). Each server and the trainer are separate job steps (`srun --exact`, so
# they run concurrently). Servers are health-checked before the trainer starts; their URLs reach the
# trainer as `rollout.engine_urls=[...]`. If any step exits, the job stops all steps and exits with
# that step's code (the job ends FAILED, the reason and the step log's tail in the job log). When the
# trainer exits 0 the servers are stopped and the job ends COMPLETED. The run directory is fixed
# (RUN_DIR) and `resume=auto` is always passed, so a requeued job continues from its last checkpoint;
# USR1 (sbatch --signal=B:USR1@N) requeues the job before its time limit.
#
# Interface (environment; the train_*.sh scripts set defaults):
#   DRY_RUN=1           print the exact command of every step, per node, and exit 0
#   GPUS_PER_NODE       devices per node (0: CPU run, no --gres)
#   TRAINER_NODES       nodes given to the trainer (the last ones of the allocation)
#   GEN_TP              devices per inference server (SGLang --tp-size); a multiple of GPUS_PER_NODE spans
#                       GEN_TP / GPUS_PER_NODE consecutive generator nodes (SGLang --nnodes/--node-rank, one step
#                       per node, the first node's server answers HTTP)
#   GEN_DIST_PORT       a multi-node server's torch.distributed port on its first node (default PORT_BASE+1000)
#   TP PP EP            Megatron tensor / pipeline / expert parallel sizes (DP is derived)
#   RECOMPUTE           train.recompute (none | selective | full; empty: the config's)
#   SEQUENCE_PARALLEL   1: parallel.sequence_parallel=true when TP > 1
#   SYNC_SENDERS        rollout.weight_sync_senders (single | per_stage; empty: the config's); each GPU script's
#                       default is the mode the weight-sync model predicts faster for it (cluster/layouts.py)
#   KV_CACHE_DTYPE      rollout.kv_cache_dtype (auto | fp8_e4m3 | fp8_e5m2; empty: the config's): the servers'
#                       SGLang --kv-cache-dtype, taken from the composed config like rollout.quantization's flag
#   SCALERL_LAYOUT      the defaults of the variables above (scalerl_mega/cluster/layouts.py; the GPU scripts set it)
#   GPU_TYPE            h100_80gb | h200 | gb200: the GPU memory the layout is checked against when NVML gives no
#                       reading (a login node, DRY_RUN); GPU_MEM_BYTES overrides both
#   EXPERIMENT MODEL    Hydra `experiment=` and `model=` choices
#   MODEL_PATH          HF checkpoint the servers load and the trainer starts from (init_from_hf)
#   DATA                Hydra data group (polaris | deepcoder | math_code; empty: the experiment's)
#   TRAIN_FILES         comma-separated prompt files -> data.train_files (JSONL / Parquet / HF dataset dir)
#   CODE_FILES          comma-separated code-task files -> data.code_files (math_code)
#   TOKENIZER_PATH      local HF tokenizer dir -> data.tokenizer_path (empty: MODEL_PATH's tokenizer)
#   CPU_RANKS           trainer ranks per node on a CPU run (GPUS_PER_NODE=0; default 1)
#   CPUS_PER_GPU        --cpus-per-task of a step = its GPUs x this (default 8)
#   CPUS_PER_GEN CPUS_PER_TRAINER   --cpus-per-task of generator / trainer steps (override the above;
#                       CPU runs default to 1 and CPU_RANKS)
#   ROLLOUT             Hydra rollout group (sglang | local)
#   CLUSTER             Hydra cluster group (slurm; local for the CPU run)
#   RUN_DIR             run directory (Hydra run dir; checkpoints; step logs in $RUN_DIR/slurm)
#   PORT_BASE           first server port (default 30000); server i on a node uses PORT_BASE+i
#   MASTER_PORT         torchrun rendezvous port (default 29500)
#   HEALTH_TIMEOUT      seconds to wait for every server (default: 600 + 1 per 200 MB of MODEL_PATH's
#                       *.safetensors; stage the checkpoint on local NVMe first: docs/cluster_install.md)
#   MEM_PER_GPU         MB of host memory per GPU a step gets (srun --mem = its GPUs x this; default
#                       SLURM_MEM_PER_NODE / GPUS_PER_NODE; else --mem-per-cpu=SLURM_MEM_PER_CPU): without
#                       it a step may take the node's whole memory and the next step on it waits
#   SOCKET_IFNAME       network interface for NCCL and Gloo bootstrap (sets NCCL_SOCKET_IFNAME and
#                       GLOO_SOCKET_IFNAME unless those are set); every step gets them explicitly
#   MEM_FRACTION        SGLang --mem-fraction-static (default 0.85)
#   GPU_MEM_BYTES       GPU memory the trainer layout must fit (default: read by nvidia-ml-py on the batch
#                       node; no reading: not checked). A layout that does not fit exits 2 naming one that does
#   EXTRA_OVERRIDES     extra Hydra overrides (whitespace separated)
#   SCALERL_PYTHON      python with scalerl_mega installed: the trainer env (default: REPO/.venv/bin/python)
#   SGLANG_PYTHON       python of the generator env (SGLang and its own torch; default: SCALERL_PYTHON).
#                       Both envs must load the same NCCL: GPU launches check it before any step
#                       (python -m scalerl_mega.cluster.gpu_envs nccl; docs/cluster_install.md)
# Hooks a script may redefine after sourcing: scalerl_generator_cmd, scalerl_trainer_cmd,
# scalerl_health_url.

set -euo pipefail

SCALERL_REPO=${SCALERL_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if [[ -z ${SCALERL_PYTHON:-} ]]; then
  if [[ -x $SCALERL_REPO/.venv/bin/python ]]; then SCALERL_PYTHON=$SCALERL_REPO/.venv/bin/python; else SCALERL_PYTHON=python3; fi
fi
SGLANG_PYTHON=${SGLANG_PYTHON:-$SCALERL_PYTHON}
DRY_RUN=${DRY_RUN:-0}
# A GPU script's default layout (SCALERL_LAYOUT=train_scout|train_dense): scalerl_mega/cluster/layouts.py, the
# same the memory planner plans (tools/plan.py --layout NAME). The environment overrides each value.
if [[ -n ${SCALERL_LAYOUT:-} ]]; then
  layout_defaults=$(PYTHONPATH="$SCALERL_REPO${PYTHONPATH:+:$PYTHONPATH}" "$SCALERL_PYTHON" -m scalerl_mega.cluster.layouts defaults "$SCALERL_LAYOUT") \
    || { printf '[scalerl] ERROR: no default layout %s (scalerl_mega/cluster/layouts.py)\n' "$SCALERL_LAYOUT" >&2; exit 2; }
  while IFS='=' read -r key value; do
    if [[ -z ${!key:-} ]]; then printf -v "$key" '%s' "$value"; fi
  done <<<"$layout_defaults"
fi
GPUS_PER_NODE=${GPUS_PER_NODE:-0}
TRAINER_NODES=${TRAINER_NODES:-1}
GEN_TP=${GEN_TP:-1}
TP=${TP:-1}
PP=${PP:-1}
EP=${EP:-1}
RECOMPUTE=${RECOMPUTE:-}
SEQUENCE_PARALLEL=${SEQUENCE_PARALLEL:-0}
SYNC_SENDERS=${SYNC_SENDERS:-}
KV_CACHE_DTYPE=${KV_CACHE_DTYPE:-}
GPU_TYPE=${GPU_TYPE:-}
EXPERIMENT=${EXPERIMENT:-scalerl}
MODEL=${MODEL:-llama3_8b}
MODEL_PATH=${MODEL_PATH:-}
DATA=${DATA:-}
TRAIN_FILES=${TRAIN_FILES:-}
CODE_FILES=${CODE_FILES:-}
TOKENIZER_PATH=${TOKENIZER_PATH:-}
CPU_RANKS=${CPU_RANKS:-1}
CPUS_PER_GPU=${CPUS_PER_GPU:-8}
if ((GPUS_PER_NODE > 0)); then
  CPUS_PER_GEN=${CPUS_PER_GEN:-$(((GEN_TP < GPUS_PER_NODE ? GEN_TP : GPUS_PER_NODE) * CPUS_PER_GPU))}
  CPUS_PER_TRAINER=${CPUS_PER_TRAINER:-$((GPUS_PER_NODE * CPUS_PER_GPU))}
else
  CPUS_PER_GEN=${CPUS_PER_GEN:-1}
  CPUS_PER_TRAINER=${CPUS_PER_TRAINER:-$CPU_RANKS}
fi
ROLLOUT=${ROLLOUT:-sglang}
CLUSTER=${CLUSTER:-slurm}
PORT_BASE=${PORT_BASE:-30000}
GEN_DIST_PORT=${GEN_DIST_PORT:-$((PORT_BASE + 1000))}
MASTER_PORT=${MASTER_PORT:-29500}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-}
MEM_PER_GPU=${MEM_PER_GPU:-}
if [[ -n ${SOCKET_IFNAME:-} ]]; then
  NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$SOCKET_IFNAME}
  GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$SOCKET_IFNAME}
fi
MEM_FRACTION=${MEM_FRACTION:-0.85}
EXTRA_OVERRIDES=${EXTRA_OVERRIDES:-}
RUN_DIR=${RUN_DIR:-$SCALERL_REPO/outputs/slurm/${SLURM_JOB_NAME:-scalerl}-${SLURM_JOB_ID:-0}}

GEN_NODES=()
TRAIN_NODES=()
SHARED_NODE=0
GEN_NODES_PER_SERVER=1
ENGINE_URLS=()
STEP_PIDS=()
STEP_NAMES=()
STEP_LOGS=()
STEP_NODES=()
CMD=()
MEM_ARGS=()
OVERRIDES=()
# What the composed config says (scalerl_validate_config fills these before any step starts)
CFG_PRECISION=fp32_head
CFG_PARAMS_DTYPE=bfloat16
CFG_SEED=0
CFG_ROUTED_EXPERTS=0
CFG_PAUSE_MODE=in_place
CFG_SIGTERM_GRACE_S=120
CFG_SEQUENCE_PARALLEL=0
CFG_QUANTIZATION=none
CFG_KV_CACHE_DTYPE=auto

scalerl_log() { printf '[scalerl %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
scalerl_die() { printf '[scalerl] ERROR: %s\n' "$*" >&2; exit 1; }

# Print one hostname per line for a Slurm nodelist (scontrol when it works, else the Python parser).
scalerl_hostnames() {
  local nodelist=$1
  if [[ $DRY_RUN != 1 ]] && command -v scontrol >/dev/null 2>&1 && scontrol show hostnames "$nodelist" 2>/dev/null; then
    return 0
  fi
  PYTHONPATH="$SCALERL_REPO${PYTHONPATH:+:$PYTHONPATH}" "$SCALERL_PYTHON" -m scalerl_mega.cluster.allocation hostnames "$nodelist"
}

# Fill GEN_NODES / TRAIN_NODES from SLURM_JOB_NODELIST: the last TRAINER_NODES nodes train.
scalerl_split_nodes() {
  [[ -n ${SLURM_JOB_NODELIST:-} ]] || scalerl_die "SLURM_JOB_NODELIST is not set (run under sbatch, or export it with DRY_RUN=1)"
  local nodes=()
  mapfile -t nodes < <(scalerl_hostnames "$SLURM_JOB_NODELIST")
  local n=${#nodes[@]}
  ((n > 0)) || scalerl_die "no nodes in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"
  if ((n == 1)); then
    GEN_NODES=("${nodes[0]}"); TRAIN_NODES=("${nodes[0]}"); SHARED_NODE=1
  else
    ((TRAINER_NODES >= 1 && TRAINER_NODES < n)) || scalerl_die "TRAINER_NODES=$TRAINER_NODES must be in [1, $((n - 1))] for $n nodes"
    GEN_NODES=("${nodes[@]:0:n-TRAINER_NODES}")
    TRAIN_NODES=("${nodes[@]:n-TRAINER_NODES}")
  fi
  GEN_NODES_PER_SERVER=1
  if ((GPUS_PER_NODE > 0)) && ((GEN_TP > GPUS_PER_NODE)); then
    # one server over several nodes (DeepSeek-V3 in bf16: GEN_TP 16 on 8-GPU nodes)
    ((GEN_TP % GPUS_PER_NODE == 0)) || scalerl_die "GEN_TP=$GEN_TP must divide GPUS_PER_NODE=$GPUS_PER_NODE or be a multiple of it"
    GEN_NODES_PER_SERVER=$((GEN_TP / GPUS_PER_NODE))
    ((SHARED_NODE == 0)) || scalerl_die "GEN_TP=$GEN_TP spans $GEN_NODES_PER_SERVER nodes of GPUS_PER_NODE=$GPUS_PER_NODE: a one-node allocation cannot hold it"
    ((${#GEN_NODES[@]} % GEN_NODES_PER_SERVER == 0)) || scalerl_die "GEN_TP=$GEN_TP spans $GEN_NODES_PER_SERVER nodes per server, but there are ${#GEN_NODES[@]} generator nodes (${#nodes[@]} allocated - TRAINER_NODES=$TRAINER_NODES): allocate a multiple of $GEN_NODES_PER_SERVER"
  elif ((GPUS_PER_NODE > 0)) && ((GPUS_PER_NODE % GEN_TP != 0)); then
    scalerl_die "GEN_TP=$GEN_TP must divide GPUS_PER_NODE=$GPUS_PER_NODE or be a multiple of it"
  fi
}

# Servers per generator node: one per TP group (one in CPU runs; 1 where a server spans several nodes).
scalerl_servers_per_node() {
  if ((GPUS_PER_NODE > 0)) && ((GEN_TP <= GPUS_PER_NODE)); then echo $((GPUS_PER_NODE / GEN_TP)); else echo 1; fi
}

# Hook: command of an inference server on `node` at `port` -> CMD. `gpu_base` is the server's first
# device on the node; Slurm's per-step GPU binding already renumbers them from 0, so it is unused.
scalerl_generator_cmd() {
  local node=$1 port=$2 gpu_base=$3
  local path=$MODEL_PATH
  if [[ -z $path ]]; then
    [[ $DRY_RUN == 1 ]] || scalerl_die "MODEL_PATH is not set (HF checkpoint for the SGLang servers)"
    path='<MODEL_PATH>'
  fi
  CMD=("$SGLANG_PYTHON" -m sglang.launch_server --model-path "$path" --tp-size "$GEN_TP"
       --host 0.0.0.0 --port "$port" --mem-fraction-static "$MEM_FRACTION"
       --dtype "$CFG_PARAMS_DTYPE" --random-seed "$CFG_SEED")
  # the generator half of the FP32 LM head (paper Sec. 3.2); the trainer's half is precision=fp32_head
  if [[ $CFG_PRECISION == fp32_head ]]; then CMD+=(--enable-fp32-lm-head); fi
  # MoE routes for rollout routing replay (moe.record_routes; scalerl_mega/rollout/sglang/)
  if [[ $CFG_ROUTED_EXPERTS == 1 ]]; then CMD+=(--enable-return-routed-experts); fi
  # PipelineRL's in-place updates: no stale prefix cache, exact version tags (rollout/sglang/launch.py IN_PLACE_FLAGS)
  if [[ $CFG_PAUSE_MODE == in_place ]]; then CMD+=(--disable-radix-cache --disable-overlap-schedule); fi
  # rollout.quantization=fp8: FP8 generators fed FP8 weight pushes (MODEL_PATH: a blockwise FP8 checkpoint)
  if [[ $CFG_QUANTIZATION == fp8 ]]; then CMD+=(--quantization fp8); fi
  # rollout.kv_cache_dtype: an FP8 KV cache (one byte per cached K or V element); auto is the model dtype
  if [[ $CFG_KV_CACHE_DTYPE != auto ]]; then CMD+=(--kv-cache-dtype "$CFG_KV_CACHE_DTYPE"); fi
  : "$node" "$gpu_base"
}

# Hook: URL polled until it answers 200 (SGLang: a real 1-token generation).
scalerl_health_url() { echo "$1/health_generate"; }

scalerl_engine_list() { local IFS=,; echo "[${ENGINE_URLS[*]}]"; }

scalerl_list() { local items=(); IFS=, read -r -a items <<<"$1"; local IFS=,; echo "[${items[*]}]"; }

# The trainer's Hydra overrides -> OVERRIDES (needs ENGINE_URLS; also validated before any step).
scalerl_overrides() {
  local nnodes=${#TRAIN_NODES[@]} nproc=$GPUS_PER_NODE
  ((nproc > 0)) || nproc=$CPU_RANKS
  OVERRIDES=("experiment=$EXPERIMENT" "model=$MODEL" "rollout=$ROLLOUT" "cluster=$CLUSTER"
    "rollout.engine_urls=$(scalerl_engine_list)" "rollout.num_engines=${#ENGINE_URLS[@]}"
    "rollout.sglang_tp_size=$GEN_TP" "parallel.tp=$TP" "parallel.pp=$PP" "parallel.ep=$EP")
  if [[ $SEQUENCE_PARALLEL == 1 ]] && ((TP > 1)); then OVERRIDES+=("parallel.sequence_parallel=true"); fi
  if [[ -n $RECOMPUTE ]]; then OVERRIDES+=("train.recompute=$RECOMPUTE"); fi
  if [[ -n $SYNC_SENDERS ]]; then OVERRIDES+=("rollout.weight_sync_senders=$SYNC_SENDERS"); fi
  if [[ -n $KV_CACHE_DTYPE ]]; then OVERRIDES+=("rollout.kv_cache_dtype=$KV_CACHE_DTYPE"); fi
  if [[ -n $MODEL_PATH ]]; then OVERRIDES+=("init_from_hf=$MODEL_PATH"); fi
  if [[ -n $DATA ]]; then OVERRIDES+=("data=$DATA"); fi
  if [[ -n $TRAIN_FILES ]]; then OVERRIDES+=("data.train_files=$(scalerl_list "$TRAIN_FILES")"); fi
  if [[ -n $CODE_FILES ]]; then OVERRIDES+=("data.code_files=$(scalerl_list "$CODE_FILES")"); fi
  if [[ -n $TOKENIZER_PATH ]]; then OVERRIDES+=("data.tokenizer_path=$TOKENIZER_PATH"); fi
  if ((GPUS_PER_NODE > 0)); then
    OVERRIDES+=("cluster.nodes=$((${#GEN_NODES[@]} + ${#TRAIN_NODES[@]} - SHARED_NODE))"
      "cluster.devices_per_node=$GPUS_PER_NODE" "cluster.trainer_devices=$((nnodes * nproc))"
      "cluster.generator_devices=$((${#ENGINE_URLS[@]} * GEN_TP))")
  fi
  OVERRIDES+=("resume=auto" "hydra.run.dir=$RUN_DIR")
  local extra=()
  read -r -a extra <<<"$EXTRA_OVERRIDES"
  OVERRIDES+=("${extra[@]}")
}

# Compose + validate the trainer's config here, before any server loads weights; take the settings
# the generator steps must share (precision / dtype / seed) from it. Exit 2 naming the key on error.
scalerl_validate_config() {
  local out line check=(--check-files)
  if [[ $DRY_RUN == 1 ]]; then check=(); fi
  # GPU runs: the layout's planned peak must fit this node's GPUs (nvidia-ml-py; without a reading, GPU_TYPE's
  # memory; GPU_MEM_BYTES overrides both)
  if ((GPUS_PER_NODE > 0)); then
    check+=(--gpu-mem-bytes "${GPU_MEM_BYTES:-auto}")
    if [[ -n $GPU_TYPE ]]; then check+=(--gpu-type "$GPU_TYPE"); fi
  fi
  if ! out=$("$SCALERL_PYTHON" -m scalerl_mega.cluster.launch_config "${check[@]}" "${OVERRIDES[@]}"); then
    scalerl_log "the trainer config does not validate (see the error above); no step started"
    exit 2
  fi
  while IFS='=' read -r key value; do
    case $key in
      PRECISION) CFG_PRECISION=$value ;;
      PARAMS_DTYPE) CFG_PARAMS_DTYPE=$value ;;
      SEED) CFG_SEED=$value ;;
      ROUTED_EXPERTS) CFG_ROUTED_EXPERTS=$value ;;
      PAUSE_MODE) CFG_PAUSE_MODE=$value ;;
      SIGTERM_GRACE_S) CFG_SIGTERM_GRACE_S=$value ;;
      SEQUENCE_PARALLEL) CFG_SEQUENCE_PARALLEL=$value ;;
      QUANTIZATION) CFG_QUANTIZATION=$value ;;
      KV_CACHE_DTYPE) CFG_KV_CACHE_DTYPE=$value ;;
    esac
  done <<<"$out"
  line="precision=$CFG_PRECISION params_dtype=$CFG_PARAMS_DTYPE seed=$CFG_SEED"
  if [[ $DRY_RUN == 1 ]]; then printf 'config: %s\n' "$line"; else scalerl_log "config validated: $line"; fi
}

# The trainer's and the generators' envs must load the same NCCL (weight pushes form one NCCL group;
# NCCL refuses mismatched versions at communicator init). GPU runs only; exit 2 before any step.
scalerl_check_nccl() {
  ((GPUS_PER_NODE > 0)) || return 0
  local check=("$SCALERL_PYTHON" -m scalerl_mega.cluster.gpu_envs nccl --trainer-python "$SCALERL_PYTHON"
               --generator-python "$SGLANG_PYTHON")
  if [[ $DRY_RUN == 1 ]]; then
    printf 'nccl check: %s\n' "$(scalerl_quote "${check[@]}")"
    return 0
  fi
  if ! PYTHONPATH="$SCALERL_REPO${PYTHONPATH:+:$PYTHONPATH}" "${check[@]}"; then
    scalerl_log "the trainer and generator environments do not share one NCCL (see above); no step started"
    exit 2
  fi
}

# Hook: the trainer command (run once per trainer node by one srun step) -> CMD.
# On SIGTERM torchrun forwards it to the ranks and SIGKILLs them after --shutdown-timeout (default 30 s):
# give them the trainer's own train.sigterm_grace_s to reach a safe point and checkpoint, plus 30 s.
scalerl_trainer_cmd() {
  local nnodes=${#TRAIN_NODES[@]} nproc=$GPUS_PER_NODE
  ((nproc > 0)) || nproc=$CPU_RANKS
  CMD=("$SCALERL_PYTHON" -m torch.distributed.run --nnodes "$nnodes" --nproc-per-node "$nproc"
       --rdzv-backend c10d --rdzv-endpoint "${TRAIN_NODES[0]}:$MASTER_PORT" --rdzv-id "${SLURM_JOB_ID:-0}"
       --shutdown-timeout "$((CFG_SIGTERM_GRACE_S + 30))"
       -m scalerl_mega.train "${OVERRIDES[@]}")
}

scalerl_quote() { printf '%q ' "$@"; }

# HEALTH_TIMEOUT unless set: 600 s + 1 s per 200 MB of MODEL_PATH's safetensors (servers read it all).
scalerl_health_timeout() {
  [[ -z $HEALTH_TIMEOUT ]] || return 0
  local bytes=0
  if [[ -n $MODEL_PATH && -d $MODEL_PATH ]]; then
    bytes=$(find "$MODEL_PATH" -maxdepth 1 -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {printf "%.0f", s}')
  fi
  HEALTH_TIMEOUT=$((600 + bytes / 200000000))
}

# Host memory of a step with `gpus` GPUs -> MEM_ARGS (srun --mem or --mem-per-cpu; none on CPU runs).
scalerl_mem_args() {
  local gpus=$1 per_gpu=$MEM_PER_GPU
  MEM_ARGS=()
  ((GPUS_PER_NODE > 0 && gpus > 0)) || return 0
  if [[ -z $per_gpu && -n ${SLURM_MEM_PER_NODE:-} ]]; then per_gpu=$((SLURM_MEM_PER_NODE / GPUS_PER_NODE)); fi
  if [[ -n $per_gpu ]]; then
    MEM_ARGS=(--mem="$((gpus * per_gpu))M")
  elif [[ -n ${SLURM_MEM_PER_CPU:-} ]]; then
    MEM_ARGS=(--mem-per-cpu="${SLURM_MEM_PER_CPU}M")
  fi
}

# Environment every step gets explicitly (srun --export, so a site's SBATCH_EXPORT=NONE cannot drop it):
# the NCCL/Gloo interface; CUDA_DEVICE_MAX_CONNECTIONS=1 for a sequence-parallel trainer (Megatron's
# TP/SP communication overlap relies on one hardware queue).
scalerl_export_arg() {
  local role=$1 vars=ALL name
  for name in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME; do
    if [[ -n ${!name:-} ]]; then vars+=",$name=${!name}"; fi
  done
  if [[ $role == trainer && $CFG_SEQUENCE_PARALLEL == 1 ]]; then vars+=",CUDA_DEVICE_MAX_CONNECTIONS=1"; fi
  echo "--export=$vars"
}

# Start one job step in the background: scalerl_step NAME NODES NTASKS GPUS_PER_TASK CPUS_PER_TASK -- command...
# (Slurm binds the step's GPUs: CUDA_VISIBLE_DEVICES inside the step lists only those.)
scalerl_step() {
  local name=$1 step_nodes=$2 ntasks=$3 gpus=$4 cpus=$5
  shift 6
  local nnodes gres=() role=gen
  nnodes=$(awk -F, '{print NF}' <<<"$step_nodes")
  if ((gpus > 0)); then gres=(--gres="gpu:$gpus"); fi
  if [[ $name == trainer ]]; then role=trainer; fi
  scalerl_mem_args "$gpus"
  local log="$RUN_DIR/slurm/${SLURM_JOB_ID:-0}.$name.log"
  local srun=(srun --exact --kill-on-bad-exit=1 --job-name="$name" --nodes="$nnodes" --ntasks="$ntasks"
              --ntasks-per-node=1 --cpus-per-task="$cpus" --nodelist="$step_nodes" --output="$log" "${gres[@]}"
              "${MEM_ARGS[@]}" "$(scalerl_export_arg "$role")")
  if [[ $DRY_RUN == 1 ]]; then
    printf 'step %s on %s: %s\n' "$name" "$step_nodes" "$(scalerl_quote "${srun[@]}" "$@")"
    return 0
  fi
  "${srun[@]}" "$@" &
  STEP_PIDS+=("$!"); STEP_NAMES+=("$name"); STEP_LOGS+=("$log"); STEP_NODES+=("$step_nodes")
  scalerl_log "started step $name on $step_nodes (pid $!, log $log)"
}

scalerl_stop_steps() {
  local pid
  for pid in "${STEP_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STEP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}

scalerl_fail() {
  local i=$1 rc=$2
  printf '[scalerl] FAILED: step %s on %s exited with code %s; stopping the job. Last lines of %s:\n' \
    "${STEP_NAMES[i]}" "${STEP_NODES[i]}" "$rc" "${STEP_LOGS[i]}" >&2
  tail -n 20 "${STEP_LOGS[i]}" >&2 2>/dev/null || true
  # under torchrun the tail is the launcher's summary; the worker's exception is further up
  printf '[scalerl] error lines of %s:\n' "${STEP_LOGS[i]}" >&2
  grep -E '^[A-Za-z_.]*(Error|Exception)\b|^Traceback' "${STEP_LOGS[i]}" 2>/dev/null | tail -n 5 >&2 || true
  scalerl_stop_steps
  exit "$rc"
}

scalerl_index_of_pid() {
  local pid=$1 i
  for i in "${!STEP_PIDS[@]}"; do [[ ${STEP_PIDS[i]} == "$pid" ]] && { echo "$i"; return 0; }; done
  echo -1
}

# Poll every server until healthy; fail fast if a server step dies meanwhile.
scalerl_wait_healthy() {
  local deadline=$((SECONDS + HEALTH_TIMEOUT)) url i
  for url in "${ENGINE_URLS[@]}"; do
    until "$SCALERL_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "$(scalerl_health_url "$url")" >/dev/null 2>&1; do
      for i in "${!STEP_PIDS[@]}"; do
        if ! kill -0 "${STEP_PIDS[i]}" 2>/dev/null; then
          local rc=0
          wait "${STEP_PIDS[i]}" || rc=$?
          ((rc != 0)) || rc=1
          scalerl_fail "$i" "$rc"
        fi
      done
      ((SECONDS < deadline)) || { scalerl_log "server $url not healthy after ${HEALTH_TIMEOUT}s"; scalerl_stop_steps; exit 1; }
      sleep 2
    done
    scalerl_log "server $url healthy"
  done
}

scalerl_on_signal() {
  local sig=$1
  scalerl_log "received $sig"
  if [[ $sig == USR1 && -n ${SLURM_JOB_ID:-} ]]; then
    scalerl_log "requeueing job $SLURM_JOB_ID (it resumes from $RUN_DIR with resume=auto)"
    scontrol requeue "$SLURM_JOB_ID" || true
  fi
  scalerl_stop_steps
  exit 143
}

# Supervise: the trainer's exit ends the job; any other step exiting first is a failure.
scalerl_supervise() {
  local trainer_idx=$1 done_pid rc i
  while true; do
    rc=0
    wait -n -p done_pid "${STEP_PIDS[@]}" || rc=$?
    [[ -n ${done_pid:-} ]] || continue
    i=$(scalerl_index_of_pid "$done_pid")
    if ((i == trainer_idx)) && ((rc == 0)); then
      scalerl_log "trainer finished; stopping servers"
      unset 'STEP_PIDS[i]'
      scalerl_stop_steps
      return 0
    fi
    ((rc != 0)) || rc=1  # a server exiting, even cleanly, leaves the trainer without engines
    scalerl_fail "$i" "$rc"
  done
}

scalerl_main() {
  scalerl_split_nodes
  [[ $DRY_RUN == 1 ]] || mkdir -p "$RUN_DIR/slurm"
  scalerl_log "job ${SLURM_JOB_ID:-?} restart ${SLURM_RESTART_COUNT:-0}: generators [${GEN_NODES[*]}], trainer [${TRAIN_NODES[*]}], run dir $RUN_DIR"
  trap 'scalerl_on_signal USR1' USR1
  trap 'scalerl_on_signal TERM' TERM
  local per_node node s port
  per_node=$(scalerl_servers_per_node)
  ENGINE_URLS=()
  local g
  for ((g = 0; g < ${#GEN_NODES[@]}; g += GEN_NODES_PER_SERVER)); do  # a multi-node server: its first node's URL
    node=${GEN_NODES[g]}
    for ((s = 0; s < per_node; s++)); do ENGINE_URLS+=("http://$node:$((PORT_BASE + s))"); done
  done
  scalerl_overrides
  scalerl_validate_config
  scalerl_check_nccl
  scalerl_health_timeout
  if [[ $DRY_RUN == 1 ]]; then printf 'health timeout: %ss\n' "$HEALTH_TIMEOUT"; fi
  # one step per server and node: a server spanning GEN_NODES_PER_SERVER nodes runs SGLang's --nnodes/--node-rank
  # over its first node's --dist-init-addr, and gets the node's GPUs; a smaller one gets its GEN_TP
  local idx=0 r head name gpus=$((GPUS_PER_NODE > 0 ? (GEN_TP < GPUS_PER_NODE ? GEN_TP : GPUS_PER_NODE) : 0))
  for ((g = 0; g < ${#GEN_NODES[@]}; g += GEN_NODES_PER_SERVER)); do
    head=${GEN_NODES[g]}
    for ((s = 0; s < per_node; s++)); do
      port=$((PORT_BASE + s))
      for ((r = 0; r < GEN_NODES_PER_SERVER; r++)); do
        node=${GEN_NODES[g + r]}
        scalerl_generator_cmd "$node" "$port" "$((s * GEN_TP))"
        name=gen$idx
        if ((GEN_NODES_PER_SERVER > 1)); then
          CMD+=(--nnodes "$GEN_NODES_PER_SERVER" --node-rank "$r" --dist-init-addr "$head:$GEN_DIST_PORT")
          name=gen$idx.node$r
        fi
        scalerl_step "$name" "$node" 1 "$gpus" "$CPUS_PER_GEN" -- "${CMD[@]}"
      done
      idx=$((idx + 1))
    done
  done
  [[ $DRY_RUN == 1 ]] || scalerl_wait_healthy
  scalerl_trainer_cmd
  local trainer_nodes
  trainer_nodes=$(IFS=,; echo "${TRAIN_NODES[*]}")
  scalerl_step trainer "$trainer_nodes" "${#TRAIN_NODES[@]}" "$GPUS_PER_NODE" "$CPUS_PER_TRAINER" -- "${CMD[@]}"
  if [[ $DRY_RUN == 1 ]]; then
    printf 'engine urls: %s\n' "$(scalerl_engine_list)"
    return 0
  fi
  scalerl_supervise "$((${#STEP_PIDS[@]} - 1))"
}
