"""A broker's runtime: one per broker, whatever order the brokers are asked for in.

``Plugin.runtime`` answers the broker asked for last without its table (every message
asks it); these pin that the shortcut never hands a broker another's runtime.
"""

from __future__ import annotations

from faststream.nats import NatsBroker
from faststream.rabbit import RabbitBroker
from faststream.redis import RedisBroker

from faststream_retry import RetryMiddleware
from faststream_retry.middleware.nats.runtime import NatsRuntime
from faststream_retry.middleware.rabbit.runtime import Runtime
from faststream_retry.middleware.redis.runtime import RedisRuntime


def test_each_broker_gets_its_own_runtime_in_any_order() -> None:
    retry = RetryMiddleware()
    nats, rabbit, redis, other_nats = NatsBroker(), RabbitBroker(), RedisBroker(), NatsBroker()
    first = {b: retry.runtime(b) for b in (nats, rabbit, redis, other_nats)}
    assert isinstance(first[nats], NatsRuntime)
    assert isinstance(first[rabbit], Runtime)
    assert isinstance(first[redis], RedisRuntime)
    assert first[other_nats] is not first[nats]
    for broker in (nats, nats, other_nats, nats, redis, rabbit, rabbit, other_nats):
        runtime = retry.runtime(broker)
        assert runtime is first[broker]
        assert runtime.broker is broker


def test_two_middlewares_on_one_broker_keep_their_own_runtimes() -> None:
    one, two = RetryMiddleware(), RetryMiddleware()
    broker = NatsBroker()
    mine, theirs = one.runtime(broker), two.runtime(broker)
    assert mine is not theirs
    assert one.runtime(broker) is mine
    assert two.runtime(broker) is theirs
