"""What the start refuses on Redis: a pub/sub channel and a list, retries on."""

import os

from faststream.redis import ListSub, RedisBroker, StreamSub

from faststream_retry import RetryMiddleware, retry_policy

retry = RetryMiddleware()
broker = RedisBroker(os.environ.get("REDIS_URL", "redis://localhost:6379"))
retry.install(broker)  # the refusal comes from broker.start()


# Refused: a pub/sub channel keeps nothing once it is delivered.
@broker.subscriber(channel="audit")
async def audit(event: dict[str, str]) -> None: ...


# Refused: a list entry is gone once popped.
@broker.subscriber(list=ListSub("emails"))
async def email(job: dict[str, str]) -> None: ...


# Fine: retries off, FastStream's own handling.
@broker.subscriber(channel="metrics")
@retry_policy(enabled=False)
async def metrics(sample: dict[str, str]) -> None: ...


# The fix for both: a stream read in a consumer group.
@broker.subscriber(stream=StreamSub("emails", group="mailer", consumer="m-1"))
async def email_from_stream(job: dict[str, str]) -> None: ...
