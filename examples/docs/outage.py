"""Outage mode: after 20 transient failures in a row, the queue holds on."""

from faststream.rabbit import Channel, RabbitBroker

from faststream_retry import RetryMiddleware, RetryPolicy

retry = RetryMiddleware(default=RetryPolicy(max_attempts=5), outage_after=20)
broker = RabbitBroker(
    "amqp://guest:guest@localhost:5672/",
    default_channel=Channel(
        prefetch_count=100
    ),  # what outage mode may hold: see below
    middlewares=[retry],
)
retry.install(broker)
