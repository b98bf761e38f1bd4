#!/usr/bin/env bash
# Start a throwaway RabbitMQ broker for tests, benchmarks and the demo -- no systemd, no root
# needed once the Debian package is installed (root is only needed to install it).
#
#   export RABBITMQ_URL="$(bash start-rabbitmq.sh)"    # URL is the ONLY stdout line
#   ... run tests ...
#   bash stop-rabbitmq.sh
#
# Knobs (all optional):
#   RMQ_PORT=5673        AMQP port (5672 works too if free). Node name, data dir,
#                        distribution port and management port derive from it,
#                        so two checkouts using different RMQ_PORTs never clash.
#   RMQ_NODENAME=rabbit-test-$RMQ_PORT@localhost
#   RMQ_DIST_PORT=$((RMQ_PORT+20000))   Erlang distribution port (CLI tools)
#   RMQ_BASE=${TMPDIR:-/tmp}/rabbitmq-test-$RMQ_PORT   state dir (mnesia, logs, cookie)
#   RMQ_MANAGEMENT=0     1 = enable rabbitmq_management (HTTP API, ~+0.5 s boot)
#   RMQ_MGMT_PORT=$((RMQ_PORT+10000))   (5672 -> 15672, 5673 -> 15673)
#   RMQ_TIMEOUT=90       seconds to wait for readiness
#   RMQ_FRESH=1          wipe the node's data before a *new* start (never on reuse)
#   RMQ_AUTO_INSTALL=1   apt-get install rabbitmq-server if missing (root only)
#   RMQ_COOKIE=          Erlang cookie to boot with (nodes that cluster must share one;
#                        scripts/rabbitmq/cluster.sh sets it)
#   RMQ_SERIES=          3.10, 4.0 or 4.3: that RabbitMQ series, from the host's package
#                        when it is that series, else from a Debian chroot
#                        (scripts/rabbitmq/series.sh); unset = the host's package
#
# Idempotent: if the node is already up it is reused (exit 0, same URL).
# Concurrent calls with the same RMQ_PORT are serialised by flock.
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
# Erlang/Elixir CLI warns loudly under a non-UTF-8 locale (e.g. `env -i`).
export LC_ALL="${LC_ALL:-C.UTF-8}" LANG="${LANG:-C.UTF-8}"

RMQ_PORT="${RMQ_PORT:-5673}"
RMQ_NODENAME="${RMQ_NODENAME:-rabbit-test-${RMQ_PORT}@localhost}"
RMQ_DIST_PORT="${RMQ_DIST_PORT:-$((RMQ_PORT + 20000))}"
RMQ_BASE="${RMQ_BASE:-${TMPDIR:-/tmp}/rabbitmq-test-${RMQ_PORT}}"
RMQ_MANAGEMENT="${RMQ_MANAGEMENT:-0}"
RMQ_MGMT_PORT="${RMQ_MGMT_PORT:-$((RMQ_PORT + 10000))}"
RMQ_TIMEOUT="${RMQ_TIMEOUT:-90}"
RMQ_FRESH="${RMQ_FRESH:-1}"
RMQ_AUTO_INSTALL="${RMQ_AUTO_INSTALL:-1}"
URL="amqp://guest:guest@127.0.0.1:${RMQ_PORT}/"

log() { printf '[start-rabbitmq] %s\n' "$*" >&2; }
die() { printf '[start-rabbitmq] ERROR: %s\n' "$*" >&2; exit 1; }
t_start=$(date +%s.%N)
elapsed() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
source "$(dirname "${BASH_SOURCE[0]}")/series.sh"
choose_series

