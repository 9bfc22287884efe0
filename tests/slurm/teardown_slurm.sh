#!/usr/bin/env bash
# Stop the private Slurm started by setup_slurm.sh: cancel its jobs, TERM then KILL slurmd and
# slurmctld by their recorded PIDs, stop munged only if setup started it. --wipe removes $SL.
set -uo pipefail
SL=${SL:?set SL to the state directory given to setup_slurm.sh}
export SLURM_CONF=$SL/etc/slurm.conf
[[ -f $SLURM_CONF ]] && timeout 10 scancel --user=root >/dev/null 2>&1
stop_pid() {
  local pid=$1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -KILL "$pid" 2>/dev/null
}
for d in slurmd slurmctld; do
  [[ -f $SL/run/$d.bgpid ]] && stop_pid "$(cat "$SL/run/$d.bgpid")"
done
if [[ -f $SL/run/munged.started_here && -f /run/munge/munged.pid ]]; then
  stop_pid "$(cat /run/munge/munged.pid)"
fi
[[ ${1:-} == --wipe ]] && rm -rf "$SL"
exit 0
