// A plain amqplib consumer whose failures the faststream-retry worker retries.
//
// All it knows of the worker is one name, its intake exchange `${PREFIX}.intake`: its
// work queue dead-letters into it. A message it cannot handle it rejects without
// requeue; the worker sends it back to this queue (and no other) after a backoff, with
// `retry-*` headers, or to `<queue>.dlq` once the attempts are spent. To ask for a delay
// of its own, or to give up at once, it tells the worker with headers (see `settle`).
//
// Environment (all optional):
//   RABBITMQ_URL  amqp://guest:guest@127.0.0.1:5672/
//   PREFIX        retry           the worker's prefix (its intake is PREFIX.intake)
//   EXCHANGE      orders-fanout   the fanout the orders are published to
//   QUEUE         orders          the work queue: fails, is retried
//   AUDIT_QUEUE   orders-audit    a second queue on the same fanout: always acks
//   LOG_FORMAT    text            or json: one JSON object per line
//
// What each order does on each attempt is in its body, {"order": id, "plan": [...]}, a
// step per attempt (the last repeats): "ok", "fail" (an error: rejected, retried with
// the queue's backoff), "later:<duration>" (retry after that long), "give-up".
"use strict";

const amqp = require("amqplib");

const env = process.env;
const url = env.RABBITMQ_URL || "amqp://guest:guest@127.0.0.1:5672/";
const prefix = env.PREFIX || "retry";
const exchange = env.EXCHANGE || "orders-fanout";
const queue = env.QUEUE || "orders";
const auditQueue = env.AUDIT_QUEUE || "orders-audit";
const json = env.LOG_FORMAT === "json";
const intake = `${prefix}.intake`;

// --8<-- [start:word]
// Failures a handler throws to say more than "retry with the queue's backoff".
class RetryLater extends Error {
  /** Retry after `delay`: seconds, or a text such as "30s", "1.5s", "250ms", "10m". */
  constructor(delay, message) {
    super(message);
    this.name = "RetryLater";
    this.delay = delay;
  }
}

class Permanent extends Error {
  /** Retrying cannot help: to <queue>.dlq at once. */
  constructor(message) {
    super(message);
    this.name = "Permanent";
  }
}

// Headers travel in one frame (128 KiB): a long error message or stack is cut here, as
// the worker would cut it anyway (1 KiB for the error, 4 KiB for the stack).
function cut(text, most) {
  const value = String(text ?? "");
  return value.length > most ? `${value.slice(0, most - 3)}...` : value;
}

// RabbitMQ's own headers, and sender-selected routing (CC would copy it elsewhere).
const BROKER_HEADERS = /^(x-death|x-first-death-.*|x-last-death-.*|x-delivery-count|x-acquired-count|CC|BCC)$/;

/** Republish `message` to `queue` marked with `word`, wait for the confirm, ack the original. */
async function tellTheWorker(channel, queue, message, word) {
  const headers = {};
  for (const [key, value] of Object.entries(message.properties.headers || {})) {
    if (!BROKER_HEADERS.test(key)) headers[key] = value;
  }
  // userId: RabbitMQ refuses one that is not the connection's own user.
  const { userId, ...properties } = message.properties;
  await new Promise((resolve, reject) => {
    const options = { ...properties, headers: { ...headers, ...word } };
    channel.publish("", queue, message.content, options, (error) =>
      error ? reject(error) : resolve(),
    );
  });
  channel.ack(message);
}

/**
 * Run `handler` on `message` and settle it: ack, or reject (requeue=false) so that the
 * worker retries it. A reject carries no words, so to ask for its own delay or to give
 * up, the consumer republishes the message to its queue with headers that say so, acks
 * the original, and rejects the marked copy when it arrives (whichever replica gets it).
 * Returns what it did.
 */
async function settle(channel, queue, message, handler) {
  const headers = message.properties.headers || {};
  if (headers["retry-exception"] !== undefined) {
    // A copy marked by this consumer or a replica: its word is for the worker.
    channel.nack(message, false, false);
    return "marked copy: reject";
  }
  try {
    await handler(message);
  } catch (error) {
    const said = {
      "retry-exception": cut(error?.name || "Error", 200),
      "retry-error": cut(error?.message ?? error, 1000), // a thrown string is its own message
      "retry-traceback": cut(error?.stack, 4000),
    };
    if (error instanceof RetryLater) {
      await tellTheWorker(channel, queue, message, { ...said, "retry-delay": error.delay });
      return `later ${error.delay}`;
    }
    if (error instanceof Permanent) {
      await tellTheWorker(channel, queue, message, { ...said, "retry-permanent": true });
      return "give up";
    }
    channel.nack(message, false, false); // the queue's backoff
    return "reject";
  }
  channel.ack(message);
  return "ack";
}
// --8<-- [end:word]

