#!/usr/bin/env bash
# Start a throwaway nats-server with JetStream (file storage) for tests, benchmarks and the
# demo -- no systemd, no root needed once the Debian package is installed (root is only
# needed to install it, or to build the chroot of a series the host does not ship).
#
#   export NATS_URL="$(bash scripts/nats/start.sh)"    # URL is the ONLY stdout line
#   ... run tests ...
#   bash scripts/nats/stop.sh
#
# Knobs (all optional):
#   NATS_PORT=4301       client port; the server's name and state dir derive from it, so
#                        two checkouts on different NATS_PORTs never clash. The project's
#                        scripts own 4301-4310 (clients) and 4401-4410 (cluster routes).
#   NATS_BASE=${TMPDIR:-/tmp}/nats-test-$NATS_PORT   state dir: config, pid, log, JetStream store
#   NATS_SERIES=         2.9 or 2.15: that nats-server series, from the host's package when it
#                        is that series, else a Debian chroot (scripts/nats/series.sh);
#                        unset = the host's package
#   NATS_FRESH=1         wipe the JetStream store before a *new* start (never on reuse);
#                        0 keeps it: a restart that must find its streams again
#   NATS_TIMEOUT=60      seconds to wait for readiness
#   NATS_AUTO_INSTALL=1  apt-get install nats-server if missing (root only)
#   NATS_MAX_FILE=2GB NATS_MAX_MEM=256MB   JetStream's storage limits
#   For a cluster node (scripts/nats/cluster.sh sets them):
#   NATS_CLUSTER_NAME=   the cluster's name
#   NATS_ROUTE_PORT=$((NATS_PORT+100))   this node's route listener
#   NATS_ROUTES=         comma-separated route URLs of every node (nats-route://127.0.0.1:P)
#
# Ready means JetStream answers ($JS.API.INFO, asked over the client protocol); a cluster
# node is ready when its port is open (JetStream needs a quorum: cluster.sh waits for it).
# Idempotent: if the node is already up it is reused (exit 0, same URL). Concurrent calls
# with the same NATS_PORT are serialised by flock.
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

NATS_PORT="${NATS_PORT:-4301}"
NATS_BASE="${NATS_BASE:-${TMPDIR:-/tmp}/nats-test-${NATS_PORT}}"
NATS_FRESH="${NATS_FRESH:-1}"
NATS_TIMEOUT="${NATS_TIMEOUT:-60}"
NATS_MAX_FILE="${NATS_MAX_FILE:-2GB}"
NATS_MAX_MEM="${NATS_MAX_MEM:-256MB}"
NATS_CLUSTER_NAME="${NATS_CLUSTER_NAME:-}"
NATS_ROUTE_PORT="${NATS_ROUTE_PORT:-$((NATS_PORT + 100))}"
NATS_ROUTES="${NATS_ROUTES:-}"
NAME="nats-test-$NATS_PORT"
URL="nats://127.0.0.1:$NATS_PORT"
CONF="$NATS_BASE/nats.conf"
PID_FILE="$NATS_BASE/nats.pid"
LOG_FILE="$NATS_BASE/nats.log"

log() { printf '[start-nats] %s\n' "$*" >&2; }
die() { printf '[start-nats] ERROR: %s\n' "$*" >&2; exit 1; }
t_start=$(date +%s.%N)
elapsed() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/series.sh"
source "$HERE/lib.sh"

choose_nats
mkdir -p "$NATS_BASE"
bind_base "$NATS_BASE"

fail() {
  log "ERROR: $*"
  [[ -s "$LOG_FILE" ]] && { log "---- last 30 lines of $LOG_FILE ----"; tail -n 30 "$LOG_FILE" >&2; }
  if [[ -n "${launched:-}" ]] && alive "$launched"; then
    log "terminating the half-started server (pid $launched)"
    kill -TERM "$launched" 2>/dev/null || true
  fi
  exit 1
}

# Serialise concurrent starts of the same node (parallel CI jobs / shells).
exec 9>"$NATS_BASE.lock"
flock -w "$NATS_TIMEOUT" 9 || die "timed out waiting for lock $NATS_BASE.lock"

if [[ -s "$PID_FILE" ]] && ours "$(cat "$PID_FILE")" && port_open "$NATS_PORT"; then
  running="$(cat "$NATS_BASE/version" 2>/dev/null || echo unknown)"
  [[ -z "$NATS_SERIES" || "$(series_of "$running")" == "$NATS_SERIES" ]] \
    || die "the node on port $NATS_PORT runs nats-server $running, not $NATS_SERIES: stop it (scripts/nats/stop.sh) or choose another NATS_PORT"
  log "reusing running node $NAME on 127.0.0.1:$NATS_PORT (nats-server $running, pid $(cat "$PID_FILE"))"
  echo "$URL"; exit 0
