// Publish orders to the fanout: node publish.js ID:FAIL_TIMES ...
//
//   node publish.js order-1:2 order-2:always
//
// order-1 is rejected twice and acked on its 3rd arrival; order-2 is rejected every
// time. Same environment as consumer.js (RABBITMQ_URL, EXCHANGE).
"use strict";

const amqp = require("amqplib");

const url = process.env.RABBITMQ_URL || "amqp://guest:guest@127.0.0.1:5672/";
const exchange = process.env.EXCHANGE || "orders-fanout";

async function main(orders) {
  if (orders.length === 0) {
    console.error("usage: node publish.js ID:FAIL_TIMES ...   (FAIL_TIMES: a number or always)");
    process.exit(2);
  }
  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel();
  await channel.assertExchange(exchange, "fanout", { durable: true });
  for (const order of orders) {
    const [id, failTimes = "0"] = order.split(":");
    const body = { order: id, fail_times: failTimes === "always" ? "always" : Number(failTimes) };
    channel.publish(exchange, "", Buffer.from(JSON.stringify(body)), {
      messageId: id,
      contentType: "application/json",
      persistent: true,
    });
  }
  await channel.waitForConfirms();
  await connection.close();
}

main(process.argv.slice(2)).catch((error) => {
  console.error(`publish failed: ${error.message}`);
  process.exit(1);
});
