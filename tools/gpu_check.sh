#!/usr/bin/env bash
# One GPU session's checks, in one call: the GPU suite (`make test-gpu`), then the fused CISPO benchmark
# (`make bench-gpu`), each under its own time limit so that a hang in one still leaves the other's output.
# Logs and JSON go to OUT_DIR (default bench/out). Needs the wheels from `make gpu-wheels` in .whl/ when the
# machine's python3 lacks megatron-core/omegaconf. Usage: tools/gpu_check.sh [OUT_DIR] [TEST_S] [BENCH_S]
set -u -o pipefail
out=${1:-bench/out}
test_s=${2:-300}
bench_s=${3:-180}
mkdir -p "$out" bench/out
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" 2>&1
  python3 -c "import transformer_engine as te; print('transformer_engine', te.__version__)" 2>&1 | tail -1
  command -v make || echo "no make"
} | tee "$out/env.txt"

t0=$(date +%s)
timeout "$test_s" make test-gpu 2>&1 | tee "$out/test_gpu.log"
echo "test-gpu rc=${PIPESTATUS[0]} wall_s=$(( $(date +%s) - t0 ))" | tee -a "$out/test_gpu.log"

t0=$(date +%s)
timeout "$bench_s" make bench-gpu 2>&1 | tee "$out/bench_gpu.log"
echo "bench-gpu rc=${PIPESTATUS[0]} wall_s=$(( $(date +%s) - t0 ))" | tee -a "$out/bench_gpu.log"
cp bench/out/fused_cispo_gpu.json "$out/" 2>/dev/null || true
