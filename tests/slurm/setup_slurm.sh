#!/usr/bin/env bash
# Stand up a private single-node Slurm (Debian 12: slurm-wlm 22.05 + munge) on localhost, as root,
# without systemd. Installs the packages with apt when
# they are missing. All state lives in $SL; daemons' PIDs in $SL/run/*.bgpid for teardown_slurm.sh.
# Usage: SL=<state dir> [CTLD_PORT=6817 SLURMD_PORT=6818] tests/slurm/setup_slurm.sh
# Afterwards: export SLURM_CONF=$SL/etc/slurm.conf
# Exit codes: 0 up and idle; 3 cannot run here (not root / no apt / ports busy), reason on stderr; 1 failed.
set -euo pipefail
SL=${SL:?set SL to a state directory}
CTLD_PORT=${CTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
skip() { echo "SKIP: $*" >&2; exit 3; }

[[ $(id -u) == 0 ]] || skip "needs root to run slurmctld/slurmd/munged"
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1 && [[ ! -x /usr/sbin/munged ]]; then
  command -v apt-get >/dev/null 2>&1 || skip "slurm-wlm/munge missing and apt-get unavailable"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge; } >"${TMPDIR:-/tmp}/scalerl_apt_slurm.log" 2>&1 \
    || skip "apt-get install slurm-wlm munge failed (see ${TMPDIR:-/tmp}/scalerl_apt_slurm.log)"
fi
for port in "$CTLD_PORT" "$SLURMD_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then skip "port $port is in use (another Slurm?)"; fi
done

NODE=${NODE:-$(hostname -s)}
getent hosts "$NODE" >/dev/null || echo "127.0.0.1 $NODE" >>/etc/hosts
CPUS=$(nproc)
MEM=$(($(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 8 / 10))
export SLURM_CONF=$SL/etc/slurm.conf
mkdir -p "$SL"/{etc,run,spool/slurmd,state,log,jobs}

# munge: the package's postinst creates the key; create one if missing
if [[ ! -s /etc/munge/munge.key ]]; then dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  touch "$SL/run/munged.started_here"
  for _ in $(seq 1 40); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.25; done
fi

cat >"$SLURM_CONF" <<CONF
ClusterName=scalerltest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmctldPidFile=$SL/run/slurmctld.pid
SlurmdPidFile=$SL/run/slurmd.pid
SlurmdSpoolDir=$SL/spool/slurmd
StateSaveLocation=$SL/state
SlurmctldLogFile=$SL/log/slurmctld.log
SlurmdLogFile=$SL/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
KillWait=5
MinJobAge=3600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$SL/log/jobcomp.txt
NodeName=$NODE NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

/usr/sbin/slurmctld -D >"$SL/log/slurmctld.out" 2>&1 &
echo $! >"$SL/run/slurmctld.bgpid"
/usr/sbin/slurmd -D -N "$NODE" >"$SL/log/slurmd.out" 2>&1 &
echo $! >"$SL/run/slurmd.bgpid"
for _ in $(seq 1 120); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && { sinfo; exit 0; }
  sleep 0.25
done
echo "Slurm did not become idle; logs in $SL/log" >&2
exit 1
