#!/bin/bash
# Pack outputs/reproduce5 into reproduction/repro5/resume.tar.xz (README.md, "Continuing on another machine"),
# after the trainers have exited: per seed the latest checkpoint and the run files, the shared warm start.
set -euo pipefail
cd "$(dirname "$0")/../../outputs"
files=(reproduce5/sft)
for f in reproduce5/provenance.jsonl reproduce5/multirun.yaml; do if [ -e $f ]; then files+=($f); fi; done
for d in reproduce5/repro5_scalerl/seed*; do
  latest=$(cat $d/checkpoints/latest)
  files+=($d/checkpoints/latest $d/checkpoints/$latest)
  for f in metrics.jsonl run_config.yaml train.log sft.jsonl .hydra summary.json provenance.json; do
    if [ -e $d/$f ]; then files+=($d/$f); fi
  done
done
printf '%s\n' "${files[@]}"
tar -cf - "${files[@]}" | xz -6 -T2 > ../reproduction/repro5/resume.tar.xz
ls -la ../reproduction/repro5/resume.tar.xz
