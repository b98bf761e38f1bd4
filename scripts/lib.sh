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

ensure_venv() {  # ensure_venv [DIR PYTHON]: the project and its dev tools in DIR (default $VENV)
  local dir="${1:-$VENV}" py="${2:-}" stamp
  stamp="$dir/.installed"
  make_venv "$dir" "$py"
  # Reinstall only when the dependencies changed.
  if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
    log "installing faststream-retry and its dev dependencies into $dir"
    "$dir/bin/python" -m pip install -q --upgrade pip >&2
    "$dir/bin/python" -m pip install -q -e "$ROOT[dev,test-fastapi]" >&2
    touch "$stamp"
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
    "$LOWEST_VENV/bin/python" -m pip install -q -c "$constraints" -e "$ROOT[dev]" >&2
    touch "$stamp"
  fi
}

# Sets RABBITMQ_URL (a broker the caller named, or one started here) and arranges
# for a broker started here to be stopped on exit.
ensure_rabbitmq() {
  if [[ -n "${RABBITMQ_URL:-}" ]]; then
    log "using RABBITMQ_URL=$RABBITMQ_URL"
    return 0
  fi
  local err; err="$(mktemp)"
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
