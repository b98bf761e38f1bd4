#!/usr/bin/env bash
# The polyglot example end to end: the retry worker, a Node.js consumer, three orders.
#
#   RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ examples/polyglot/run.sh
#
# Needs node and npm, and faststream-retry: the checkout's .venv/bin/faststream-retry,
# else FASTSTREAM_RETRY=/path/to/faststream-retry, else the one on PATH.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

export RABBITMQ_URL="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/}"
export PREFIX=retry EXCHANGE=orders-fanout QUEUE=orders AUDIT_QUEUE=orders-audit
export COLUMNS="${COLUMNS:-140}"   # the dlq table's width when the output is not a terminal

frs="${FASTSTREAM_RETRY:-}"
if [[ -z "$frs" ]]; then
  if [[ -x "$root/.venv/bin/faststream-retry" ]]; then frs="$root/.venv/bin/faststream-retry"
  else frs="$(command -v faststream-retry)" || { echo "faststream-retry not found: set FASTSTREAM_RETRY" >&2; exit 1; }
  fi
fi
command -v node >/dev/null || { echo "node is not installed" >&2; exit 1; }
[[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error

logs="$(mktemp -d)"
pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop EXIT
trap 'exit 130' INT TERM

give_up() {
  echo "$1; the worker said:" >&2
  cat "$logs/worker.log" >&2
  exit 1
}
# wait_for FILE PATTERN SECONDS WHAT: until a line of FILE matches PATTERN.
wait_for() {
  local deadline=$((SECONDS + $3)) pid
  until grep -qE "$2" "$1" 2>/dev/null; do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || give_up "a process stopped while waiting for $4"
    done
    ((SECONDS <= deadline)) || give_up "timed out after $3 s waiting for $4"
    sleep 0.2
  done
}

echo "== starting the retry worker ($frs worker --config retry.toml)"
"$frs" worker --config retry.toml --url "$RABBITMQ_URL" >"$logs/worker.log" 2>&1 &
pids+=($!)
wait_for "$logs/worker.log" "consuming $PREFIX\.intake" 60 "the worker to start"

echo "== starting the Node.js consumer (node consumer.js)"
node consumer.js > >(tee "$logs/consumer.log") 2>&1 &
pids+=($!)
wait_for "$logs/consumer.log" "^consuming" 30 "the consumer to start"

run="$(date +%H%M%S)"   # ids of this run: orders.dlq keeps the dead letters of earlier ones
ok="order-1.$run" bad="order-2.$run" fine="order-3.$run"
echo "== publishing $ok (fails twice), $bad (fails every time), $fine (fine) to $EXCHANGE"
node publish.js "$ok:2" "$bad:always" "$fine:0"

wait_for "$logs/consumer.log" "orders +$ok +arrival 3 .*-> ack" 60 "$ok to succeed"
wait_for "$logs/worker.log" "dead-lettered message $bad " 60 "$bad to be dead-lettered"

arrivals() { grep -cE " $1 +$2 +arrival" "$logs/consumer.log" || true; }
echo
echo "== what happened"
echo "$ok: $(arrivals orders "$ok") arrivals in orders, acked on the last; $(arrivals orders-audit "$ok") in orders-audit"
echo "$bad: $(arrivals orders "$bad") arrivals in orders, all rejected, then orders.dlq; $(arrivals orders-audit "$bad") in orders-audit"
echo "$fine: $(arrivals orders "$fine") arrival in orders; $(arrivals orders-audit "$fine") in orders-audit"
echo
echo "== the worker's log"
sed -E 's/^[0-9-]+ ([0-9:]+),[0-9]+ /\1 /' "$logs/worker.log"
echo
echo "== $frs dlq list orders"
"$frs" dlq list orders --url "$RABBITMQ_URL"
