"""What the plugin reads of FastStream's NATS subscribers and brokers (FastStream side).

Duck-typed, as ``_internals`` reads RabbitMQ's: nothing here imports ``faststream.nats``
or nats-py, so a RabbitMQ-only install needs neither. A JetStream subscriber has a
``stream`` (FastStream's ``JStream``); a core-NATS one has none.
"""

from __future__ import annotations

from typing import Any

from faststream_retry.nats import naming
from faststream_retry.nats.checks import DEFAULT_ACK_WAIT_S

__all__ = [
    "ack_wait_s",
    "broker_url",
    "consumer_config",
    "durable_of",
    "handlers_of",
    "is_batch",
    "is_nats",
    "is_nats_subscriber",
    "key_of",
    "max_msg_size_of",
    "replicas_of",
    "stream_of",
    "subject_of",
    "under_test_nats",
]


def is_nats(broker: object) -> bool:
    """Whether ``broker`` is FastStream's ``NatsBroker`` (read without importing it)."""
    return any(
        cls.__name__ == "NatsBroker" and cls.__module__.startswith("faststream.nats")
        for cls in type(broker).__mro__
    )


def is_nats_subscriber(sub: object) -> bool:
    """Whether ``sub`` is one of FastStream's NATS subscribers."""
    return type(sub).__module__.startswith("faststream.nats")


def is_batch(sub: object) -> bool:
    """Whether ``sub`` is a batch pull subscriber (``PullSub(batch=True)``): one call per batch."""
    return is_nats_subscriber(sub) and any(
        cls.__name__.startswith("Batch") for cls in type(sub).__mro__
    )


def under_test_nats(broker: Any) -> bool:  # noqa: ANN401 - a NatsBroker
    """Whether ``TestNatsBroker`` is active on ``broker`` (it swaps the producer)."""
    producer = getattr(getattr(broker, "config", None), "producer", None)
    kind = type(producer)
    return kind.__name__ == "FakeProducer" and kind.__module__.startswith("faststream.nats")


def stream_of(sub: Any) -> str | None:  # noqa: ANN401 - a NATS subscriber
    """The stream a JetStream subscriber consumes; ``None``: a core-NATS subscriber."""
    if not is_nats_subscriber(sub):
        return None
    name = getattr(getattr(sub, "stream", None), "name", None)
    return name if isinstance(name, str) and name else None


def subject_of(sub: Any) -> str:  # noqa: ANN401 - a NATS subscriber
    """The subject a NATS subscriber is declared on, router prefix included."""
    subject = getattr(sub, "subject", None)
    address = getattr(subject, "broker_address", None)
    if isinstance(address, str) and address:
        return address
    filters = getattr(sub, "filter_subjects", None) or ()
    return ",".join(str(f) for f in filters) or str(subject or "?")


def consumer_config(sub: Any) -> Any:  # noqa: ANN401 - nats-py's ConsumerConfig
    """The ``ConsumerConfig`` FastStream makes the subscriber's consumer with."""
    return getattr(sub, "config", None)


def durable_of(sub: Any) -> str | None:  # noqa: ANN401 - a NATS subscriber
    """The durable name of a JetStream subscriber's consumer; ``None``: ephemeral.

    A push subscriber's ``queue`` (deliver group) is its durable name when it sets none
    (nats-py names the consumer after it).
    """
    options = getattr(sub, "extra_options", None) or {}
    durable = options.get("durable") if isinstance(options, dict) else None
    if not durable:
        durable = getattr(consumer_config(sub), "durable_name", None)
    if not durable and is_nats_subscriber(sub):
        durable = getattr(sub, "queue", None)
    return durable if isinstance(durable, str) and durable else None


def handlers_of(sub: Any) -> tuple[str, ...]:  # noqa: ANN401 - a NATS subscriber
    """The qualified names (module included) of a subscriber's handlers, as declared."""
    names = []
    for item in getattr(sub, "calls", ()):
        handler = getattr(item, "handler", None)
        function = (
            getattr(handler, "_declared_call", None)
            or getattr(handler, "_original_call", None)
            or handler
        )
        module = getattr(function, "__module__", None)
        name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
        names.append(f"{module}:{name}")
    return tuple(names)


def key_of(sub: Any) -> str | None:  # noqa: ANN401 - a NATS subscriber
    """The key of a JetStream subscriber (``nats.naming``); ``None`` for any other."""
    stream = stream_of(sub)
    if stream is None:
        return None
    durable = durable_of(sub)
    if durable:
        return naming.key_of(stream, durable, "")
    return naming.key_of(stream, None, subject_of(sub), handlers_of(sub))


def ack_wait_s(sub: Any) -> float:  # noqa: ANN401 - a NATS subscriber
    """The ``ack_wait`` of the subscriber's consumer, in seconds."""
    wait = getattr(consumer_config(sub), "ack_wait", None)
    return float(wait) if isinstance(wait, (int, float)) and wait > 0 else DEFAULT_ACK_WAIT_S


def max_msg_size_of(sub: Any) -> int | None:  # noqa: ANN401 - a NATS subscriber
    """The ``max_msg_size`` of the subscriber's stream as its ``JStream`` declares it."""
    size = getattr(getattr(getattr(sub, "stream", None), "config", None), "max_msg_size", None)
    return size if isinstance(size, int) else None


def replicas_of(sub: Any) -> int | None:  # noqa: ANN401 - a NATS subscriber
    """The ``num_replicas`` of the subscriber's stream as its ``JStream`` declares it."""
    replicas = getattr(getattr(getattr(sub, "stream", None), "config", None), "num_replicas", None)
    return replicas if isinstance(replicas, int) and replicas > 0 else None


def broker_url(broker: Any) -> str | None:  # noqa: ANN401 - a NatsBroker
    """The servers a ``NatsBroker`` connects to, comma-separated (``NatsBroker(servers)``)."""
    kwargs = getattr(broker, "_connection_kwargs", None)
    servers = kwargs.get("servers") if isinstance(kwargs, dict) else None
    if isinstance(servers, str):
        servers = [servers]
    if not isinstance(servers, (list, tuple)) or not servers:
        return None
    return ",".join(str(server) for server in servers)
