#!/usr/bin/env bash
# The GPU kit rehearsed as the GPU machine will run it (make test-compat's last line):
#   tools/gpu_rehearsal.sh COMPAT_VENV WHEELS DIR
# DIR/venv is a bare Python 3.12 venv (COMPAT_VENV's interpreter, none of its packages) given only what a GPU
# machine's Python brings: torch with its requirements (Triton, ...), numpy and pytest, taken from COMPAT_VENV
# (symlinked into DIR/base, a .pth entry). Everything else comes from exactly the wheel set in WHEELS
# (`make gpu-wheels`: megatron-core 0.19.2, hydra, transformers, ...), which `tools/gpu_check.sh --cpu DIR/out`
# installs itself, --no-deps, into DIR/site. Exit 0 when the kit's summary is ok and its install stage ran.
set -eu -o pipefail
compat=${1:?usage: tools/gpu_rehearsal.sh COMPAT_VENV WHEELS DIR}
wheels=$(cd "${2:?usage: tools/gpu_rehearsal.sh COMPAT_VENV WHEELS DIR}" && pwd)
dir=${3:?usage: tools/gpu_rehearsal.sh COMPAT_VENV WHEELS DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir"
mkdir -p "$dir/base"
dir=$(cd "$dir" && pwd)
"$compat/bin/python" -m venv "$dir/venv"  # with pip, as a GPU machine's Python has
"$compat/bin/python" - "$dir/base" <<'EOF'
"""Symlink the device's packages (torch and its requirements, numpy, pytest and theirs) into BASE."""
import importlib.metadata as md
import os
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

base = sys.argv[1]
todo, seen = ["torch", "numpy", "pytest"], set()
while todo:
    name = canonicalize_name(todo.pop())
    if name in seen:
        continue
    seen.add(name)
    dist = md.distribution(name)
    for r in dist.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
    site = str(dist.locate_file(""))
    tops = {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "bin", "__pycache__")}
    for top in tops:
        src, dst = os.path.join(site, top), os.path.join(base, top)
        if os.path.exists(src) and not os.path.lexists(dst):
            os.symlink(src, dst)
print(f"device base: {len(seen)} distributions ({', '.join(sorted(seen)[:8])}, ...)")
EOF
site_packages=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$dir/base" >"$site_packages/device_base.pth"
"$dir/venv/bin/python" -c 'import torch, sys; print("rehearsal venv: Python", sys.version.split()[0], "torch", torch.__version__)'
rc=0
GPU_PY="$dir/venv/bin/python" GPU_WHEELS="$wheels" GPU_SITE="$dir/site" TMPDIR="$dir" \
  "$root/tools/gpu_check.sh" --cpu "$dir/out" || rc=$?
"$dir/venv/bin/python" - "$dir/out/summary.json" <<'EOF'
import json
import sys

s = json.load(open(sys.argv[1]))
install = s["stages"]["install"]["status"]
print(f"gpu rehearsal: install {install}, megatron-core {s['versions'].get('megatron-core')}, "
      f"rl_loop params {s['rl_loop'].get('params_dtype')}, resume matched {s['rl_loop'].get('resume_matched')}")
sys.exit(0 if s["ok"] and install == "done" else 1)
EOF
exit $rc
