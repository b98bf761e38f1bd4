#!/usr/bin/env bash
# Start a throwaway redis-server (or valkey-server) for tests, benchmarks and the demo -- no
# systemd, no root needed once the Debian package is installed (root is only needed to
# install it, or to build the chroot of a series the host does not ship).
#
#   export REDIS_URL="$(bash scripts/redis/start.sh)"    # URL is the ONLY stdout line
#   ... run tests ...
#   bash scripts/redis/stop.sh
#
# Knobs (all optional):
#   REDIS_PORT=6401      the server's port; its state dir derives from it, so two checkouts on
#                        different REDIS_PORTs never clash. The project's scripts own
#                        6401-6420 (CONTRIBUTING.md); Redis' own default, 6379, is left alone.
#   REDIS_BASE=${TMPDIR:-/tmp}/redis-test-$REDIS_PORT   state dir: config, pid, log, data/
#   REDIS_SERIES=        7.0, 8.0 or valkey-9.1: that series, from the host's package when it
#                        is that series, else a Debian chroot (scripts/redis/series.sh);
#                        unset = the host's redis-server package
#   REDIS_APPENDFSYNC=always   the AOF's fsync policy: always (the suites: an acknowledged
#                        write survives a crash), everysec (Redis' default with AOF on: a
#                        crash can lose about a second) or no
#   REDIS_FRESH=1        wipe the data before a *new* start (never on reuse); 0 keeps it: a
#                        restart that must find its streams and schedules again
#   REDIS_TIMEOUT=60     seconds to wait for readiness
#   REDIS_AUTO_INSTALL=1 apt-get install the server if missing (root only)
#   REDIS_MAXMEMORY=0    maxmemory (0: none); the policy stays noeviction, so a full server
#                        refuses writes rather than dropping keys
#   For a cluster node (scripts/redis/cluster.sh sets them):
#   REDIS_CLUSTER=0      1: cluster-enabled, its nodes.conf in the state dir
#   REDIS_CLUSTER_BUS_PORT=$((REDIS_PORT+10000))   this node's cluster bus
#
# Always: bind 127.0.0.1, AOF on (appendonly yes), no RDB snapshots (save ""), no
# daemonizing (setsid here), the command line kept (set-proc-title no: stop.sh recognises
# its server by it). Ready means the server answers PING with PONG, its AOF loaded.
# Idempotent: if the server is already up it is reused (exit 0, same URL). Concurrent
# calls with the same REDIS_PORT are serialised by flock.
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

REDIS_PORT="${REDIS_PORT:-6401}"
REDIS_BASE="${REDIS_BASE:-${TMPDIR:-/tmp}/redis-test-${REDIS_PORT}}"
REDIS_APPENDFSYNC="${REDIS_APPENDFSYNC:-always}"
REDIS_FRESH="${REDIS_FRESH:-1}"
REDIS_TIMEOUT="${REDIS_TIMEOUT:-60}"
REDIS_MAXMEMORY="${REDIS_MAXMEMORY:-0}"
REDIS_CLUSTER="${REDIS_CLUSTER:-0}"
REDIS_CLUSTER_BUS_PORT="${REDIS_CLUSTER_BUS_PORT:-$((REDIS_PORT + 10000))}"
NAME="redis-test-$REDIS_PORT"
URL="redis://127.0.0.1:$REDIS_PORT"
CONF="$REDIS_BASE/redis.conf"
PID_FILE="$REDIS_BASE/redis.pid"
LOG_FILE="$REDIS_BASE/redis.log"

log() { printf '[start-redis] %s\n' "$*" >&2; }
die() { printf '[start-redis] ERROR: %s\n' "$*" >&2; exit 1; }
t_start=$(date +%s.%N)
elapsed() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/series.sh"
source "$HERE/lib.sh"

case "$REDIS_APPENDFSYNC" in
  always | everysec | no) ;;
  *) die "REDIS_APPENDFSYNC=$REDIS_APPENDFSYNC: always, everysec or no" ;;
esac

choose_redis
mkdir -p "$REDIS_BASE"

fail() {
  log "ERROR: $*"
  [[ -s "$LOG_FILE" ]] && { log "---- last 30 lines of $LOG_FILE ----"; tail -n 30 "$LOG_FILE" >&2; }
  if [[ -n "${launched:-}" ]] && alive "$launched"; then
    log "terminating the half-started server (pid $launched)"
    kill -TERM "$launched" 2>/dev/null || true
  fi
  exit 1
}

# Serialise concurrent starts of the same server (parallel CI jobs / shells).
exec 9>"$REDIS_BASE.lock"
flock -w "$REDIS_TIMEOUT" 9 || die "timed out waiting for lock $REDIS_BASE.lock"

if [[ -s "$PID_FILE" ]] && ours "$(cat "$PID_FILE")" && redis_ready "$REDIS_PORT"; then
  running="$(cat "$REDIS_BASE/version" 2>/dev/null || echo unknown)"
  [[ -z "$REDIS_SERIES" || "$running" == "$REDIS_SERIES "* ]] \
    || die "the server on port $REDIS_PORT runs $running, not $REDIS_SERIES: stop it (scripts/redis/stop.sh) or choose another REDIS_PORT"
  log "reusing running server $NAME on 127.0.0.1:$REDIS_PORT ($running, pid $(cat "$PID_FILE"))"
  echo "$URL"; exit 0
