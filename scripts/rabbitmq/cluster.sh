#!/usr/bin/env bash
# A throwaway RabbitMQ cluster on loopback, for the fault suite (R4) and for trying
# quorum queues by hand. Built on start.sh/stop.sh: one node per port.
#
#   bash cluster.sh start     # prints one AMQP URL per node (stdout), messages on stderr
#   bash cluster.sh stop
#   bash cluster.sh kill N    # SIGKILL node N (1-based): a crash, not a shutdown
#   bash cluster.sh rebalance # spread quorum queue leaders over the nodes
#   bash cluster.sh leaders   # "<queue> <leader node>" per quorum queue
#   bash cluster.sh queues    # every queue: leader, ready, unacked, consumers
#
# Knobs: RMQ_CLUSTER_PORT=5680 (node k listens on PORT+k-1), RMQ_CLUSTER_SIZE=3,
# RMQ_COOKIE (one is made up; every node must share it to cluster), RMQ_SERIES (start.sh's:
# every node runs the same series; on 4.3 the cluster's metadata store is Khepri).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE_PORT="${RMQ_CLUSTER_PORT:-5680}"
SIZE="${RMQ_CLUSTER_SIZE:-3}"
export RMQ_COOKIE="${RMQ_COOKIE:-faststream-retry-cluster-cookie}"
log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

port_of() { echo $((BASE_PORT + $1 - 1)); }
node_of() { echo "rabbit-test-$(port_of "$1")@localhost"; }
base_of() { echo "${TMPDIR:-/tmp}/rabbitmq-test-$(port_of "$1")"; }
ctl_of() { "$(base_of "$1")/ctl" -q "${@:2}"; }

start() {
  local k pids=() urls=()
  # Boot in parallel (about 10 s each, mostly CPU-light boot-step discovery).
  for k in $(seq 1 "$SIZE"); do
    RMQ_PORT="$(port_of "$k")" bash "$HERE/start.sh" > "$(base_of "$k").url" 2> "$(base_of "$k").start.log" &
    pids+=($!)
  done
  for k in $(seq 1 "$SIZE"); do
    wait "${pids[$((k - 1))]}" || { cat "$(base_of "$k").start.log" >&2; die "node $k did not start"; }
    urls+=("$(tail -n 1 "$(base_of "$k").url")")
    if grep -q "docker container" "$(base_of "$k").start.log"; then
      stop; die "a cluster needs the rabbitmq-server package: Docker containers cannot join on loopback"
    fi
  done
  local first; first="$(node_of 1)"
  for k in $(seq 2 "$SIZE"); do
    if ctl_of "$k" cluster_status 2>/dev/null | grep -qF "$first"; then
      continue  # already joined (a reused node)
    fi
    log "joining $(node_of "$k") to $first"
    ctl_of "$k" stop_app >&2
    ctl_of "$k" join_cluster "$first" >&2 || die "join_cluster failed for node $k"
    ctl_of "$k" start_app >&2
  done
  ctl_of 1 await_online_nodes "$SIZE" >&2 || die "the cluster did not reach $SIZE nodes"
  log "cluster of $SIZE nodes up: ${urls[*]}"
  printf '%s\n' "${urls[@]}"
}

stop() {
  local k
  for k in $(seq 1 "$SIZE"); do
    RMQ_PORT="$(port_of "$k")" bash "$HERE/stop.sh" || true
  done
}

rebalance() {
  "$(base_of 1)/queues" -q rebalance quorum --formatter json >&2
}

kill_node() {
  local pid_file; pid_file="$(base_of "$1")/rabbitmq.pid"
  [[ -s "$pid_file" ]] || die "node $1 has no pid file"
  kill -KILL "$(cat "$pid_file")"
  log "killed $(node_of "$1") (pid $(cat "$pid_file"))"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  kill) kill_node "${2:?which node}" ;;
  rebalance) rebalance ;;
  leaders) ctl_of 1 list_queues --no-table-headers name leader | awk 'NF == 2' ;;  # classic queues have no leader
  queues) ctl_of 1 list_queues name leader messages_ready messages_unacknowledged consumers ;;
  *) die "usage: cluster.sh start | stop | kill N | rebalance | leaders | queues" ;;
esac
