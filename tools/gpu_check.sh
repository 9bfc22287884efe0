#!/usr/bin/env bash
# One GPU session's checks in one call, <= 9 minutes on one H200 (docs/cluster_and_gpu.md "GPU check"):
#   1. versions                      -> versions.txt
#   2. the GPU suite (tests/gpu)     -> gpu_suite.log
#   3. the LM head as the trainer calls it (bf16-valued FP32 hidden states, FP32 weight, entropy on) at the
#      Llama shape N=16384 H=4096 V=131072 against naive (and the old 3xTF32 mode), errors vs float64
#      (bench/fused_cispo.py)        -> head.log, head.json
#   4. a bf16 RL loop of a ~0.5B model on the same GPU end to end (Megatron trainer + in-process local engine),
#      saved and resumed in a fresh process (bench/rl_loop.py)  -> rl_loop.log, rl_loop.json
#   5. summary.json (bench/gpu_summary.py): versions, suite counts, head error + time over naive, RL tokens/s,
#      MFU, push time, resume matched. At most 8 files in OUT; run directories live in a temporary directory.
# Each stage has its own time limit, so a hang leaves the others' results. Exit 0 when every stage passed.
#
#   tools/gpu_check.sh OUT [SUITE_S HEAD_S RL_S]   # GPU machine; its python3 (GPU_PY) with CUDA torch + Triton
#   tools/gpu_check.sh --cpu OUT                   # rehearsal: every stage at toy size on CPU (default test suite)
#
# What the machine's Python lacks (megatron-core, hydra, transformers, ...) is installed with --no-deps from the
# wheels of `make gpu-wheels` (GPU_WHEELS, default .whl/) into GPU_SITE; torch is never installed or changed.
set -u -o pipefail
mode=gpu
if [ "${1:-}" = "--cpu" ]; then mode=cpu; shift; fi
out=${1:?usage: tools/gpu_check.sh [--cpu] OUT [SUITE_S HEAD_S RL_S]}
suite_s=${2:-220}
head_s=${3:-100}
rl_s=${4:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${GPU_PY:-python3}
wheels=${GPU_WHEELS:-$root/.whl}
site=${GPU_SITE:-/tmp/scalerl-gpu-site}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/scalerl-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

has_deps='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("megatron.core", "omegaconf", "hydra", "transformers")))'
if ! "$py" -c "$has_deps" 2>/dev/null; then
  if ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "installing $wheels/*.whl into $site (--no-deps: torch untouched)"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$wheels"/*.whl || exit 1
  else
    echo "gpu_check: $py lacks megatron-core/hydra/transformers and $wheels has no wheels (make gpu-wheels)" >&2
    exit 1
  fi
fi
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
stages=()

stage() {  # stage NAME LIMIT_S LOG COMMAND...: run under a time limit, output to LOG, record rc and wall time
  local name=$1 limit=$2 log=$3 t0 rc
  shift 3
  t0=$(date +%s)
  timeout --kill-after=20 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  stages+=("$name:$rc:$(( $(date +%s) - t0 ))")
  echo "== $name rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee -a "$log"
}

{
  date -u
  echo "mode $mode; tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if [ "$mode" = gpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  fi
} >"$out/versions.txt"
stage versions 60 "$out/versions.txt" "$py" bench/gpu_summary.py --versions

if [ "$mode" = gpu ]; then
  stage gpu_suite "$suite_s" "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -s -q tests/gpu
  stage head "$head_s" "$out/head.log" "$py" bench/fused_cispo.py --device cuda --dtype float32 \
    --bf16-valued-hidden --error --shapes 16384,4096,131072 --variants naive trainer triton \
    --fp32-precision tf32x3 --iters 5 --json "$out/head.json"
  stage rl_loop "$rl_s" "$out/rl_loop.log" "$py" bench/rl_loop.py --work "$work/rl" \
    --json "$out/rl_loop.json" --log "$out/rl_loop.log" --timeout "$rl_s"
else
  stage gpu_suite 120 "$out/gpu_suite.log" "$py" -m pytest -p no:cacheprovider -m gpu -q tests/gpu
  stage head 120 "$out/head.log" "$py" bench/fused_cispo.py --device cpu --dtype float32 --bf16-valued-hidden \
    --error --shapes 512,64,1024 --variants naive trainer --rounds 1 --json "$out/head.json"
  stage rl_loop 300 "$out/rl_loop.log" "$py" bench/rl_loop.py --cpu --work "$work/rl" \
    --json "$out/rl_loop.json" --log "$out/rl_loop.log" --timeout 240
fi

"$py" bench/gpu_summary.py --out "$out" --mode "$mode" "${stages[@]/#/--stage=}"
