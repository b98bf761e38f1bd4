# What the throwaway servers' scripts share (scripts/nats/, scripts/redis/). Sourced, not run;
# the sourcing script defines ours PID (is PID the server it started? guards against PID reuse).

# alive = exists and is not a zombie (PID 1 in some containers reaps late)
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ -n "$st" && "$st" != Z* ]]; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_server NAME BASE PID_FILE SIGNAL KEEP_DATA: stop the server NAME whose state is in
# BASE (its pid in PID_FILE) with SIGNAL (TERM: a shutdown; KILL: a crash), SIGKILL after
# 30 s; unmount its state from a chroot it ran in; delete BASE/data unless KEEP_DATA is 1.
# Idempotent: "not running" is success. Needs log.
stop_server() {
  local name="$1" base="$2" pid_file="$3" signal="$4" keep_data="$5" pid="" ROOTFS=""
  if [[ ! -d "$base" ]]; then log "nothing to stop ($base does not exist)"; return 0; fi
  # shellcheck disable=SC1091  # written by start.sh: ROOTFS of a chroot's server
  [[ -s "$base/series.env" ]] && source "$base/series.env"
  [[ -s "$pid_file" ]] && pid="$(cat "$pid_file")"
  exec 9>"$base.lock"; flock -w 120 9 || true   # don't race a concurrent start
  if [[ -n "$pid" ]] && ours "$pid"; then
    log "stopping $name (pid $pid, SIG$signal) ..."
    kill "-$signal" "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      log "still alive after 30 s; SIGKILL $pid"; kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    fi
    log "stopped"
  else
    log "$name is not running"
  fi
  rm -f "$pid_file"
  # A chroot's server: its state dir is bind-mounted in the chroot; undo that, so removing
  # the chroot never reaches the host's files.
  if [[ -n "$ROOTFS" ]] && mountpoint -q "$ROOTFS$base" 2>/dev/null; then
    umount "$ROOTFS$base" || log "could not unmount $ROOTFS$base"
  fi
  [[ "$keep_data" == 1 ]] || rm -rf "$base/data"
}

# fail MESSAGE: log MESSAGE and the end of LOG_FILE, terminate a half-started server
# (pid in launched), exit 1. Needs log.
fail() {
  log "ERROR: $*"
  [[ -s "$LOG_FILE" ]] && { log "---- last 30 lines of $LOG_FILE ----"; tail -n 30 "$LOG_FILE" >&2; }
  if [[ -n "${launched:-}" ]] && alive "$launched"; then
    log "terminating the half-started server (pid $launched)"
    kill -TERM "$launched" 2>/dev/null || true
  fi
  exit 1
}

# ports_free NAME KNOB PORT...: each PORT free, after up to 10 s each (a server killed a
# moment ago may still hold its port while it exits); else die naming who holds it and
# the KNOB that chooses another. A foreign listener would fool the readiness check.
ports_free() {
  local name="$1" knob="$2" p who; shift 2
  for p in "$@"; do
    for _ in $(seq 1 50); do port_open "$p" || break; sleep 0.2; done
    if port_open "$p"; then
      who="$(ss -ltnpH "sport = :$p" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -1)"
      die "port $p is already in use${who:+ by $who} (not our server $name). Choose another $knob, or stop that server."
    fi
  done
}
