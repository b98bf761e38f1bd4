#!/usr/bin/env bash
# Stop the throwaway broker started by start-rabbitmq.sh (same RMQ_PORT /
# RMQ_NODENAME / RMQ_BASE knobs). Idempotent: "not running" is success.
#   RMQ_KEEP_DATA=1   keep mnesia data (default: delete it, keep logs)
#   RMQ_KILL_EPMD=1   also stop epmd if *we* started it and no other node uses it (default 1)
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
export LC_ALL="${LC_ALL:-C.UTF-8}" LANG="${LANG:-C.UTF-8}"

RMQ_PORT="${RMQ_PORT:-5673}"
RMQ_NODENAME="${RMQ_NODENAME:-rabbit-test-${RMQ_PORT}@localhost}"
RMQ_BASE="${RMQ_BASE:-${TMPDIR:-/tmp}/rabbitmq-test-${RMQ_PORT}}"
RMQ_KEEP_DATA="${RMQ_KEEP_DATA:-0}"
RMQ_KILL_EPMD="${RMQ_KILL_EPMD:-1}"
log() { printf '[stop-rabbitmq] %s\n' "$*" >&2; }

name="faststream-retry-rabbitmq-$RMQ_PORT"
if command -v docker >/dev/null 2>&1 && docker ps -a --format '{{.Names}}' 2>/dev/null | grep -qx "$name"; then
  docker rm -f "$name" >/dev/null && log "removed docker container $name"
fi

if [[ ! -d "$RMQ_BASE" ]]; then log "nothing to stop ($RMQ_BASE does not exist)"; exit 0; fi

PID_FILE="$RMQ_BASE/rabbitmq.pid"
# Where start.sh ran the node from (a chroot's series), and its epmd.
ROOTFS="" EPMD_PORT=4369
[[ -s "$RMQ_BASE/series.env" ]] && source "$RMQ_BASE/series.env"
# alive = exists and is not a zombie (PID 1 in some containers reaps late)
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ -n "$st" && "$st" != Z* ]]; }
# ours = a beam.smp whose command line carries our private HOME (guards against PID reuse)
ours() { alive "$1" && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -qF -- "-home $RMQ_BASE/home"; }
pid=""; [[ -s "$PID_FILE" ]] && pid="$(cat "$PID_FILE")"

exec 9>"$RMQ_BASE.lock"; flock -w 120 9 || true   # don't race a concurrent start

if [[ -n "$pid" ]] && ours "$pid"; then
  log "stopping $RMQ_NODENAME (pid $pid) ..."
  # RabbitMQ >= 3.8 shuts down gracefully on SIGTERM ("SIGTERM received - shutting
  # down" in its log): ~1 s here vs ~3.5 s for `rabbitmqctl stop <pidfile>`,
  # whose Elixir CLI alone costs ~0.6 s of CPU.
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "still alive after 30 s; SIGKILL $pid"; kill -KILL "$pid" 2>/dev/null || true
  fi
  log "stopped"
else
  log "$RMQ_NODENAME is not running"
fi
# The `sh` launcher (rabbitmq-server script) exits when beam does; reap if stuck.
if [[ -s "$RMQ_BASE/launcher.pid" ]]; then
  lp="$(cat "$RMQ_BASE/launcher.pid")"
  for _ in $(seq 1 20); do alive "$lp" || break; sleep 0.1; done
  if alive "$lp" && [[ "$(ps -o args= -p "$lp")" == *rabbitmq-server* ]]; then kill -TERM "$lp" 2>/dev/null || true; fi
  rm -f "$RMQ_BASE/launcher.pid"
fi
rm -f "$PID_FILE"
# A chroot's node: its state dir is bind-mounted in the chroot; undo that, so removing a
# chroot never reaches the host's files (its /proc stays, for the series' other nodes).
if [[ -n "$ROOTFS" ]] && mountpoint -q "$ROOTFS$RMQ_BASE" 2>/dev/null; then
  umount "$ROOTFS$RMQ_BASE" || log "could not unmount $ROOTFS$RMQ_BASE"
fi

# epmd: shared by every Erlang node on the host. Stop it only if one of our
# start-rabbitmq.sh runs spawned it (PID recorded) and no node is registered any
# more (a parallel checkout's broker may still use it).
EPMD_PIDFILE="${TMPDIR:-/tmp}/rabbitmq-test-epmd-$EPMD_PORT.pid"
if [[ "$RMQ_KILL_EPMD" == 1 && -s "$EPMD_PIDFILE" ]]; then
  epid="$(cat "$EPMD_PIDFILE")"
  if alive "$epid" && [[ "$(cat "/proc/$epid/comm" 2>/dev/null)" == epmd ]]; then
    names="$(ERL_EPMD_PORT="$EPMD_PORT" ${ROOTFS:+chroot "$ROOTFS"} epmd -names 2>/dev/null || true)"
    if grep -q '^name ' <<<"$names"; then
      log "leaving epmd (pid $epid) running: still used by $(grep '^name ' <<<"$names" | awk '{print $2}' | xargs)"
    else
      kill -TERM "$epid" 2>/dev/null && log "stopped epmd (pid $epid, started by start-rabbitmq.sh, no nodes left)"
      rm -f "$EPMD_PIDFILE"
    fi
  else
    rm -f "$EPMD_PIDFILE"
  fi
fi

[[ "$RMQ_KEEP_DATA" == 1 ]] || rm -rf "$RMQ_BASE/mnesia"
log "done (logs kept in $RMQ_BASE/log)"
