#!/usr/bin/env bash
# Stop the throwaway nats-server start.sh started on NATS_PORT (same NATS_PORT / NATS_BASE
# knobs), and only that one. Idempotent: "not running" is success.
#   NATS_KEEP_DATA=1   keep the JetStream store (default: delete it, keep the log)
#   NATS_SIGNAL=TERM   KILL: a crash rather than a shutdown (the fault suite's restart)
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

NATS_PORT="${NATS_PORT:-4301}"
NATS_BASE="${NATS_BASE:-${TMPDIR:-/tmp}/nats-test-${NATS_PORT}}"
NATS_KEEP_DATA="${NATS_KEEP_DATA:-0}"
NATS_SIGNAL="${NATS_SIGNAL:-TERM}"
log() { printf '[stop-nats] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ! -d "$NATS_BASE" ]]; then log "nothing to stop ($NATS_BASE does not exist)"; exit 0; fi
ROOTFS=""
[[ -s "$NATS_BASE/series.env" ]] && source "$NATS_BASE/series.env"
PID_FILE="$NATS_BASE/nats.pid"
pid=""; [[ -s "$PID_FILE" ]] && pid="$(cat "$PID_FILE")"

exec 9>"$NATS_BASE.lock"; flock -w 120 9 || true   # don't race a concurrent start

if [[ -n "$pid" ]] && ours "$pid"; then
  log "stopping nats-test-$NATS_PORT (pid $pid, SIG$NATS_SIGNAL) ..."
  # SIGTERM: nats-server closes its clients and flushes its JetStream store, then exits.
  kill "-$NATS_SIGNAL" "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "still alive after 30 s; SIGKILL $pid"; kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  fi
  log "stopped"
else
  log "nats-test-$NATS_PORT is not running"
fi
rm -f "$PID_FILE"
# A chroot's node: its state dir is bind-mounted in the chroot; undo that, so removing the
# chroot never reaches the host's files.
if [[ -n "$ROOTFS" ]] && mountpoint -q "$ROOTFS$NATS_BASE" 2>/dev/null; then
  umount "$ROOTFS$NATS_BASE" || log "could not unmount $ROOTFS$NATS_BASE"
fi
[[ "$NATS_KEEP_DATA" == 1 ]] || rm -rf "$NATS_BASE/data"
log "done (log kept in $NATS_BASE/nats.log)"
