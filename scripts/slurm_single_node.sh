#!/usr/bin/env bash
# A real single-node Slurm on this host, for Lifeboat's tests and CI (docs/slurm.md).
#
# Run as root; no systemd needed. Idempotent: safe to run twice, and when Slurm is already
# up it only checks that a trivial job still runs. It
#   1. installs Debian's slurmctld, slurmd, slurm-client and munge when they are missing;
#   2. writes /etc/slurm/slurm.conf for this host (the path every Slurm command reads);
#      state stays where Debian's packages put it: /var/lib/slurm/{slurmctld,slurmd},
#      logs in /var/log/slurm, pid files /run/slurmctld.pid and /run/slurmd.pid;
#   3. starts munged, slurmctld and slurmd when they are not running (restarts the two
#      Slurm daemons, and only them, when the config it writes has changed);
#   4. waits until `sinfo` shows the node usable and `sbatch --wrap true` has finished.
#
# It refuses to overwrite an /etc/slurm/slurm.conf that it did not write (a real
# cluster's) unless LIFEBOAT_SLURM_FORCE=1. LIFEBOAT_SLURM_TIMEOUT (s, default 120) bounds
# each wait.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
STATE_DIR=/var/lib/slurm/slurmctld
SPOOL_DIR=/var/lib/slurm/slurmd
LOG_DIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MARK="# Written by Lifeboat's scripts/slurm_single_node.sh; it rewrites this file."
TIMEOUT="${LIFEBOAT_SLURM_TIMEOUT:-120}"

T0=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) $T0" | awk '{printf "%.1f", $1 - $2}'; }
say() { echo "slurm_single_node: [$(elapsed) s] $*"; }
SHOW_LOGS=0 # set once the daemons are involved
die() {
  echo "slurm_single_node: ERROR after $(elapsed) s: $*" >&2
  [ "$SHOW_LOGS" = 1 ] || exit 1
  for log in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
    if [ -s "$log" ]; then
      echo "---- last lines of $log" >&2
      tail -n 15 "$log" >&2
    fi
  done
  exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

# One run at a time: tests and CI may call this concurrently. The daemons are started
# with fd 9 closed, or they would hold the lock for ever.
install -d /run/lock
exec 9>/run/lock/lifeboat-slurm.lock
flock -w 300 9 || die "another slurm_single_node.sh holds /run/lock/lifeboat-slurm.lock"

# Calls `check` every 0.2 s until it succeeds or TIMEOUT seconds have passed.
wait_until() {
  local what="$1"
  shift
  local deadline=$(($(date +%s) + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  say "$what"
}

# A pid file whose process is alive and has the expected name.
alive() {
  local pidfile="$1" name="$2" pid
  [ -s "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$name" ]
}

stop_pidfile() {
  local pidfile="$1" name="$2" pid
  alive "$pidfile" "$name" || return 0
  pid=$(cat "$pidfile")
  say "stopping $name (pid $pid)"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.2
  done
  die "$name (pid $pid) did not stop"
}

# 1. Packages.
missing=()
for pkg in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/lifeboat-slurm-apt.log 2>&1 ||
    { apt-get update >>/tmp/lifeboat-slurm-apt.log 2>&1 &&
      apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/lifeboat-slurm-apt.log 2>&1; } ||
    { tail -n 20 /tmp/lifeboat-slurm-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
  say "installed"
fi

SHOW_LOGS=1

# 2. munge: the key (Debian's postinst makes one), its run directory, the daemon.
if [ ! -s /etc/munge/munge.key ]; then
  runuser -u munge -- /usr/sbin/mungekey --create || die "mungekey --create failed"
fi
install -d -o munge -g munge -m 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  # A munged that was killed leaves its socket behind; --force takes it over.
  runuser -u munge -- /usr/sbin/munged --force 9>&- || die "munged did not start"
  wait_until "munge answers" sh -c 'munge -n | unmunge' || die "munge -n | unmunge fails"
fi

# 3. slurm.conf for this host.
HOST=$(hostname -s)
NODE_LINE=$(slurmd -C | head -n 1)
case "$NODE_LINE" in
  "NodeName=$HOST "*) ;;
  *) die "slurmd -C said '$NODE_LINE', expected NodeName=$HOST" ;;
esac
install -d "$CONF_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_DIR"
NEW_CONF=$(mktemp)
trap 'rm -f "$NEW_CONF"' EXIT
cat >"$NEW_CONF" <<EOF
$MARK
# Single node, no cgroups, no accounting: finished jobs stay visible to
# \`scontrol show job N\` for MinJobAge seconds.
ClusterName=lifeboat
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
KillWait=5
MinJobAge=600
InactiveLimit=0
Waittime=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

changed=0
if [ -e "$CONF" ] && ! cmp -s "$NEW_CONF" "$CONF"; then
  if ! head -n 1 "$CONF" | grep -qxF "$MARK" && [ "${LIFEBOAT_SLURM_FORCE:-0}" != 1 ]; then
    die "$CONF was not written by this script (a real cluster's?); set LIFEBOAT_SLURM_FORCE=1 to replace it"
  fi
  changed=1
elif [ ! -e "$CONF" ]; then
  changed=1
fi
if [ "$changed" = 1 ]; then
  install -m 0644 "$NEW_CONF" "$CONF"
  say "wrote $CONF"
  # The Slurm daemons read their config when they start; restart any that run.
  stop_pidfile "$SLURMD_PID" slurmd
  stop_pidfile "$CTLD_PID" slurmctld
fi

# 4. The daemons.
if ! scontrol ping 2>/dev/null | grep -q "is UP"; then
  stop_pidfile "$CTLD_PID" slurmctld # alive but not answering: start afresh
  say "starting slurmctld"
  slurmctld 9>&- || die "slurmctld did not start"
  wait_until "slurmctld answers" sh -c 'scontrol ping | grep -q "is UP"' ||
    die "slurmctld does not answer scontrol ping"
fi
if ! alive "$SLURMD_PID" slurmd; then
  say "starting slurmd"
  slurmd 9>&- || die "slurmd did not start"
fi

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null; }
node_usable() {
  case "$(node_state)" in
    idle | mixed | allocated | completing) return 0 ;;
    *) return 1 ;;
  esac
}
deadline=$(($(date +%s) + TIMEOUT))
until node_usable; do
  state=$(node_state)
  case "$state" in
    down | drained | draining | drain | fail | failing)
      # A node left down by a killed slurmd (ReturnToService=2 usually clears it).
      scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
      ;;
  esac
  [ "$(date +%s)" -lt "$deadline" ] ||
    die "node $HOST is '$state' after ${TIMEOUT} s: $(scontrol show node "$HOST" | grep -i reason)"
  sleep 0.2
done
say "node $HOST is $(node_state)"

# 5. A trivial job, followed to its end.
job=$(sbatch --parsable --job-name=lifeboat-probe --output=/dev/null --wrap true) ||
  die "sbatch --wrap true failed"
job=${job%%;*}
deadline=$(($(date +%s) + TIMEOUT))
while :; do
  line=$(scontrol -o show job "$job" 2>/dev/null || true)
  state=$(sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
  case "$state" in
    COMPLETED) break ;;
    FAILED | CANCELLED | TIMEOUT | NODE_FAIL | BOOT_FAIL | OUT_OF_MEMORY | PREEMPTED)
      die "probe job $job ended $state: $line"
      ;;
  esac
  [ "$(date +%s)" -lt "$deadline" ] || die "probe job $job still '$state' after ${TIMEOUT} s"
  sleep 0.2
done
say "Slurm is ready: probe job $job COMPLETED; $(elapsed) s in all"