fi

# Pre-flight: a foreign listener on our ports would fool the readiness check.
ports=("$REDIS_PORT")
[[ "$REDIS_CLUSTER" != 1 ]] || ports+=("$REDIS_CLUSTER_BUS_PORT")
for p in "${ports[@]}"; do
  # A server killed a moment ago may still hold its port while it exits: give it 10 s.
  for _ in $(seq 1 50); do port_open "$p" || break; sleep 0.2; done
  if port_open "$p"; then
    who="$(ss -ltnpH "sport = :$p" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -1)"
    die "port $p is already in use${who:+ by $who} (not our server $NAME). Choose another REDIS_PORT, or stop that server."
  fi
done
# A stale server of this port (half-dead, not answering) -> stop it.
if [[ -s "$PID_FILE" ]] && ours "$(cat "$PID_FILE")"; then
  old="$(cat "$PID_FILE")"
  log "found stale server process $old for $NAME; terminating it"
  kill -TERM "$old" 2>/dev/null || true
  for _ in $(seq 1 50); do alive "$old" || break; sleep 0.2; done
  kill -KILL "$old" 2>/dev/null || true
fi

# A chroot's server sees its state dir at the same path (bound here, not before: a start that
# stops at a check above leaves no mount behind).
bind_base "$REDIS_BASE"
[[ "$REDIS_FRESH" == 1 ]] && rm -rf "$REDIS_BASE/data"
rm -f "$PID_FILE"
mkdir -p "$REDIS_BASE/data"
cat >"$CONF" <<EOF
# generated by scripts/redis/start.sh -- throwaway test server
port $REDIS_PORT
bind 127.0.0.1
daemonize no
set-proc-title no
dir $REDIS_BASE/data
pidfile $PID_FILE
logfile $LOG_FILE
# Durability as the suites assume it: every write in the append-only file, fsynced per
# REDIS_APPENDFSYNC; no RDB snapshots besides (a restart loads the AOF).
appendonly yes
appendfsync $REDIS_APPENDFSYNC
save ""
maxmemory $REDIS_MAXMEMORY
maxmemory-policy noeviction
EOF
if [[ "$REDIS_CLUSTER" == 1 ]]; then
  cat >>"$CONF" <<EOF
cluster-enabled yes
cluster-config-file $REDIS_BASE/data/nodes.conf
cluster-port $REDIS_CLUSTER_BUS_PORT
cluster-node-timeout 5000
EOF
fi
printf '%s %s\n' "${REDIS_SERIES:-$(redis_series_of "$REDIS_FLAVOUR" "$REDIS_VERSION")}" \
  "($REDIS_FLAVOUR-server $REDIS_VERSION)" >"$REDIS_BASE/version"
printf 'ROOTFS=%q\nREDIS_CLI=%q\n' "$ROOTFS" "$REDIS_CLI" >"$REDIS_BASE/series.env"
# The series' own client, for humans and tests: $REDIS_BASE/cli INFO persistence
in_root=""; [[ ${#IN_ROOT[@]} == 0 ]] || in_root="$(printf '%q ' "${IN_ROOT[@]}")"
cat >"$REDIS_BASE/cli" <<EOF
#!/bin/sh
exec $in_root"$REDIS_CLI" -h 127.0.0.1 -p "$REDIS_PORT" "\$@"
EOF
chmod +x "$REDIS_BASE/cli"

bus=""; [[ "$REDIS_CLUSTER" != 1 ]] || bus=" (cluster bus $REDIS_CLUSTER_BUS_PORT)"
log "starting $NAME ($REDIS_FLAVOUR-server $REDIS_VERSION${ROOTFS:+ in $ROOTFS}) on 127.0.0.1:$REDIS_PORT$bus (appendfsync $REDIS_APPENDFSYNC, data $REDIS_BASE/data)"
# setsid + full fd redirection so the server survives the caller and never holds its stdout
# pipe (e.g. URL=$(start.sh)) or the flock fd open. chroot execs the server: the pid is its own.
(cd "$REDIS_BASE" && exec setsid nohup "${IN_ROOT[@]}" "$REDIS_BIN" "$CONF" </dev/null >>"$LOG_FILE.stdout" 2>&1 7>&- 8>&- 9>&-) &
launched=$!

deadline=$(($(date +%s) + REDIS_TIMEOUT))
until redis_ready "$REDIS_PORT"; do
  alive "$launched" || fail "$REDIS_FLAVOUR-server exited during boot after $(elapsed) s"
  (($(date +%s) < deadline)) || fail "$REDIS_FLAVOUR-server on $REDIS_PORT not ready after ${REDIS_TIMEOUT} s"
  sleep 0.05
done
[[ -s "$PID_FILE" ]] || echo "$launched" >"$PID_FILE"
log "ready in $(elapsed) s: $URL ($REDIS_FLAVOUR-server $REDIS_VERSION, pid $(cat "$PID_FILE"); cli: $REDIS_BASE/cli; log: $LOG_FILE)"
echo "$URL"