fi

# Pre-flight: a foreign listener on our ports would fool the readiness check.
ports=("$NATS_PORT")
[[ -z "$NATS_CLUSTER_NAME" ]] || ports+=("$NATS_ROUTE_PORT")
for p in "${ports[@]}"; do
  # A node killed a moment ago may still hold its port while it exits: give it 10 s.
  for _ in $(seq 1 50); do port_open "$p" || break; sleep 0.2; done
  if port_open "$p"; then
    who="$(ss -ltnpH "sport = :$p" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -1)"
    die "port $p is already in use${who:+ by $who} (not our node $NAME). Choose another NATS_PORT, or stop that server."
  fi
done
# A stale server of this node (half-dead, its port closed) -> stop it.
if [[ -s "$PID_FILE" ]] && ours "$(cat "$PID_FILE")"; then
  old="$(cat "$PID_FILE")"
  log "found stale server process $old for $NAME; terminating it"
  kill -TERM "$old" 2>/dev/null || true
  for _ in $(seq 1 50); do alive "$old" || break; sleep 0.2; done
  kill -KILL "$old" 2>/dev/null || true
fi

[[ "$NATS_FRESH" == 1 ]] && rm -rf "$NATS_BASE/data"
rm -f "$PID_FILE"
mkdir -p "$NATS_BASE/data"
cat >"$CONF" <<EOF
# generated by scripts/nats/start.sh -- throwaway test server
server_name: "$NAME"
listen: "127.0.0.1:$NATS_PORT"
pid_file: "$PID_FILE"
jetstream {
  store_dir: "$NATS_BASE/data"
  max_file_store: $NATS_MAX_FILE
  max_memory_store: $NATS_MAX_MEM
}
EOF
if [[ -n "$NATS_CLUSTER_NAME" ]]; then
  routes=""
  IFS=, read -r -a route_list <<<"$NATS_ROUTES"
  for r in "${route_list[@]}"; do routes+="    \"$r\""$'\n'; done
  cat >>"$CONF" <<EOF
cluster {
  name: "$NATS_CLUSTER_NAME"
  listen: "127.0.0.1:$NATS_ROUTE_PORT"
  routes: [
$routes  ]
}
EOF
fi
printf '%s\n' "$NATS_VERSION" >"$NATS_BASE/version"
printf 'ROOTFS=%q\n' "$ROOTFS" >"$NATS_BASE/series.env"

log "starting $NAME (nats-server $NATS_VERSION${ROOTFS:+ in $ROOTFS}) on 127.0.0.1:$NATS_PORT${NATS_CLUSTER_NAME:+ (cluster $NATS_CLUSTER_NAME, routes on $NATS_ROUTE_PORT)} (data $NATS_BASE/data)"
# setsid + full fd redirection so the server survives the caller and never holds its stdout
# pipe (e.g. URL=$(start.sh)) or the flock fd open. chroot and nohup exec: the pid is the
# server's own.
(cd "$NATS_BASE" && exec setsid nohup "${IN_ROOT[@]}" "$NATS_BIN" -c "$CONF" </dev/null >"$LOG_FILE" 2>&1 8>&- 9>&-) &
launched=$!

deadline=$(($(date +%s) + NATS_TIMEOUT))
until port_open "$NATS_PORT"; do
  alive "$launched" || fail "nats-server exited during boot after $(elapsed) s"
  (($(date +%s) < deadline)) || fail "nats-server not listening on $NATS_PORT after ${NATS_TIMEOUT} s"
  sleep 0.05
done
if [[ -z "$NATS_CLUSTER_NAME" ]]; then
  until js_ready "$NATS_PORT"; do
    alive "$launched" || fail "nats-server exited during boot after $(elapsed) s"
    (($(date +%s) < deadline)) || fail "JetStream on $NATS_PORT not ready after ${NATS_TIMEOUT} s"
    sleep 0.1
  done
fi
[[ -s "$PID_FILE" ]] || echo "$launched" >"$PID_FILE"
log "ready in $(elapsed) s: $URL (nats-server $NATS_VERSION, pid $(cat "$PID_FILE"); log: $LOG_FILE)"
echo "$URL"
