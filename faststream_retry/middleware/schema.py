"""The AsyncAPI document of an app with the plugin: each covered queue's dead letters, and headers.

``faststream docs gen`` (and ``docs serve``, an ``AsgiFastStream``'s ``/asyncapi``) asks the
app's specification factory (``FastStream(specification=...)``, kept as ``app.schema``)
for the document, and never starts the broker. The plugin declares its queues only at the
broker's start or first message, and FastStream 0.7 calls no middleware while it writes the
document, so nothing there shows where a failed message goes. Its message schema cannot
carry headers either: ``Message.headers`` is a TODO upstream.

``RetryMiddleware.asyncapi()`` therefore wraps the app's factory (``SpecificationFactory``,
the public protocol ``specification=`` takes): it writes the document as before, then, for
each broker the middleware is on, adds per queue the plugin covers what FastStream itself
writes for a publisher to where its dead letters go (generated on a throwaway broker of the
same kind that never connects, in the document's own AsyncAPI version), on the work queue's
servers, with the work queue's payload and the ``retry-*`` headers (``header_schema``). Where
they go is the broker's: RabbitMQ, the queue ``<queue>.dlq``; NATS, the subject
``<prefix>.dlq.<stream>.<durable>`` in the stream ``<prefix>-dlq-<stream>``; Redis, the stream
``{<stream>}.dlq`` (``XADD``). Covered means what the
plugin plans at start: every subscriber of the broker whose handlers have retries on,
router prefix included; one left out of the document (``include_in_schema=False``) has its
``.dlq`` left out too. The edit is made on the JSON form of the document (the AsyncAPI
format, not FastStream's classes), which FastStream's own model reads back, as ``docs
serve asyncapi.json`` does.

Why not a publisher per ``.dlq`` on the real broker (``broker.publisher(...)``)? Under
``TestRabbitBroker`` every publisher with no subscriber gets a fake one, and test mode
sends a dead letter to the app's ``<queue>.dlq`` subscriber when there is one: a line for
the document would change what a test sees. It could not say the headers either, and the
subscribers it would follow may be declared, or opted out, after it.

FastStream names read here, none private: ``broker.subscribers``, ``broker.middlewares``,
``subscriber.schema()`` and ``subscriber.specification.include_in_schema`` (what FastStream's
own generator reads), ``AsyncAPI.brokers``, ``clear_key`` (how the generator turns a
subscriber's schema name into its channel's key).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.specification import AsyncAPI
from faststream.specification.asyncapi.utils import clear_key
from pydantic import BaseModel

from faststream_retry.core.topology import plan
from faststream_retry.middleware import _internals, nats_subscribers, redis_subscribers
from faststream_retry.middleware.header_schema import (
    HEADERS_SCHEMA_NAME,
    dead_letter_headers_schema,
)
from faststream_retry.nats import naming as nats_naming
from faststream_retry.redis.keys import stream_keys

if TYPE_CHECKING:
    from collections.abc import Iterable

    from faststream._internal.broker import BrokerUsecase
    from faststream.asgi.handlers import HttpHandler
    from faststream.specification.base import Specification, SpecificationFactory
    from faststream.specification.schema import Contact, License

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Route

__all__ = ["RetrySpecification", "with_dead_letters"]

_MESSAGES_REF = "#/components/messages/"


class RetrySpecification:
    """An app's specification factory, whose document also shows each covered queue's ``.dlq``.

    A ``SpecificationFactory``: pass it as ``FastStream(broker, specification=...)``. The
    attributes FastStream and the user set on a factory (``title``, ...) are the wrapped
    one's.
    """

    def __init__(
        self, inner: SpecificationFactory, config: RetryConfig, middleware: object
    ) -> None:
        """Wrap ``inner`` for the brokers ``middleware`` (with ``config``) is on."""
        self._inner = inner
        self._config = config
        self._middleware = middleware
        self._brokers: list[BrokerUsecase[Any, Any, Any]] = []

    @property
    def title(self) -> str:
        """Return the wrapped factory's title."""
        return self._inner.title

    @title.setter
    def title(self, value: str) -> None:
        self._inner.title = value

    @property
    def description(self) -> str | None:
        """Return the wrapped factory's description."""
        return self._inner.description

    @description.setter
    def description(self, value: str | None) -> None:
        self._inner.description = value

    @property
    def version(self) -> str | None:
        """Return the wrapped factory's version."""
        return self._inner.version

    @version.setter
    def version(self, value: str | None) -> None:
        self._inner.version = value

    @property
    def contact(self) -> Contact | dict[str, Any] | None:
        """Return the wrapped factory's contact."""
        return self._inner.contact

    @contact.setter
    def contact(self, value: Contact | dict[str, Any] | None) -> None:
        self._inner.contact = value

    @property
    def license(self) -> License | dict[str, Any] | None:
        """Return the wrapped factory's license."""
        return self._inner.license

    @license.setter  # noqa: A003 - the name SpecificationFactory gives it
    def license(self, value: License | dict[str, Any] | None) -> None:
        self._inner.license = value

    def add_broker(self, broker: BrokerUsecase[Any, Any, Any], /) -> SpecificationFactory:
        """Document ``broker`` too (``FastStream`` calls it with its brokers)."""
        self._inner.add_broker(broker)
        if broker not in self._brokers:
            self._brokers.append(broker)
        return self

    def add_http_route(self, path: str, handler: HttpHandler) -> SpecificationFactory:
        """Document an HTTP route of an ``AsgiFastStream`` (the wrapped factory does)."""
        self._inner.add_http_route(path, handler)
        return self

    def to_specification(self) -> Specification:
        """Return the wrapped factory's document, with each covered queue's ``.dlq``."""
        # AsyncAPI(broker) takes its brokers in its constructor, not through add_broker.
        brokers = list(dict.fromkeys([*getattr(self._inner, "brokers", ()), *self._brokers]))
        return with_dead_letters(
            self._inner.to_specification(), brokers, self._config, self._middleware
        )


