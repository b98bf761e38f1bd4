#!/usr/bin/env bash
# A throwaway 3-node JetStream cluster on loopback, for R3 streams and a node killed (the
# fault suite). Built on start.sh/stop.sh: one node per port.
#
#   bash cluster.sh start     # prints one nats:// URL per node (stdout), messages on stderr
#   bash cluster.sh stop
#   bash cluster.sh kill N    # SIGKILL node N (1-based): a crash, not a shutdown
#   bash cluster.sh restart N # start node N again on its store (after kill or stop N)
#   bash cluster.sh stop N    # SIGTERM node N, its store kept
#   bash cluster.sh urls      # one URL per node, for a client's server list
#
# Knobs: NATS_CLUSTER_PORT=4305 (node k's clients on PORT+k-1),
# NATS_CLUSTER_ROUTE_PORT=$((NATS_CLUSTER_PORT+100)) (node k's routes on ROUTE_PORT+k-1),
# NATS_CLUSTER_SIZE=3, NATS_SERIES (start.sh's: every node runs the same series).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE_PORT="${NATS_CLUSTER_PORT:-4305}"
ROUTE_BASE="${NATS_CLUSTER_ROUTE_PORT:-$((BASE_PORT + 100))}"
SIZE="${NATS_CLUSTER_SIZE:-3}"
NATS_TIMEOUT="${NATS_TIMEOUT:-60}"
log() { printf '[nats-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
NATS_BASE=""  # lib.sh's ours() reads it: set per node below
source "$HERE/lib.sh"

port_of() { echo $((BASE_PORT + $1 - 1)); }
base_of() { echo "${TMPDIR:-/tmp}/nats-test-$(port_of "$1")"; }
routes() {
  local k out=()
  for k in $(seq 1 "$SIZE"); do out+=("nats-route://127.0.0.1:$((ROUTE_BASE + k - 1))"); done
  local IFS=,; echo "${out[*]}"
}

# start_node K FRESH: start.sh for node K, as a member of the cluster.
start_node() {
  NATS_PORT="$(port_of "$1")" NATS_FRESH="$2" NATS_CLUSTER_NAME="faststream-retry-$BASE_PORT" \
    NATS_ROUTE_PORT="$((ROUTE_BASE + $1 - 1))" NATS_ROUTES="$(routes)" bash "$HERE/start.sh"
}

await_js() {
  local k deadline=$(($(date +%s) + NATS_TIMEOUT))
  for k in "$@"; do
    until js_ready "$(port_of "$k")"; do
      (($(date +%s) < deadline)) || die "JetStream on node $k ($(port_of "$k")) not ready after ${NATS_TIMEOUT} s: see $(base_of "$k")/nats.log"
      sleep 0.2
    done
  done
}

start() {
  local k pids=()
  # Parallel: the first node to boot builds or fills the chroot, the others wait on its lock.
  for k in $(seq 1 "$SIZE"); do
    start_node "$k" 1 >"$(base_of "$k").url" 2>"$(base_of "$k").start.log" &
    pids+=($!)
  done
  for k in $(seq 1 "$SIZE"); do
    wait "${pids[$((k - 1))]}" || { cat "$(base_of "$k").start.log" >&2; die "node $k did not start"; }
  done
  await_js $(seq 1 "$SIZE")
  log "cluster of $SIZE nodes up, JetStream ready: $(urls | paste -sd' ')"
  urls
}

urls() {
  local k
  for k in $(seq 1 "$SIZE"); do echo "nats://127.0.0.1:$(port_of "$k")"; done
}

stop() {
  local k
  for k in $(seq 1 "$SIZE"); do NATS_PORT="$(port_of "$k")" bash "$HERE/stop.sh" || true; done
}

stop_node() { NATS_PORT="$(port_of "$1")" NATS_KEEP_DATA=1 bash "$HERE/stop.sh"; }

kill_node() {
  local pid_file pid; pid_file="$(base_of "$1")/nats.pid"
  [[ -s "$pid_file" ]] || die "node $1 has no pid file"
  pid="$(cat "$pid_file")"
  NATS_BASE="$(base_of "$1")"
  ours "$pid" || die "node $1's pid $pid is not its nats-server"
  kill -KILL "$pid"
  for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  log "killed node $1 on $(port_of "$1") (pid $pid)"
}

restart_node() {
  start_node "$1" 0 >/dev/null
  await_js "$1"
  log "node $1 back on $(port_of "$1"), JetStream ready"
}

case "${1:-}" in
  start) start ;;
  stop) if [[ -n "${2:-}" ]]; then stop_node "$2"; else stop; fi ;;
  kill) kill_node "${2:?which node}" ;;
  restart) restart_node "${2:?which node}" ;;
  urls) urls ;;
  *) die "usage: cluster.sh start | stop [N] | kill N | restart N | urls" ;;
esac
