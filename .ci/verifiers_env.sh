#!/usr/bin/env bash
# Creates verifiers 0.4's own environment for `env=agent` episodes run by verifiers (docs/extending.md,
# "verifiers 0.4"; tools/verifiers_rollout.py): verifiers pins openai<3, the trainer's .venv has openai 3, so it
# gets a venv of its own, every package pinned (.ci/verifiers_constraints.txt: the set pip resolved for
# verifiers==0.4.0 on Python 3.11). The install is the only step that needs the package index; the rollouts
# then run offline (`--harness local`). Idempotent: a stamp holding the hash of this script and the pins marks
# a finished install; changed pins re-run the install into the same venv.
# Usage: .ci/verifiers_env.sh [VENV_DIR]   (default .venv-verifiers)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-verifiers}"
PYTHON="${PYTHON:-python3.11}"
PINS=.ci/verifiers_constraints.txt
STAMP="$VENV/.installed"
HASH="$(cat "$0" "$PINS" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  echo "verifiers env $VENV: up to date"
  exit 0
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "need $PYTHON (set PYTHON=...)"; exit 1; }
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c "$PINS" verifiers==0.4.0 openai==2.54.0
"$VENV/bin/python" -c "import verifiers, openai, verifiers.v1; print('verifiers', verifiers.__version__, 'openai', openai.__version__)"
echo "$HASH" > "$STAMP"
