#!/usr/bin/env bash
# One GPU session's checks in one call that always brings back a summary (docs/cluster_and_gpu.md "GPU check"):
#   1. versions (python, torch, Triton, CUDA, megatron-core, ...) -> versions.txt
#   2. install: what the machine's Python lacks, --no-deps from GPU_WHEELS (never torch) -> versions.txt
#   3. the GPU suite (tests/gpu, Megatron-Core tests first)   -> gpu_suite.log
#   4. the LM head as the trainer calls it at N=16384 H=4096 V=131072 against naive and the 3xTF32 mode, errors
#      vs float64 (bench/fused_cispo.py)                    -> head.log, head.jsonl (a line per variant)
#   5. GPU only: FP8 rollout on a real SGLang server started with --quantization fp8, fed FP8 weights + block
#      scales in flight, its log-probs against the local FP8 emulation (tests/gpu/test_fp8_sglang_gpu.py; skipped
#      without the SGLang environment)                      -> appended to gpu_suite.log
#   6. GPU only: a Gated DeltaNet hybrid (tiny Qwen3.5) on a real SGLang server, weights of another seed pushed,
#      its log-probs against the FP32 trainer forward (tests/gpu/test_gdn_sglang_gpu.py; SGLang 0.5.23 lacks the
#      CPU kernels, docs/sglang.md)                         -> appended to gpu_suite.log
#   7. a bf16 RL loop of a ~0.5B model, saved and resumed in a fresh process (bench/rl_loop.py)
#                                                           -> rl_loop.log, rl_loop.json (run A's table first)
#   summary.json (bench/gpu_summary.py) from stages.jsonl and the files above: rewritten at every stage's start
#   and end and by the exit trap, so a kill (SIGTERM, the outer timeout's SIGKILL) still leaves one naming each
#   stage done / failed / timed out / killed / running / not reached. At most 8 files in OUT.
# One deadline: every stage ends DEADLINE_S after the start (default 480: a 600 s command limit keeps 120 s for
# start-up and transfers; 900 with --cpu); each stage's limit is what is left minus the later stages' minimums, capped.
#
#   tools/gpu_check.sh OUT [--deadline S]         # GPU machine; its python3 (GPU_PY) with CUDA torch + Triton
#   tools/gpu_check.sh --cpu OUT [--deadline S]   # rehearsal: every stage at toy size on CPU
#
# GPU_CHECK_HOLD_AT=POINT GPU_CHECK_HOLD_DIR=DIR pause at POINT (a stage name, or rl_loop.run_b) until
# DIR/POINT.release exists, after creating DIR/POINT.reached: the kill test's deterministic kill points.
set -u -o pipefail
mode=gpu
if [ "${1:-}" = "--cpu" ]; then mode=cpu; shift; fi
out=${1:?usage: tools/gpu_check.sh [--cpu] OUT [--deadline S]}
shift
deadline=""
while [ $# -gt 0 ]; do
  case $1 in
    --deadline) deadline=${2:?--deadline needs seconds}; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (usage: tools/gpu_check.sh [--cpu] OUT [--deadline S])" >&2; exit 2 ;;
  esac
done
# a GPU command has 600 s; the CPU rehearsal has no such limit but shares 2 loaded cores (tests, CI)
if [ "$mode" = gpu ]; then deadline=${deadline:-480}; rl_cap=400; else deadline=${deadline:-900}; rl_cap=600; fi
case $deadline in ''|*[!0-9]*) echo "gpu_check: --deadline '$deadline' is not a whole number of seconds" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
py=${GPU_PY:-python3}
wheels=${GPU_WHEELS:-$root/.whl}
site=${GPU_SITE:-/tmp/scalerl-gpu-site}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/{summary.json,stages.jsonl,versions.txt,gpu_suite.log,head.log,head.jsonl,rl_loop.log,rl_loop.json}
work=$(mktemp -d "${TMPDIR:-/tmp}/scalerl-gpu-check.XXXXXX")
t_start=$SECONDS
running=""   # the stage in progress and its process (killed by the trap)
child=""
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"

event() {  # event STAGE STATUS [KEY=NUMBER ...]: one line of stages.jsonl
  local line="{\"stage\": \"$1\", \"status\": \"$2\"" kv
  shift 2
  for kv in "$@"; do line+=", \"${kv%%=*}\": ${kv#*=}"; done
  echo "$line, \"at_s\": $(( SECONDS - t_start ))}" >>"$out/stages.jsonl"
}

summary() {  # summary.json from whatever exists (bench/gpu_summary.py imports nothing heavy)
  "$py" "$root/bench/gpu_summary.py" --out "$out" --mode "$mode" "$@" 2>>"$out/versions.txt"
}

