#!/usr/bin/env bash
# Stop the throwaway redis-server start.sh started on REDIS_PORT (same REDIS_PORT /
# REDIS_BASE knobs), and only that one. Idempotent: "not running" is success.
#   REDIS_KEEP_DATA=1   keep the data (the AOF; default: delete it, keep the log)
#   REDIS_SIGNAL=TERM   KILL: a crash rather than a shutdown (a fault test's restart);
#                       SIGTERM makes the server fsync its AOF and exit
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

REDIS_PORT="${REDIS_PORT:-6401}"
REDIS_BASE="${REDIS_BASE:-${TMPDIR:-/tmp}/redis-test-${REDIS_PORT}}"
REDIS_KEEP_DATA="${REDIS_KEEP_DATA:-0}"
REDIS_SIGNAL="${REDIS_SIGNAL:-TERM}"
log() { printf '[stop-redis] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ! -d "$REDIS_BASE" ]]; then log "nothing to stop ($REDIS_BASE does not exist)"; exit 0; fi
ROOTFS=""
[[ -s "$REDIS_BASE/series.env" ]] && source "$REDIS_BASE/series.env"
PID_FILE="$REDIS_BASE/redis.pid"
pid=""; [[ -s "$PID_FILE" ]] && pid="$(cat "$PID_FILE")"

exec 9>"$REDIS_BASE.lock"; flock -w 120 9 || true   # don't race a concurrent start

if [[ -n "$pid" ]] && ours "$pid"; then
  log "stopping redis-test-$REDIS_PORT (pid $pid, SIG$REDIS_SIGNAL) ..."
  kill "-$REDIS_SIGNAL" "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "still alive after 30 s; SIGKILL $pid"; kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  fi
  log "stopped"
else
  log "redis-test-$REDIS_PORT is not running"
fi
# Redis removes its pid file on a clean exit only.
rm -f "$PID_FILE"
# A chroot's server: its state dir is bind-mounted in the chroot; undo that, so removing the
# chroot never reaches the host's files.
if [[ -n "$ROOTFS" ]] && mountpoint -q "$ROOTFS$REDIS_BASE" 2>/dev/null; then
  umount "$ROOTFS$REDIS_BASE" || log "could not unmount $ROOTFS$REDIS_BASE"
fi
[[ "$REDIS_KEEP_DATA" == 1 ]] || rm -rf "$REDIS_BASE/data"
log "done (log kept in $REDIS_BASE/redis.log)"
