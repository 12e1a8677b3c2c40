#!/bin/sh
# Starts a one-node Slurm cluster on this machine for the Slurm end-to-end tests: munge, slurmctld and
# slurmd from the distribution's packages, a `debug` partition, and a count-only `gpu` GRES: 4 of them
# backed by character devices that behave like /dev/null (Slurm's gpu plugin drops a GPU with no device
# file), so jobs can ask for GPUs, and get CUDA_VISIBLE_DEVICES from Slurm, on a machine without one.
# Run as root; idempotent.
# Usage: ci/slurm-up.sh   (installs the packages with apt-get when they are missing)
set -eu
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=cudabisect-ci
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=2
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$mem Gres=gpu:4 State=UNKNOWN
DefMemPerNode=256
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
for i in 0 1 2 3; do
    [ -e /run/slurm/fakegpu$i ] || mknod /run/slurm/fakegpu$i c 1 3
done
cat > /etc/slurm/gres.conf <<CONF
NodeName=$host Name=gpu File=/run/slurm/fakegpu[0-3]
CONF
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
fi
# munged runs as its own user. The package makes it, but a machine image can keep the package's files
# without its user (seen in CI), and munged then cannot start: the user is made when it is missing.
if ! id munge >/dev/null 2>&1; then
    getent group munge >/dev/null 2>&1 || groupadd --system munge
    useradd --system --gid munge --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin munge
fi
mkdir -p /var/lib/munge /var/log/munge
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
# munge: started as its own user, left over sockets and pid files from a killed one removed first, and
# checked by a round trip (Slurm's authentication rests on it).
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    pkill -x munged 2>/dev/null || true
    while pgrep -x munged >/dev/null; do sleep 0.2; done
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    su -s /bin/sh munge -c /usr/sbin/munged
    i=0
    until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -le 50 ] || { echo "munged did not come up" >&2; exit 1; }
        sleep 0.2
    done
fi
# A fresh start each time: the daemons read the configuration above.
pkill -x slurmd 2>/dev/null || true
pkill -x slurmctld 2>/dev/null || true
while pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null; do sleep 0.2; done
/usr/sbin/slurmctld -c
/usr/sbin/slurmd
# Wait for the node to come up (at most 90 s).
give_up=$(( $(date +%s) + 90 ))
until timeout 5 sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; do
    if [ "$(date +%s)" -ge "$give_up" ]; then
        echo "slurm did not come up:" >&2
        timeout 5 sinfo >&2 || true
        tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
        exit 1
    fi
    timeout 5 scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 1
done
sinfo