finish() {  # the exit trap: stop the stage in progress, record it, write the summary, remove the work folder
  local rc=$?
  trap - EXIT TERM INT
  if [ -n "$running" ]; then
    if [ -n "$child" ]; then  # TERM to the stage's process group, KILL after 5 s
      kill -TERM -- "-$child" 2>/dev/null
      for _ in $(seq 50); do kill -0 -- "-$child" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$child" 2>/dev/null
    fi
    event "$running" killed "rc=$rc"
  fi
  summary
  rm -rf "$work"
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

hold() {  # the kill test's pause point (see the header)
  [ "${GPU_CHECK_HOLD_AT:-}" = "$1" ] || return 0
  touch "$GPU_CHECK_HOLD_DIR/$1.reached"
  while [ ! -e "$GPU_CHECK_HOLD_DIR/$1.release" ]; do sleep 0.05; done
}

GRACE=10  # seconds between timeout's SIGTERM and its SIGKILL, inside the stage's limit

stage() {  # stage NAME CAP_S RESERVE_S LOG COMMAND...: run under min(CAP, left - RESERVE), record the outcome
  local name=$1 cap=$2 reserve=$3 log=$4 left limit t0 rc status
  shift 4
  left=$(( deadline - (SECONDS - t_start) - reserve ))
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -le "$GRACE" ]; then
    event "$name" "not reached" "left_s=$left"
    echo "== $name not reached: ${left} s left before the deadline" | tee -a "$log"
    return 0
  fi
  t0=$SECONDS
  running=$name
  event "$name" running "limit_s=$limit"
  summary --quiet
  hold "$name"
  # its own process group (setsid), so that the trap can stop the stage's whole tree
  setsid timeout --kill-after=$GRACE $(( limit - GRACE )) "$@" >>"$log" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  running=""
  case $rc in
    0) status="done" ;;
    124|137) status="timed out" ;;
    *) status=failed ;;
  esac
  event "$name" "$status" "rc=$rc" "limit_s=$limit" "wall_s=$(( SECONDS - t0 ))"
  echo "== $name $status rc=$rc wall_s=$(( SECONDS - t0 )) limit_s=$limit" | tee -a "$log"
  summary --quiet
}

{
  date -u
  echo "mode $mode; tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); deadline ${deadline} s"
  if [ "$mode" = gpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  fi
} >"$out/versions.txt"
# minimum seconds each later stage keeps: install 20, suite 60, head 30, rl_loop 90 (GPU) / 60 (CPU)
if [ "$mode" = gpu ]; then rl_min=90; else rl_min=60; fi
stage versions 60 $(( 20 + 60 + 30 + rl_min )) "$out/versions.txt" "$py" bench/gpu_summary.py --versions

has_deps='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("megatron.core", "omegaconf", "hydra", "transformers")))'
if "$py" -c "$has_deps" 2>/dev/null; then
  event install skipped
else
  # the wheel set of `make gpu-wheels`: one version per distribution, and never torch/triton/numpy (the device's)
  # shellcheck disable=SC2012  # wheel file names: no odd characters
  bad=$(ls "$wheels"/*.whl 2>/dev/null | sed 's#.*/##' | awk -F- '
    { n = tolower($1); gsub(/[-_.]+/, "_", n); seen[n]++ }
    n ~ /^(torch|triton|numpy|nvidia_.*)$/ { print "gpu_check: " $0 " would install over the device'"'"'s " n }
    END { for (n in seen) if (seen[n] > 1) print "gpu_check: " seen[n] " versions of " n " in the wheel folder (make gpu-wheels keeps one)" }')
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "gpu_check: $py lacks megatron-core/hydra/transformers and $wheels has no wheels (make gpu-wheels)" | tee -a "$out/versions.txt" >&2
    event install failed "rc=1"
    exit 1
  elif [ -n "$bad" ]; then
    echo "$bad" | tee -a "$out/versions.txt" >&2
    event install failed "rc=1"
    exit 1
  fi
  echo "installing $wheels/*.whl into $site (--no-deps: torch untouched)" >>"$out/versions.txt"
  stage install 90 $(( 60 + 30 + rl_min )) "$out/versions.txt" "$py" -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
  if ! "$py" -c "$has_deps" 2>>"$out/versions.txt"; then
    echo "gpu_check: the install left megatron-core/hydra/transformers unimportable" >>"$out/versions.txt"
    exit 1
  fi
  "$py" bench/gpu_summary.py --versions --packages-only >>"$out/versions.txt" 2>&1  # what the install added
fi

if [ "$mode" = gpu ]; then
  # Megatron-Core first (the only checks of the trainer on a GPU), then the kernel's
  stage gpu_suite 180 $(( 30 + rl_min )) "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -s -q \
    tests/gpu/test_megatron_gpu.py tests/gpu/test_fused_logprob_gpu.py
  stage head 90 "$rl_min" "$out/head.log" "$py" bench/fused_cispo.py --device cuda --dtype float32 \
    --bf16-valued-hidden --error --shapes 16384,4096,131072 --variants naive trainer triton \
    --fp32-precision tf32x3 --iters 5 --jsonl "$out/head.jsonl"
  stage fp8_sync 150 "$rl_min" "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -s -q -rs \
    tests/gpu/test_fp8_sglang_gpu.py
  stage gdn_sglang 150 "$rl_min" "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -s -q -rs \
    tests/gpu/test_gdn_sglang_gpu.py
  rl_args=()
else
  stage gpu_suite 120 $(( 30 + rl_min )) "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -q \
    tests/gpu/test_megatron_gpu.py tests/gpu/test_fused_logprob_gpu.py
  stage head 90 "$rl_min" "$out/head.log" "$py" bench/fused_cispo.py --device cpu --dtype float32 \
    --bf16-valued-hidden --error --shapes 512,64,1024 --variants naive trainer --rounds 1 --jsonl "$out/head.jsonl"
  rl_args=(--cpu)
fi
# rl_loop.py's own budget ends both runs (and writes rl_loop.json) before the stage's limit kills it
left=$(( deadline - (SECONDS - t_start) ))
stage rl_loop $rl_cap 0 "$out/rl_loop.log" "$py" bench/rl_loop.py ${rl_args[@]+"${rl_args[@]}"} --work "$work/rl" \
  --json "$out/rl_loop.json" --log "$out/rl_loop.log" --budget $(( (left < rl_cap ? left : rl_cap) - GRACE - 15 ))

summary --quiet  # exit 0 only when everything passed; the trap writes (and prints) the summary again
"$py" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$out/summary.json"
