#!/usr/bin/env bash
# A throwaway Redis Cluster of 3 masters (no replicas) on loopback, for the hash-slot test:
# a script whose keys are not in one slot fails there (CROSSSLOT), as on a user's cluster.
# Built on start.sh/stop.sh: one server per port, each with its AOF.
#
#   bash cluster.sh start     # prints one redis:// URL per node (stdout), messages on stderr
#   bash cluster.sh stop
#   bash cluster.sh kill N    # SIGKILL node N (1-based): a crash, not a shutdown
#   bash cluster.sh restart N # start node N again on its data (after kill or stop N)
#   bash cluster.sh stop N    # SIGTERM node N, its data kept
#   bash cluster.sh urls      # one URL per node, for a client's startup nodes
#
# Knobs: REDIS_CLUSTER_PORT=6407 (node k on PORT+k-1), REDIS_CLUSTER_BUS=$((PORT+10000))
# (node k's cluster bus on BUS+k-1), REDIS_CLUSTER_SIZE=3 (3 at least: a cluster needs three
# masters), REDIS_SERIES and REDIS_APPENDFSYNC (start.sh's: every node runs the same).
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE_PORT="${REDIS_CLUSTER_PORT:-6407}"
BUS_BASE="${REDIS_CLUSTER_BUS:-$((BASE_PORT + 10000))}"
SIZE="${REDIS_CLUSTER_SIZE:-3}"
REDIS_TIMEOUT="${REDIS_TIMEOUT:-60}"
log() { printf '[redis-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
REDIS_BASE=""  # lib.sh's ours() reads it: set per node below
source "$HERE/lib.sh"

port_of() { echo $((BASE_PORT + $1 - 1)); }
base_of() { echo "${TMPDIR:-/tmp}/redis-test-$(port_of "$1")"; }
cli_of() { "$(base_of "$1")/cli" "${@:2}"; }

# start_node K FRESH: start.sh for node K, cluster-enabled.
start_node() {
  REDIS_PORT="$(port_of "$1")" REDIS_FRESH="$2" REDIS_CLUSTER=1 \
    REDIS_CLUSTER_BUS_PORT="$((BUS_BASE + $1 - 1))" bash "$HERE/start.sh"
}

# cluster_ok K: node K says the cluster is ok (every slot served) and knows SIZE masters.
cluster_ok() {
  local info
  info="$(cli_of "$1" CLUSTER INFO 2>/dev/null | tr -d '\r')" || return 1
  grep -qx 'cluster_state:ok' <<<"$info" && grep -qx "cluster_known_nodes:$SIZE" <<<"$info"
}

await_ok() {
  local k deadline=$(($(date +%s) + REDIS_TIMEOUT))
  for k in "$@"; do
    until cluster_ok "$k"; do
      (($(date +%s) < deadline)) || die "node $k ($(port_of "$k")) does not see a healthy cluster after ${REDIS_TIMEOUT} s: $(base_of "$k")/cli CLUSTER INFO"
      sleep 0.2
    done
  done
}

start() {
  ((SIZE >= 3)) || die "REDIS_CLUSTER_SIZE=$SIZE: a Redis Cluster needs 3 masters at least"
  local k pids=() nodes=()
  # Parallel: the first node to start installs the series or fills the chroot, the others
  # wait on its lock.
  for k in $(seq 1 "$SIZE"); do
    start_node "$k" 1 >"$(base_of "$k").url" 2>"$(base_of "$k").start.log" &
    pids+=($!)
  done
  for k in $(seq 1 "$SIZE"); do
    wait "${pids[$((k - 1))]}" || { cat "$(base_of "$k").start.log" >&2; die "node $k did not start"; }
    nodes+=("127.0.0.1:$(port_of "$k")")
  done
  if cluster_ok 1; then
    log "reusing the cluster already formed on ${nodes[*]}"
  else
    log "creating a cluster of $SIZE masters: ${nodes[*]}"
    cli_of 1 --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2 \
      || die "redis-cli --cluster create failed"
  fi
  await_ok $(seq 1 "$SIZE")
  log "cluster of $SIZE masters up, every slot served: $(urls | paste -sd' ')"
  urls
}

urls() {
  local k
  for k in $(seq 1 "$SIZE"); do echo "redis://127.0.0.1:$(port_of "$k")"; done
}

stop() {
  local k
  for k in $(seq 1 "$SIZE"); do REDIS_PORT="$(port_of "$k")" bash "$HERE/stop.sh" || true; done
}

stop_node() { REDIS_PORT="$(port_of "$1")" REDIS_KEEP_DATA=1 bash "$HERE/stop.sh"; }

kill_node() {
  local pid_file pid; pid_file="$(base_of "$1")/redis.pid"
  [[ -s "$pid_file" ]] || die "node $1 has no pid file"
  pid="$(cat "$pid_file")"
  REDIS_BASE="$(base_of "$1")"
  ours "$pid" || die "node $1's pid $pid is not its server"
  kill -KILL "$pid"
  for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  log "killed node $1 on $(port_of "$1") (pid $pid)"
}

restart_node() {
  start_node "$1" 0 >/dev/null
  await_ok "$1"
  log "node $1 back on $(port_of "$1"), the cluster ok"
}

case "${1:-}" in
  start) start ;;
  stop) if [[ -n "${2:-}" ]]; then stop_node "$2"; else stop; fi ;;
  kill) kill_node "${2:?which node}" ;;
  restart) restart_node "${2:?which node}" ;;
  urls) urls ;;
  *) die "usage: cluster.sh start | stop [N] | kill N | restart N | urls" ;;
esac
