#!/usr/bin/env bash
# The polyglot example end to end: the retry worker, a Node.js consumer, five orders.
#
#   RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ examples/polyglot/run.sh
#
# Needs node and npm, and faststream-retry (pip install 'faststream-retry[cli,otel]'):
# FASTSTREAM_RETRY=/path/to/faststream-retry, else the one on PATH, else a checkout's
# .venv/bin/faststream-retry. OTEL_EXPORTER_OTLP_ENDPOINT set: the worker exports traces.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

export RABBITMQ_URL="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/}"
export PREFIX=retry EXCHANGE=orders-fanout QUEUE=orders AUDIT_QUEUE=orders-audit
export COLUMNS="${COLUMNS:-140}"   # the dlq table's width when the output is not a terminal

frs="${FASTSTREAM_RETRY:-}"
if [[ -z "$frs" ]]; then
  if command -v faststream-retry >/dev/null; then frs="$(command -v faststream-retry)"
  elif [[ -x "$root/.venv/bin/faststream-retry" ]]; then frs="$root/.venv/bin/faststream-retry"
  else
    echo "faststream-retry not found: pip install 'faststream-retry[cli,otel]', or set FASTSTREAM_RETRY" >&2
    exit 1
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

echo "== declaring the worker's intake, tiers and queues ($frs worker --config retry.toml --declare)"
"$frs" worker --config retry.toml --url "$RABBITMQ_URL" --declare --log-level ERROR

echo "== starting the retry worker ($frs worker --config retry.toml)"
"$frs" worker --config retry.toml --url "$RABBITMQ_URL" >"$logs/worker.log" 2>&1 &
pids+=($!)
wait_for "$logs/worker.log" "consuming $PREFIX\.intake" 60 "the worker to start"

echo "== starting the Node.js consumer (node consumer.js)"
node consumer.js > >(tee "$logs/consumer.log") 2>&1 &
pids+=($!)
wait_for "$logs/consumer.log" "^consuming" 30 "the consumer to start"

run="$(date +%H%M%S)"   # ids of this run: orders.dlq keeps the dead letters of earlier ones
twice="order-1.$run" always="order-2.$run" later="order-3.$run" give="order-4.$run" fine="order-5.$run"
echo "== publishing five orders to $EXCHANGE (node publish.js)"
node publish.js "$twice:fail,fail,ok" "$always:fail" "$later:later:3s,ok" "$give:fail,give-up" "$fine:ok"

for id in "$twice" "$later" "$fine"; do
  wait_for "$logs/consumer.log" "orders +$id .*-> ack" 60 "$id to succeed"
done
for id in "$always" "$give"; do
  wait_for "$logs/worker.log" "dead-lettered message $id " 60 "$id to be dead-lettered"
done

arrivals() { grep -E " $1 +$2 +arrival" "$logs/consumer.log" | grep -vc "marked copy" || true; }
echo
echo "== what happened (deliveries of each order; a marked copy is not counted)"
echo "$twice: $(arrivals orders "$twice") in orders, failed twice, acked on the 3rd; $(arrivals orders-audit "$twice") in orders-audit"
echo "$always: $(arrivals orders "$always") in orders, failed every time, then orders.dlq (exhausted)"
echo "$later: $(arrivals orders "$later") in orders, asked for 3 s, acked 3 s later"
echo "$give: $(arrivals orders "$give") in orders, failed, then given up: orders.dlq (permanent)"
echo "$fine: $(arrivals orders "$fine") in orders, acked"
echo
echo "== the worker's log"
sed -E 's/^[0-9-]+ ([0-9:]+),[0-9]+ /\1 /' "$logs/worker.log"
echo
echo "== $frs dlq list orders"
"$frs" dlq list orders --url "$RABBITMQ_URL"
echo
echo "== $frs dlq show orders $give"
"$frs" dlq show orders "$give" --url "$RABBITMQ_URL"
