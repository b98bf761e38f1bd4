# Shared by scripts/test and scripts/demo: a virtualenv with the project, and a broker.
# Sourced, not run.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

pick_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3.10 python3; do
    [[ -n "$candidate" ]] || continue
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}

# find_python X.Y: print a working python X.Y (on PATH, else the newest pyenv patch release).
find_python() {
  local want="$1" candidate root
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  # Patch releases only ("3.13.0", not the free-threaded "3.13.0t").
  for candidate in "python$want" $(ls -d "$root/versions/$want".*/bin/python 2>/dev/null \
      | grep -E "/$want\.[0-9]+/bin/python$" | sort -rV); do
    if command -v "$candidate" >/dev/null 2>&1 \
      && [[ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" == "$want" ]]; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

make_venv() {  # make_venv DIR [PYTHON]: a virtualenv in DIR, unless one is there
  local dir="$1" py="${2:-}"
  [[ -x "$dir/bin/python" ]] && return 0
  [[ -n "$py" ]] || py="$(pick_python)" \
    || { log "ERROR: Python >= 3.10 is needed (apt-get install python3)"; exit 1; }
  if ! "$py" -m venv "$dir" 2>/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
      log "installing python3-venv"
      apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2
      "$py" -m venv "$dir"
    else
      log "ERROR: '$py -m venv' failed; install your distribution's venv package (python3-venv)"
      exit 1
    fi
  fi
}

# ensure_venv [DIR PYTHON GROUPS...]: the project and the dependency groups GROUPS of
# pyproject.toml in DIR (default: $VENV, with every group: "dev").
ensure_venv() {
  local dir="${1:-$VENV}" py="${2:-}" stamp group groups=()
  for group in "${@:3}"; do groups+=(--group "$ROOT/pyproject.toml:$group"); done
  [[ ${#groups[@]} -gt 0 ]] || groups=(--group "$ROOT/pyproject.toml:dev")
  stamp="$dir/.installed"
  make_venv "$dir" "$py"
  # Reinstall only when the dependencies, or the groups asked for, changed.
  if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" || "$(<"$stamp")" != "${*:3}" ]]; then
    log "installing faststream-retry and its dev dependencies into $dir"
    # Stamped only once installed: a failed install is tried again next time.
    "$dir/bin/python" -m pip install -q --upgrade pip >&2 || return 1
    "$dir/bin/python" -m pip install -q -e "$ROOT" "${groups[@]}" >&2 || return 1
    echo "${*:3}" >"$stamp"
  fi
}

# A second virtualenv where every runtime dependency is pinned to the lowest version
# pyproject.toml allows (the dev tools float). Needs ensure_venv first.
LOWEST_VENV="${LOWEST_VENV:-$ROOT/.venv-lowest}"
ensure_lowest_venv() {
  local stamp="$LOWEST_VENV/.installed" constraints="$LOWEST_VENV/constraints.txt"
  make_venv "$LOWEST_VENV"
  if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
    "$VENV/bin/python" "$ROOT/scripts/floors.py" >"$constraints"
    log "installing faststream-retry at its dependency floors into $LOWEST_VENV"
    "$LOWEST_VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$LOWEST_VENV/bin/python" -m pip install -q -c "$constraints" -e "$ROOT" \
      --group "$ROOT/pyproject.toml:test" --group "$ROOT/pyproject.toml:run" \
      --group "$ROOT/pyproject.toml:lint" >&2
    touch "$stamp"
  fi
}

# Each RabbitMQ series on ports of its own (scripts/test runs them side by side): the
# suite's broker, the node the fault suite restarts, and the first of its three-node cluster.
declare -A SERIES_PORT=([3.10]=5673 [4.3]=5674 [4.0]=5675)
declare -A SERIES_RESTART_PORT=([3.10]=5690 [4.3]=5691)
declare -A SERIES_CLUSTER_PORT=([3.10]=5680 [4.3]=5683)

# Sets RABBITMQ_URL (a broker the caller named, or one started here: RMQ_SERIES's, on its
# port) and arranges for a broker started here to be stopped on exit.
ensure_rabbitmq() {
  if [[ -n "${RABBITMQ_URL:-}" ]]; then
    log "using RABBITMQ_URL=$RABBITMQ_URL"
    return 0
  fi
  local err; err="$(mktemp)"
  if [[ -n "${RMQ_SERIES:-}" ]]; then
    export RMQ_PORT="${RMQ_PORT:-${SERIES_PORT[$RMQ_SERIES]:-5673}}"
    export RMQ_RESTART_PORT="${RMQ_RESTART_PORT:-${SERIES_RESTART_PORT[$RMQ_SERIES]:-5690}}"
    export RMQ_CLUSTER_PORT="${RMQ_CLUSTER_PORT:-${SERIES_CLUSTER_PORT[$RMQ_SERIES]:-5680}}"
  fi
  if ! RABBITMQ_URL="$(bash "$ROOT/scripts/rabbitmq/start.sh" 2>"$err")"; then
    cat "$err" >&2; rm -f "$err"; exit 1
  fi
  if grep -q "reusing running node" "$err"; then
    log "reusing the RabbitMQ already running at $RABBITMQ_URL"
  else
    log "started RabbitMQ at $RABBITMQ_URL (stopped again on exit)"
    trap 'bash "$ROOT/scripts/rabbitmq/stop.sh" >/dev/null 2>&1 || true' EXIT
  fi
  rm -f "$err"
  export RABBITMQ_URL
}

# start_series SERIES PORT: start RabbitMQ SERIES (scripts/rabbitmq/series.sh) on PORT and
# print its URL. A node this call started is stopped when the calling shell exits (see
# stop_started); one that was running already is left as it was.
STARTED_FILE="${TMPDIR:-/tmp}/faststream-retry-started.$$"
start_series() {
  local series="$1" port="$2" err url
  err="$(mktemp)"
  if ! url="$(RMQ_SERIES="$series" RMQ_PORT="$port" bash "$ROOT/scripts/rabbitmq/start.sh" 2>"$err")"; then
    cat "$err" >&2; rm -f "$err"; return 1
  fi
  grep -q "reusing running node" "$err" || echo "$port" >>"$STARTED_FILE"
  grep -E "ready in|reusing" "$err" | sed "s/^/[$series] /" >&2
  rm -f "$err"
  echo "$url"
}
stop_started() {
  local port
  if [[ -f "$STARTED_FILE" ]]; then
    while read -r port; do
      RMQ_PORT="$port" bash "$ROOT/scripts/rabbitmq/stop.sh" >/dev/null 2>&1 || true
    done <"$STARTED_FILE"
    rm -f "$STARTED_FILE"
  fi
  if [[ -f "$NATS_STARTED_FILE" ]]; then
    while read -r port; do
      NATS_PORT="$port" bash "$ROOT/scripts/nats/stop.sh" >/dev/null 2>&1 || true
    done <"$NATS_STARTED_FILE"
    rm -f "$NATS_STARTED_FILE"
  fi
}

# NATS JetStream (issue 39): each nats-server series on ports of its own
# (scripts/nats/start.sh), as for RabbitMQ: the suite's server, the node the fault suite
# restarts, and the first of its three-node cluster (routes on each client port + 100).
declare -A NATS_SERIES_PORT=([2.9]=4301 [2.15]=4302)
declare -A NATS_SERIES_RESTART_PORT=([2.9]=4303 [2.15]=4304)
declare -A NATS_SERIES_CLUSTER_PORT=([2.9]=4305 [2.15]=4308)

# start_nats_series SERIES PORT: start nats-server SERIES on PORT and print its URL; one
# this call started is stopped by stop_started, one that was running is left as it was.
NATS_STARTED_FILE="${TMPDIR:-/tmp}/faststream-retry-nats-started.$$"
start_nats_series() {
  local series="$1" port="$2" err url
  err="$(mktemp)"
  if ! url="$(NATS_SERIES="$series" NATS_PORT="$port" bash "$ROOT/scripts/nats/start.sh" 2>"$err")"; then
    cat "$err" >&2; rm -f "$err"; return 1
  fi
  grep -q "reusing running node" "$err" || echo "$port" >>"$NATS_STARTED_FILE"
  grep -E "ready in|reusing" "$err" | sed "s/^/[nats $series] /" >&2
  rm -f "$err"
  echo "$url"
}

# ensure_promtool: print the path of Prometheus's promtool, which the metrics tests run
# on the alert rules and the plugin's /metrics output. The one on PATH, else the one
# unpacked from Debian's `prometheus` package into .tools/ (the package itself is not
# installed: it would bring a service and a web UI's assets for one static binary).
ensure_promtool() {
  local dir="$ROOT/.tools/promtool" tmp
  if command -v promtool >/dev/null 2>&1; then command -v promtool; return 0; fi
  if [[ -x "$dir/promtool" ]]; then echo "$dir/promtool"; return 0; fi
  command -v apt-get >/dev/null 2>&1 || { log "no promtool, and no apt-get to fetch it"; return 1; }
  tmp="$(mktemp -d)"
  (
    cd "$tmp"
    # Serialised with the brokers' apt-get installs (scripts/rabbitmq/series.sh).
    flock -w 600 7 || exit 1
    apt-get download -q prometheus >&2 2>/dev/null \
      || { apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get download -q prometheus >&2; }
  ) 7>"${TMPDIR:-/tmp}/faststream-retry-apt.lock" || { rm -rf "$tmp"; return 1; }
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" && mkdir -p "$dir" \
    && cp "$tmp/x/usr/bin/promtool" "$dir/promtool" || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"
  log "promtool: $("$dir/promtool" --version 2>&1 | head -1)"
  echo "$dir/promtool"
}

# ensure_chromium: Debian's chromium, which the dead-letter page's browser tests drive
# (Playwright's own browser download is not used). Installed as root with apt-get.
ensure_chromium() {
  [[ -x "${CHROMIUM:-/usr/bin/chromium}" ]] && return 0
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "no chromium: apt-get install chromium (as root) for the browser tests"
    return 1
  fi
  # apt_install serialises with the brokers' installs (one dpkg at a time).
  source "$ROOT/scripts/rabbitmq/series.sh"
  log "installing Debian's chromium for the browser tests"
  apt_install chromium
}

# Redis Streams (issue 40): each series on ports of its own (scripts/redis/start.sh), as for
# RabbitMQ: the suite's server, the one a fault test kills and restarts, and the first of
# its three-master cluster (scripts/redis/cluster.sh; each node's cluster bus on its port
# + 10000). The scripts own 6401-6420; Redis' own 6379 is left alone.
declare -A REDIS_SERIES_PORT=([7.0]=6401 [8.0]=6402 [valkey-9.1]=6403)
declare -A REDIS_SERIES_RESTART_PORT=([7.0]=6404 [8.0]=6405 [valkey-9.1]=6406)
declare -A REDIS_SERIES_CLUSTER_PORT=([7.0]=6407 [8.0]=6410 [valkey-9.1]=6413)
# The server whose persistence tests/redis/test_doctor.py changes (CONFIG SET) and stops.
declare -A REDIS_SERIES_DOCTOR_PORT=([7.0]=6416 [8.0]=6417 [valkey-9.1]=6418)

# start_redis_series SERIES PORT: start Redis SERIES on PORT (AOF, appendfsync always) and
# print its URL; one this call started is stopped by stop_started_redis, one that was
# running is left as it was.
REDIS_STARTED_FILE="${TMPDIR:-/tmp}/faststream-retry-redis-started.$$"
start_redis_series() {
  local series="$1" port="$2" err url
  err="$(mktemp)"
  if ! url="$(REDIS_SERIES="$series" REDIS_PORT="$port" bash "$ROOT/scripts/redis/start.sh" 2>"$err")"; then
    cat "$err" >&2; rm -f "$err"; return 1
  fi
  grep -q "reusing running server" "$err" || echo "$port" >>"$REDIS_STARTED_FILE"
  grep -E "ready in|reusing" "$err" | sed "s/^/[redis $series] /" >&2
  rm -f "$err"
  echo "$url"
}
stop_started_redis() {
  local port
  [[ -f "$REDIS_STARTED_FILE" ]] || return 0
  while read -r port; do
    REDIS_PORT="$port" bash "$ROOT/scripts/redis/stop.sh" >/dev/null 2>&1 || true
  done <"$REDIS_STARTED_FILE"
  rm -f "$REDIS_STARTED_FILE"
}
