// Publish orders to the fanout: node publish.js ID[:STEP,STEP,...] ...
//
//   node publish.js order-1:fail,fail,ok order-2:fail order-3:later:3s,ok order-4:give-up
//
// Each step is what the consumer does on that attempt (the last repeats): ok, fail,
// later:<duration>, give-up. order-1 fails twice and is acked on its 3rd attempt;
// order-2 fails every time; order-3 asks to be retried in 3 s; order-4 is given up.
//
// Each order starts a trace: a W3C `traceparent` header, as an OpenTelemetry-instrumented
// producer sets one. The worker's spans continue it. Prints one line per order with its
// trace id (LOG_FORMAT=json: a JSON object). Same environment as consumer.js
// (RABBITMQ_URL, EXCHANGE).
"use strict";

const crypto = require("node:crypto");
const amqp = require("amqplib");

const url = process.env.RABBITMQ_URL || "amqp://guest:guest@127.0.0.1:5672/";
const exchange = process.env.EXCHANGE || "orders-fanout";
const json = process.env.LOG_FORMAT === "json";

async function main(orders) {
  if (orders.length === 0) {
    console.error("usage: node publish.js ID[:STEP,STEP,...] ...   (STEP: ok, fail, later:5s, give-up)");
    process.exit(2);
  }
  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel();
  await channel.assertExchange(exchange, "fanout", { durable: true });
  for (const order of orders) {
    const colon = order.indexOf(":");
    const id = colon < 0 ? order : order.slice(0, colon);
    const plan = colon < 0 ? ["ok"] : order.slice(colon + 1).split(",");
    const traceId = crypto.randomBytes(16).toString("hex");
    const traceparent = `00-${traceId}-${crypto.randomBytes(8).toString("hex")}-01`;
    channel.publish(exchange, "", Buffer.from(JSON.stringify({ order: id, plan })), {
      messageId: id,
      contentType: "application/json",
      persistent: true,
      headers: { traceparent },
    });
    if (json) console.log(JSON.stringify({ id, plan, traceparent }));
    else console.log(`published ${id} (${plan.join(", ")}), trace ${traceId}`);
  }
  await channel.waitForConfirms();
  await connection.close();
}

main(process.argv.slice(2)).catch((error) => {
  console.error(`publish failed: ${error.message}`);
  process.exit(1);
});
