#!/usr/bin/env bash
# Creates the generator environment for `make test-sglang`: SGLang 0.5.23 with its own pins, separate from the
# trainer's .venv (SGLang needs torch 2.14.1 + torchvision 0.29.1; the trainer is pinned to torch 2.13.0).
# Recipe: docs/sglang.md. Idempotent: a stamp file holding this script's hash marks a finished
# install; a changed script (new pins) re-runs the install into the same venv.
# Usage: .ci/sglang_env.sh [VENV_DIR]   (default .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-sglang}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV/.installed"
HASH="$(sha256sum "$0" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  echo "sglang env $VENV: up to date"
  exit 0
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "need $PYTHON (set PYTHON=...)"; exit 1; }
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip
# SGLang imports torchvision at import time, and PyPI's torchvision needs the torch it was built against.
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
# SGLang's own metadata pulls the CUDA stack (sgl-kernel, flashinfer, ...): install it alone, then its light
# dependencies by name (the set its CPU serving path imports).
"${PIP[@]}" --no-deps sglang==0.5.23
"${PIP[@]}" transformers==5.19.0 tokenizers==0.23.2 fastapi uvicorn uvloop pyzmq msgspec orjson pybase64 \
  pydantic python-multipart requests aiohttp psutil setproctitle sentencepiece numpy scipy einops packaging \
  partial_json_parser interegular prometheus-client pillow tqdm xxhash zstandard safetensors openai==2.8.0 \
  distro easydict blobfile==3.0.0 gguf watchfiles python-dateutil ipython dill apache-tvm-ffi==0.1.11 \
  compressed-tensors==0.18.0 jsonschema xgrammar==0.2.7 soundfile==0.13.1
"$VENV/bin/python" -c "import sglang, torch, torchvision; print('sglang', sglang.__version__, 'torch', torch.__version__)"
echo "$HASH" > "$STAMP"
