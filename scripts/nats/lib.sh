# Shared by start.sh, stop.sh and cluster.sh. Sourced, not run; needs NATS_BASE.

# alive, port_open, stop_server
source "$(dirname "${BASH_SOURCE[0]}")/../server.sh"
# ours = a process whose command line names our config file (guards against PID reuse)
ours() { alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "-c $NATS_BASE/nats.conf"; }

# js_ready PORT: JetStream on the server at PORT answers $JS.API.INFO with account info,
# not an error: on a single node once its store is loaded, on a cluster node once the
# cluster has a meta leader. Asked over the client protocol itself, so it needs no
# monitoring port and no nats CLI.
js_ready() {
  local reply
  # shellcheck disable=SC2016  # $JS is a NATS subject, not a variable
  reply="$(timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB _ready 1\r\nPUB \$JS.API.INFO _ready 0\r\n\r\n" >&3
    while IFS= read -r line <&3; do
      case "$line" in
        MSG*) IFS= read -r body <&3; printf "%s" "$body"; exit 0 ;;
        PING*) printf "PONG\r\n" >&3 ;;
      esac
    done
    exit 1' _ "$1" 2>/dev/null)" || return 1
  [[ "$reply" == *account_info_response* && "$reply" != *'"error"'* ]]
}
