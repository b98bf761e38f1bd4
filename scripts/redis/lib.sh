# Shared by start.sh, stop.sh and cluster.sh. Sourced, not run; needs REDIS_BASE.

# alive, port_open, stop_server
source "$(dirname "${BASH_SOURCE[0]}")/../server.sh"
# ours = a process whose command line names our config file (guards against PID reuse; the
# config sets `set-proc-title no`, so the server keeps the command line it was given).
ours() { alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$REDIS_BASE/redis.conf"; }

# redis_ask PORT COMMAND...: the first line of the server's answer to COMMAND, over the
# protocol itself (RESP), so it needs no client: "+PONG", "-LOADING ...", "$123".
redis_ask() {
  local port="$1" cmd="" word; shift
  cmd="*$#"$'\r\n'
  for word in "$@"; do cmd+="\$${#word}"$'\r\n'"$word"$'\r\n'; done
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "%s" "$2" >&3
    IFS= read -r line <&3 && printf "%s\n" "$line"' _ "$port" "$cmd" 2>/dev/null | tr -d '\r'
}

# redis_ready PORT: the server answers PING with PONG (not -LOADING while it replays its AOF).
redis_ready() { [[ "$(redis_ask "$1" PING)" == "+PONG" ]]; }