def with_dead_letters(
    spec: Specification,
    brokers: Iterable[object],
    config: RetryConfig,
    middleware: object,
) -> Specification:
    """Return ``spec`` with the ``.dlq`` of each queue ``middleware`` covers on ``brokers``.

    ``spec`` itself if it is not an AsyncAPI 3.0 or 2.6 document FastStream made (another
    factory's), or nothing is covered.
    """
    if not isinstance(spec, BaseModel):
        return spec
    document = spec.to_jsonable()
    version = str(document.get("asyncapi", ""))
    if not version.startswith(("3.", "2.6.")):
        return spec
    added = False
    for broker in brokers:
        if not _is_covered(broker) or not _is_on(broker, middleware):
            continue
        routes = plan(_internals.routes_of(broker), config.default, config.topology).routes  # type: ignore[arg-type]
        for route in routes.values():
            dead_letters = _publisher_document(broker, route, version, config.topology.prefix)
            added = _add_dead_letter_channel(document, broker, route, dead_letters) or added
    if not added:
        return spec
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas[HEADERS_SCHEMA_NAME] = dead_letter_headers_schema()
    return type(spec).model_validate(document)


def _is_covered(broker: object) -> bool:
    """Whether ``broker`` is of a kind the plugin runs on (RabbitMQ, NATS, Redis)."""
    return (
        isinstance(broker, RabbitBroker)
        or nats_subscribers.is_nats(broker)
        or redis_subscribers.is_redis(broker)
    )


def _is_on(broker: Any, middleware: object) -> bool:  # noqa: ANN401 - a covered broker
    """Whether ``middleware`` runs on ``broker``: on it, or on a router of one of its subscribers.

    Either way the plugin covers every subscriber of the broker once it starts (it adds
    itself to the broker's middlewares).
    """
    return middleware in broker.middlewares or any(
        middleware in _internals.middlewares_of(sub) for sub in broker.subscribers
    )


def _add_dead_letter_channel(
    document: dict[str, Any],
    broker: Any,  # noqa: ANN401 - a covered broker
    route: Route,
    dead_letters: dict[str, Any],
) -> bool:
    """Add ``route``'s dead-letter channel to ``document``; ``False`` if its queue is not in it.

    ``dead_letters`` is FastStream's document of the dead letters' publisher, alone.
    """
    channels: dict[str, Any] = document.setdefault("channels", {})
    work = _work_channel(channels, broker, route.queue)
    if work is None:
        return False
    message = _message_of(document, work)
    payload = copy.deepcopy(message.get("payload", {})) if message is not None else {}
    for key, channel in dead_letters.get("channels", {}).items():
        # On the work queue's broker: its servers, its virtual host.
        if "servers" in work:
            channel["servers"] = copy.deepcopy(work["servers"])
        else:
            channel.pop("servers", None)
        _set_vhost(channel, _vhost(work))
        channels.setdefault(key, channel)
    for key, operation in dead_letters.get("operations", {}).items():
        document.setdefault("operations", {}).setdefault(key, operation)
    messages = document.setdefault("components", {}).setdefault("messages", {})
    for key, dead_letter in dead_letters.get("components", {}).get("messages", {}).items():
        # A dead letter is the failed message: its body, with the plugin's headers added.
        dead_letter["payload"] = payload
        dead_letter["headers"] = {"$ref": f"#/components/schemas/{HEADERS_SCHEMA_NAME}"}
        messages.setdefault(key, dead_letter)
    return True


