// A plain amqplib consumer whose failures the faststream-retry worker retries.
//
// All it knows of the worker is one name: its work queue dead-letters into the
// exchange `${PREFIX}.intake`. A message it cannot handle it rejects without
// requeue; the worker sends it back to this queue (and no other) after a backoff,
// with a `retry-attempt` header, or to `<queue>.dlq` once the attempts are spent.
//
// Environment (all optional):
//   RABBITMQ_URL  amqp://guest:guest@127.0.0.1:5672/
//   PREFIX        retry           the worker's prefix (its intake is PREFIX.intake)
//   EXCHANGE      orders-fanout   the fanout the orders are published to
//   QUEUE         orders          the work queue: fails, is retried
//   AUDIT_QUEUE   orders-audit    a second queue on the same fanout: always acks
//   FAIL_TIMES    2               rejections per message, unless its body says
//                                 {"fail_times": n} or {"fail_times": "always"}
//   LOG_FORMAT    text            or json: one JSON object per line
"use strict";

const amqp = require("amqplib");

const env = process.env;
const url = env.RABBITMQ_URL || "amqp://guest:guest@127.0.0.1:5672/";
const prefix = env.PREFIX || "retry";
const exchange = env.EXCHANGE || "orders-fanout";
const queue = env.QUEUE || "orders";
const auditQueue = env.AUDIT_QUEUE || "orders-audit";
const defaultFailTimes = env.FAIL_TIMES || "2";
const json = env.LOG_FORMAT === "json";

const started = performance.now();
const arrivals = new Map(); // "queue id" -> deliveries seen by this process

function report(fields) {
  const t = (performance.now() - started) / 1000;
  if (json) {
    console.log(JSON.stringify({ t, ...fields }));
    return;
  }
  const attempt = fields.retry_attempt === null ? "-" : fields.retry_attempt;
  console.log(
    `${t.toFixed(2).padStart(7)}s  ${fields.queue.padEnd(14)} ${fields.id.padEnd(16)} ` +
      `arrival ${fields.arrival}  retry-attempt=${attempt}  -> ${fields.outcome}`,
  );
}

function failTimes(content) {
  let wanted = defaultFailTimes;
  try {
    const body = JSON.parse(content.toString());
    if (body && body.fail_times !== undefined) wanted = body.fail_times;
  } catch {
    // not JSON: the default applies
  }
  return wanted === "always" ? Number.POSITIVE_INFINITY : Number(wanted);
}

async function main() {
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  await channel.prefetch(10);

  await channel.assertExchange(exchange, "fanout", { durable: true });
  // The one line that opts the queue in to the worker's retries.
  await channel.assertQueue(queue, {
    durable: true,
    arguments: { "x-dead-letter-exchange": `${prefix}.intake` },
  });
  await channel.assertQueue(auditQueue, { durable: true });
  await channel.bindQueue(queue, exchange, "");
  await channel.bindQueue(auditQueue, exchange, "");

  function handle(name, decide) {
    return (message) => {
      if (message === null) return; // the broker cancelled the consumer
      const id = message.properties.messageId || "?";
      const key = `${name} ${id}`;
      const arrival = (arrivals.get(key) || 0) + 1;
      arrivals.set(key, arrival);
      const header = (message.properties.headers || {})["retry-attempt"];
      const retryAttempt = header === undefined ? null : Number(header);
      const outcome = decide(message, retryAttempt || 0);
      report({ queue: name, id, arrival, retry_attempt: retryAttempt, outcome });
      if (outcome === "ack") channel.ack(message);
      else channel.nack(message, false, false); // reject, requeue=false: to the worker
    };
  }

  // Failed attempts so far come with the message: any replica can decide.
  await channel.consume(
    queue,
    handle(queue, (message, failed) => (failed < failTimes(message.content) ? "reject" : "ack")),
  );
  await channel.consume(
    auditQueue,
    handle(auditQueue, () => "ack"),
  );
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
