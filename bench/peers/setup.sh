#!/usr/bin/env bash
# One virtualenv per library compared by bench/peers, outside the repository, so none of
# them is ever a dependency of faststream-retry:
#
#   bash bench/peers/setup.sh            # once, about 2 minutes
#
#   BENCH_VENVS=${TMPDIR:-/tmp}/faststream-retry-bench   where the venvs go
#   FR_CHECKOUT=<repo root>   the faststream-retry checkout installed (editable) in the fr venv;
#                             the runner can point at another checkout later (FR_CHECKOUT too)
#   PYTHON=python3            the interpreter the venvs are made from
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VENVS="${BENCH_VENVS:-${TMPDIR:-/tmp}/faststream-retry-bench}"
FR_CHECKOUT="${FR_CHECKOUT:-$(cd "$here/../.." && pwd)}"
PY="${PYTHON:-python3}"
FASTSTREAM="faststream[rabbit]==0.7.8"

make() {  # make NAME PIP-ARGS...
  local venv="$VENVS/$1"; shift
  [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}
mkdir -p "$VENVS"
make fs "$FASTSTREAM"
make rk "rabbitkit[async]==0.19.1"
make ef "easy-faststream==0.12.0"
make fr -e "$FR_CHECKOUT" "$FASTSTREAM" "opentelemetry-sdk>=1.25"  # the traced column
for v in fs rk ef fr; do
  printf '%s: ' "$v"
  "$VENVS/$v/bin/pip" list --disable-pip-version-check 2>/dev/null \
    | awk 'tolower($1) ~ /^(faststream|faststream-retry|rabbitkit|easy-faststream|aio-pika|aiormq)$/ {printf "%s %s  ", $1, $2}'
  echo
done
echo "venvs ready in $VENVS"