def _work_channel(channels: dict[str, Any], broker: Any, queue: str) -> Any:  # noqa: ANN401 - a channel of the JSON document
    """Return the document's channel of a subscriber of ``queue``; ``None`` if none is shown."""
    for sub in broker.subscribers:
        if _internals.queue_of(sub) != queue or not sub.specification.include_in_schema:
            continue
        for name in sub.schema():
            channel = channels.get(clear_key(name))
            if isinstance(channel, dict):
                return channel
    return None


_WHY = (
    "faststream-retry publishes here each message whose failure was permanent or whose "
    "retries ran out, with its body and headers and the retry-* headers that say why."
)


def _publisher_document(
    app_broker: object, route: Route, version: str, prefix: str
) -> dict[str, Any]:
    """Return the document FastStream writes for a publisher of ``route``'s dead letters, alone.

    On a broker of its own, of ``app_broker``'s kind, that never connects, so the app's
    broker gets no publisher: see the module's docstring. As the plugin publishes them:
    RabbitMQ, persistent and mandatory to ``<queue>.dlq``; NATS, to the subscriber's
    dead-letter subject; Redis, ``XADD`` to the stream's ``.dlq``.
    """
    broker: Any
    if nats_subscribers.is_nats(app_broker):
        from faststream.nats import NatsBroker  # noqa: PLC0415 - nats-py, with a NatsBroker only

        subject = nats_naming.dlq_subject(prefix, route.queue)
        stream = nats_naming.dlq_stream(prefix, nats_naming.key_stream(route.queue))
        broker = NatsBroker()
        broker.publisher(
            subject,
            title=f"{subject}:_:DeadLetter",
            description=f"Dead letters of {route.queue}, kept in the stream {stream}: {_WHY}",
        )
    elif redis_subscribers.is_redis(app_broker):
        from faststream.redis import RedisBroker  # noqa: PLC0415 - redis-py, with a RedisBroker only

        dlq = stream_keys(route.queue).dlq
        broker = RedisBroker()
        broker.publisher(
            stream=dlq,
            title=f"{dlq}:_:DeadLetter",
            description=f"Dead letters of the stream {route.queue}: {_WHY}",
        )
    else:
        broker = RabbitBroker()
        broker.publisher(
            RabbitQueue(route.dlq, durable=True),
            title=f"{route.dlq}:_:DeadLetter",
            description=f"Dead letters of {route.queue}: {_WHY}",
            persist=True,
            mandatory=True,
        )
    document: dict[str, Any] = (
        AsyncAPI(broker, schema_version=version).to_specification().to_jsonable()
    )
    return document


def _vhost(channel: dict[str, Any]) -> str | None:
    """Return the virtual host a channel's AMQP binding names, as the document writes it."""
    amqp = channel.get("bindings", {}).get("amqp", {})
    for part in ("queue", "exchange"):
        vhost = amqp.get(part, {}).get("vhost")
        if isinstance(vhost, str):
            return vhost
    return None


def _set_vhost(channel: dict[str, Any], vhost: str | None) -> None:
    # Copied as written: FastStream writes a broker's URL path there ("/tenant").
    if vhost is None:
        return
    amqp = channel.get("bindings", {}).get("amqp", {})
    for part in ("queue", "exchange"):
        binding = amqp.get(part)
        if isinstance(binding, dict) and "vhost" in binding:
            binding["vhost"] = vhost


def _message_of(document: dict[str, Any], channel: dict[str, Any]) -> dict[str, Any] | None:
    """Return the message a channel refers to among the document's components."""
    messages = document.get("components", {}).get("messages", {})
    for ref in _refs(channel):
        if ref.startswith(_MESSAGES_REF):
            # A URI fragment: FastStream percent-encodes a Redis hash tag's braces there.
            name = unquote(ref.removeprefix(_MESSAGES_REF)).replace("~1", "/").replace("~0", "~")
            message = messages.get(name)
            if isinstance(message, dict):
                return message
    return None


def _refs(node: object) -> Iterable[str]:
    """Yield every ``$ref`` under ``node``, in document order."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)
