#!/usr/bin/env bash
# Stop the throwaway nats-server start.sh started on NATS_PORT (same NATS_PORT / NATS_BASE
# knobs), and only that one. Idempotent: "not running" is success.
#   NATS_KEEP_DATA=1   keep the JetStream store (default: delete it, keep the log)
#   NATS_SIGNAL=TERM   KILL: a crash rather than a shutdown (the fault suite's restart);
#                      SIGTERM makes nats-server close its clients and flush its store
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

NATS_PORT="${NATS_PORT:-4301}"
NATS_BASE="${NATS_BASE:-${TMPDIR:-/tmp}/nats-test-${NATS_PORT}}"
log() { printf '[stop-nats] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_server "nats-test-$NATS_PORT" "$NATS_BASE" "$NATS_BASE/nats.pid" \
  "${NATS_SIGNAL:-TERM}" "${NATS_KEEP_DATA:-0}"
log "done (log kept in $NATS_BASE/nats.log)"