# ---------------------------------------------------------------- locate / install
find_sbin() {
  if [[ -n "${RMQ_SBIN:-}" ]]; then echo "$RMQ_SBIN"; return 0; fi
  # A chroot's programs, by their path inside it (run through IN_ROOT).
  if [[ -n "$ROOTFS" ]]; then echo /usr/lib/rabbitmq/bin; return 0; fi
  # Call the real scripts, NOT /usr/sbin/rabbitmq-server: the Debian wrapper does
  # `su rabbitmq` when run as root, which resets HOME (cookie) and needs every
  # temp dir to be writable by the rabbitmq user.
  if [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then echo /usr/lib/rabbitmq/bin; return 0; fi
  local p; p="$(command -v rabbitmq-server 2>/dev/null)" || return 1
  dirname "$(readlink -f "$p")"
}

# ---------------------------------------------------------------- docker fallback
# No Debian package and no way to install it (not root, or no apt-get): use Docker
# when an engine answers. The container is named after the port; stop.sh removes it.
can_apt() { [[ "$RMQ_AUTO_INSTALL" == 1 && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; }
no_local_series() {
  if [[ -n "$ROOTFS" ]]; then [[ "$(id -u)" != 0 ]] && ! version_in "$ROOTFS" >/dev/null
  else ! find_sbin >/dev/null 2>&1 && ! can_apt; fi
}
if no_local_series; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    name="faststream-retry-rabbitmq-$RMQ_PORT"
    if ! docker ps --format '{{.Names}}' | grep -qx "$name"; then
      docker rm -f "$name" >/dev/null 2>&1 || true
      log "starting RabbitMQ in Docker container $name on 127.0.0.1:$RMQ_PORT"
      docker run -d --name "$name" -p "127.0.0.1:$RMQ_PORT:5672" "rabbitmq:${RMQ_SERIES:-3}" >/dev/null \
        || die "docker run rabbitmq:${RMQ_SERIES:-3} failed"
    fi
    deadline=$(( $(date +%s) + RMQ_TIMEOUT ))
    until docker exec "$name" rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1; do
      (( $(date +%s) < deadline )) || die "RabbitMQ in container $name not ready after ${RMQ_TIMEOUT} s"
      sleep 1
    done
    log "ready in $(elapsed) s: $URL (docker container $name)"
    echo "$URL"; exit 0
  fi
  [[ -n "$ROOTFS" ]] && die "RabbitMQ $RMQ_SERIES runs from a Debian chroot, and building one needs root: run this as root once, start a Docker engine, or point RABBITMQ_URL at a $RMQ_SERIES broker you run."
  die "RabbitMQ is not installed. Install it with 'sudo apt-get install rabbitmq-server' (Debian/Ubuntu), start a Docker engine, or point RABBITMQ_URL at a broker you run."
fi

if ! SBIN="$(find_sbin)"; then
  [[ "$RMQ_AUTO_INSTALL" == 1 ]] || die "rabbitmq-server not installed (apt-get install -y rabbitmq-server)"
  [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
    || die "rabbitmq-server not installed and cannot auto-install (need root + apt-get): apt-get install -y rabbitmq-server"
  log "rabbitmq-server not installed: installing the Debian package (~15-20 s) ..."
  # Without systemd, the package's postinst would try to start the *system*
  # broker on 5672 via /etc/init.d unless policy-rc.d forbids it.
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
  fi
  apt_install rabbitmq-server \
    || { [[ $made_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d; die "apt-get install rabbitmq-server failed"; }
  [[ $made_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  SBIN="$(find_sbin)" || die "rabbitmq-server still not found after install"
  log "installed in $(elapsed) s"
fi

ensure_chroot
VERSION="$(version_in "$ROOTFS" || echo unknown)"

# ---------------------------------------------------------------- environment
mkdir -p "$RMQ_BASE"
bind_base "$RMQ_BASE"
export ERL_EPMD_PORT="$EPMD_PORT"
export RABBITMQ_NODENAME="$RMQ_NODENAME"
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT="$RMQ_PORT"
export RABBITMQ_DIST_PORT="$RMQ_DIST_PORT"
export RABBITMQ_MNESIA_BASE="$RMQ_BASE/mnesia"
export RABBITMQ_LOG_BASE="$RMQ_BASE/log"
export RABBITMQ_CONFIG_FILE="$RMQ_BASE/rabbitmq.conf"
export RABBITMQ_ADVANCED_CONFIG_FILE="$RMQ_BASE/advanced.config"
export RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_BASE/enabled_plugins"
export RABBITMQ_CONF_ENV_FILE="$RMQ_BASE/rabbitmq-env.conf"   # ignore /etc/rabbitmq/rabbitmq-env.conf
export RABBITMQ_PID_FILE="$RMQ_BASE/rabbitmq.pid"
export HOME="$RMQ_BASE/home"        # Erlang cookie lives in $HOME/.erlang.cookie
export ERL_CRASH_DUMP="$RMQ_BASE/log/erl_crash.dump"   # default is $PWD (= your repo)
mkdir -p "$HOME" "$RABBITMQ_LOG_BASE"
if [[ -n "${RMQ_COOKIE:-}" ]]; then
  rm -f "$HOME/.erlang.cookie"
  (umask 077; printf '%s' "$RMQ_COOKIE" > "$HOME/.erlang.cookie")
  chmod 400 "$HOME/.erlang.cookie"
fi
STARTUP_LOG="$RABBITMQ_LOG_BASE/startup.log"
NODE_LOG="$RABBITMQ_LOG_BASE/${RMQ_NODENAME}.log"

ctl() { "${IN_ROOT[@]}" "$SBIN/rabbitmqctl" -q -n "$RMQ_NODENAME" "$@"; }
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ -n "$st" && "$st" != Z* ]]; }
# ours = live beam.smp whose command line carries our private HOME (guards against PID reuse)
ours() { alive "$1" && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -qF -- "-home $HOME"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
node_up() { [[ -s "$RABBITMQ_PID_FILE" ]] && ours "$(cat "$RABBITMQ_PID_FILE")" \
            && port_open "$RMQ_PORT" && ctl await_startup --timeout 5 >/dev/null 2>&1; }
fail() {
  log "ERROR: $*"
  local hints
  hints="$(grep -h -m 8 -E 'ERROR|could_not|eaddrinuse|epmd error|Kernel pid terminated' "$STARTUP_LOG" "$NODE_LOG" 2>/dev/null | cut -c1-300)" || true
  [[ -n "$hints" ]] && { log "---- likely cause ----"; printf '%s\n' "$hints" >&2; }
  for f in "$STARTUP_LOG" "$NODE_LOG"; do
    [[ -s "$f" ]] && { log "---- last 40 lines of $f ----"; tail -n 40 "$f" >&2; }
  done
  if [[ -n "${launcher:-}" ]] && alive "$launcher"; then
    log "terminating the half-started broker (launcher pid $launcher)"
    kill -TERM "$launcher" 2>/dev/null || true   # its trap stops beam gracefully
    [[ -s "$RABBITMQ_PID_FILE" ]] && kill -TERM "$(cat "$RABBITMQ_PID_FILE")" 2>/dev/null || true
  fi
  exit 1
}

# Serialise concurrent starts of the same node (parallel CI jobs / shells).
exec 9>"$RMQ_BASE.lock"
flock -w "$RMQ_TIMEOUT" 9 || die "timed out waiting for lock $RMQ_BASE.lock"

if node_up; then
  running="$(cat "$RMQ_BASE/version" 2>/dev/null || echo unknown)"
  [[ -z "$RMQ_SERIES" || "$(series_of "$running")" == "$RMQ_SERIES" ]] \
    || die "the node on port $RMQ_PORT runs RabbitMQ $running, not $RMQ_SERIES: stop it (scripts/rabbitmq/stop.sh) or choose another RMQ_PORT"
  log "reusing running node $RMQ_NODENAME on 127.0.0.1:$RMQ_PORT (RabbitMQ $running, pid $(cat "$RABBITMQ_PID_FILE"))"
  echo "$URL"; exit 0
fi

# Pre-flight: a foreign listener on our ports would fool the readiness check.
for p in "$RMQ_PORT" "$RMQ_DIST_PORT" $([[ "$RMQ_MANAGEMENT" == 1 ]] && echo "$RMQ_MGMT_PORT"); do
  # A node killed a moment ago may still hold its port while it exits: give it 10 s.
  for _ in $(seq 1 50); do port_open "$p" || break; sleep 0.2; done
  if port_open "$p"; then
    who="$(ss -ltnpH "sport = :$p" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -1)"
    die "port $p is already in use${who:+ by $who} (not our node $RMQ_NODENAME). Choose another RMQ_PORT, or stop that broker."
  fi
done
# A stale beam from an earlier run of this node (e.g. half-dead) -> stop it.
if [[ -s "$RABBITMQ_PID_FILE" ]] && ours "$(cat "$RABBITMQ_PID_FILE")"; then
  old=$(cat "$RABBITMQ_PID_FILE")
  log "found stale broker process $old for $RMQ_NODENAME; terminating it"
  kill -TERM "$old" 2>/dev/null || true
  for _ in $(seq 1 50); do alive "$old" || break; sleep 0.2; done
  kill -KILL "$old" 2>/dev/null || true
fi

[[ "$RMQ_FRESH" == 1 ]] && rm -rf "$RABBITMQ_MNESIA_BASE" "$RABBITMQ_PID_FILE"
rm -f "$STARTUP_LOG" "$NODE_LOG"
: > "$RABBITMQ_CONF_ENV_FILE"
cat > "$RABBITMQ_CONFIG_FILE" <<EOF
# generated by start-rabbitmq.sh -- throwaway test broker
listeners.tcp.default = 127.0.0.1:$RMQ_PORT
loopback_users.guest = true
log.console = false
log.file.level = info
# a full /tmp on CI should not block publishers for a test broker
disk_free_limit.absolute = 50MB
EOF
# As strict as RabbitMQ 4.3 lets an operator be: a transient queue that is not exclusive is
# refused (the connection closed), so the suites prove the plugin, the worker and the CLI
# declare none. (4.3.6 takes a global basic.qos even when global_qos is denied.)
if [[ "$(series_of "$VERSION")" == 4.3 ]]; then
  printf '%s\n' "deprecated_features.permit.transient_nonexcl_queues = false" \
    "deprecated_features.permit.global_qos = false" >> "$RABBITMQ_CONFIG_FILE"
fi
if [[ "$RMQ_MANAGEMENT" == 1 ]]; then
  echo "[rabbitmq_management]." > "$RABBITMQ_ENABLED_PLUGINS_FILE"
  printf 'management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %s\n' "$RMQ_MGMT_PORT" >> "$RABBITMQ_CONFIG_FILE"
else
  echo "[]." > "$RABBITMQ_ENABLED_PLUGINS_FILE"
fi
echo "[]." > "$RABBITMQ_ADVANCED_CONFIG_FILE"

# epmd (Erlang port mapper, port 4369) is shared by every Erlang node on the host
# and outlives the broker. If none is running now, the one our broker spawns is
# recorded (by PID) in a file shared by all checkouts, so stop-rabbitmq.sh can
# stop it once no Erlang node is registered any more.
EPMD_PIDFILE="${TMPDIR:-/tmp}/rabbitmq-test-epmd-$EPMD_PORT.pid"
epmd_was_running=0; port_open "$EPMD_PORT" && epmd_was_running=1

# Helpers for humans and tests: $RMQ_BASE/ctl list_queues, $RMQ_BASE/queues rebalance quorum
# (the node's name, cookie and epmd, and for a chroot's series its own programs)
in_root=""; [[ ${#IN_ROOT[@]} == 0 ]] || in_root="$(printf '%q ' "${IN_ROOT[@]}")"
for tool in ctl:rabbitmqctl queues:rabbitmq-queues; do
  cat > "$RMQ_BASE/${tool%%:*}" <<EOF
#!/bin/sh
HOME="$HOME" LC_ALL=C.UTF-8 ERL_EPMD_PORT="$EPMD_PORT" exec $in_root"$SBIN/${tool#*:}" -n "$RMQ_NODENAME" "\$@"
EOF
  chmod +x "$RMQ_BASE/${tool%%:*}"
done
# What runs here, for stop.sh and for a start that would reuse the node.
printf '%s\n' "$VERSION" > "$RMQ_BASE/version"
printf 'ROOTFS=%q\nEPMD_PORT=%q\n' "$ROOTFS" "$EPMD_PORT" > "$RMQ_BASE/series.env"

log "starting $RMQ_NODENAME (RabbitMQ $VERSION${ROOTFS:+ in $ROOTFS}) on 127.0.0.1:$RMQ_PORT (dist $RMQ_DIST_PORT, epmd $EPMD_PORT, data $RMQ_BASE)"
# Background (not -detached) so early boot errors land in startup.log; setsid +
# full fd redirection so the broker survives the caller and never holds its
# stdout pipe (e.g. URL=$(start-rabbitmq.sh)) or the flock fd open.
(cd "$RMQ_BASE" && exec setsid nohup "${IN_ROOT[@]}" "$SBIN/rabbitmq-server" </dev/null >"$STARTUP_LOG" 2>&1 8>&- 9>&-) &
launcher=$!
echo "$launcher" > "$RMQ_BASE/launcher.pid"

# Readiness: cheap TCP poll of the AMQP listener (opened at the end of boot),
# then one `rabbitmqctl await_startup` to confirm it's *our* node and fully booted.
deadline=$(( $(date +%s) + RMQ_TIMEOUT ))
until port_open "$RMQ_PORT"; do
  alive "$launcher" || fail "broker process exited during boot after $(elapsed) s"
  (( $(date +%s) < deadline )) || fail "broker not listening on $RMQ_PORT after ${RMQ_TIMEOUT} s"
  sleep 0.1
done
log "AMQP port $RMQ_PORT open after $(elapsed) s; confirming with rabbitmqctl await_startup"
ctl await_startup --timeout "$RMQ_TIMEOUT" >&2 || fail "rabbitmqctl await_startup failed"
if [[ "$RMQ_MANAGEMENT" == 1 ]]; then
  until port_open "$RMQ_MGMT_PORT"; do
    (( $(date +%s) < deadline )) || fail "management API not listening on $RMQ_MGMT_PORT"
    sleep 0.1
  done
  log "management UI/API: http://127.0.0.1:$RMQ_MGMT_PORT/ (guest/guest)"
fi
if [[ $epmd_was_running == 0 ]]; then
  for d in /proc/[0-9]*; do
    [[ "$(cat "$d/comm" 2>/dev/null)" == epmd ]] || continue
    port="$(tr '\0' '\n' < "$d/environ" 2>/dev/null | sed -n 's/^ERL_EPMD_PORT=//p')"
    [[ "${port:-4369}" == "$EPMD_PORT" ]] && { echo "${d#/proc/}" > "$EPMD_PIDFILE"; break; }
  done
fi
log "ready in $(elapsed) s: $URL (RabbitMQ $VERSION, pid $(cat "$RABBITMQ_PID_FILE"); ctl: $RMQ_BASE/ctl; log: $NODE_LOG)"
echo "$URL"