// --8<-- [start:state]
/** What the worker says of a delivery's past: failed attempts, the first failure, each one. */
function retryState(message) {
  const headers = message.properties.headers || {};
  const history = headers["retry-history"]; // [{attempt, at, exception, error, delay}, ...]
  return {
    attempt: Number(headers["retry-attempt"] || 0), // failed attempts before this delivery
    firstFailedAt: headers["retry-first-failed-at"] ?? null, // epoch ms
    history: Array.isArray(history) ? history : [], // the last 10, oldest first
  };
}
// --8<-- [end:state]

// The application's handler; what an order does on each attempt is in its body.
async function handleOrder(message, state) {
  let order;
  try {
    order = JSON.parse(message.content.toString());
  } catch {
    throw new Permanent("the body is not JSON");
  }
  const plan = Array.isArray(order.plan) && order.plan.length ? order.plan : ["ok"];
  const step = String(plan[Math.min(state.attempt, plan.length - 1)]);
  if (step === "ok") return;
  if (step === "fail") throw new Error(`the payment service is unavailable for ${order.order}`);
  if (step.startsWith("later:")) {
    throw new RetryLater(step.slice("later:".length), `rate limited for ${order.order}`);
  }
  if (step === "give-up") throw new Permanent(`order ${order.order} has no customer`);
  throw new Permanent(`unknown step ${JSON.stringify(step)}`);
}

const started = performance.now();
const arrivals = new Map(); // "queue id" -> deliveries seen by this process

function report(fields) {
  const t = (performance.now() - started) / 1000;
  if (json) {
    console.log(JSON.stringify({ t, at: Date.now(), ...fields }));
    return;
  }
  const last = fields.history.length ? fields.history[fields.history.length - 1] : null;
  const past = last ? `  last failure: ${last.exception}: ${last.error}` : "";
  console.log(
    `${t.toFixed(2).padStart(7)}s  ${fields.queue.padEnd(14)} ${fields.id.padEnd(16)} ` +
      `arrival ${fields.arrival}  retry-attempt=${fields.attempt}  -> ${fields.outcome}${past}`,
  );
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// --8<-- [start:wait]
/** Wait until the worker's intake exists: until then RabbitMQ drops what the queue dead-letters. */
async function waitForIntake(connection) {
  for (let waited = 0; ; waited++) {
    const channel = await connection.createChannel();
    channel.on("error", () => {}); // a missing exchange or queue closes the channel: expected
    try {
      await channel.checkExchange(intake);
      await channel.checkQueue(intake);
      await channel.close();
      return;
    } catch {
      if (waited === 0) {
        const fix = "faststream-retry worker --config retry.toml --declare";
        if (json) console.log(JSON.stringify({ waiting: intake }));
        else console.log(`waiting for the retry worker's intake ${intake} (run: ${fix})`);
      }
      await sleep(1000);
    }
  }
}
// --8<-- [end:wait]

async function main() {
  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel(); // confirms for tellTheWorker
  await channel.prefetch(10);

  await channel.assertExchange(exchange, "fanout", { durable: true });
  // --8<-- [start:declare]
  // The one argument that opts the queue in to the worker's retries.
  await channel.assertQueue(queue, { durable: true, deadLetterExchange: `${prefix}.intake` });
  // --8<-- [end:declare]
  await channel.assertQueue(auditQueue, { durable: true });
  await channel.bindQueue(queue, exchange, "");
  await channel.bindQueue(auditQueue, exchange, "");
  // The queues hold what is published meanwhile; nothing is consumed, so nothing rejected.
  await waitForIntake(connection);

  function consume(name, handler) {
    return channel.consume(name, (message) => {
      if (message === null) return; // the broker cancelled the consumer
      const id = message.properties.messageId || "?";
      const key = `${name} ${id}`;
      const arrival = (arrivals.get(key) || 0) + 1;
      arrivals.set(key, arrival);
      const state = retryState(message);
      const traceparent = (message.properties.headers || {}).traceparent || null;
      settle(channel, name, message, (m) => handler(m, state)).then(
        (outcome) => report({ queue: name, id, arrival, ...state, traceparent, outcome }),
        (error) => {
          console.error(`settling ${id} failed: ${error.message}`);
          process.exit(1);
        },
      );
    });
  }

  await consume(queue, handleOrder);
  await consume(auditQueue, async () => {});
  if (json) console.log(JSON.stringify({ ready: true, work_queue: queue, audit_queue: auditQueue }));
  else console.log(`consuming ${queue} and ${auditQueue} (bound to ${exchange}); Ctrl-C stops`);

  let stopping = false;
  async function stop() {
    if (stopping) return;
    stopping = true;
    try {
      await connection.close();
    } finally {
      process.exit(0);
    }
  }
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  connection.on("close", () => {
    if (!stopping) {
      console.error("connection to RabbitMQ closed");
      process.exit(1);
    }
  });
}

main().catch((error) => {
  console.error(`consumer failed: ${error.message}`);
  process.exit(1);
});
