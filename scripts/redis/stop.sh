#!/usr/bin/env bash
# Stop the throwaway redis-server start.sh started on REDIS_PORT (same REDIS_PORT /
# REDIS_BASE knobs), and only that one. Idempotent: "not running" is success.
#   REDIS_KEEP_DATA=1   keep the data (the AOF; default: delete it, keep the log)
#   REDIS_SIGNAL=TERM   KILL: a crash rather than a shutdown (a fault test's restart);
#                       SIGTERM makes the server fsync its AOF and exit (and remove its
#                       pid file, which it does on a clean exit only)
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

REDIS_PORT="${REDIS_PORT:-6401}"
REDIS_BASE="${REDIS_BASE:-${TMPDIR:-/tmp}/redis-test-${REDIS_PORT}}"
log() { printf '[stop-redis] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_server "redis-test-$REDIS_PORT" "$REDIS_BASE" "$REDIS_BASE/redis.pid" \
  "${REDIS_SIGNAL:-TERM}" "${REDIS_KEEP_DATA:-0}"
log "done (log kept in $REDIS_BASE/redis.log)"
