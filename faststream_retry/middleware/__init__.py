"""The FastStream side: the only package that imports FastStream.

``middleware`` is ``RetryMiddleware`` and the scope of one message, ``delivery`` is a
message resolved once (its runtime, route and handler's policy), ``gate`` finds the
outage gate it passes, ``sink`` is what every sink shares and ``test_mode`` test mode's
sink, ``testing`` is what test mode records, ``plugin`` makes one runtime per broker and
installs it, ``planned`` is what every runtime plans, ``checks`` refuses or warns of how an
app is wired, ``app`` is what the plugin plans for an app the operator command loads,
``schema`` adds each covered queue's ``.dlq`` to the app's AsyncAPI document, and
``_internals`` is every private FastStream name the plugin relies on, checked at install
(``nats_subscribers`` and ``redis_subscribers`` read those brokers' subscribers).

A folder per broker holds its runtime: ``rabbit`` (start, stop, late subscribers, the
live sink), ``nats`` (and test mode under ``TestNatsBroker``), ``redis``.
"""
