"""The FastStream side: the only package that imports FastStream.

``middleware`` is ``RetryMiddleware`` and the scope of one message, ``delivery`` is a
message resolved once (its runtime, route and handler's policy), ``gate`` finds the
outage gate it passes, ``sink`` carries a decision out on a running broker and
``test_mode`` under ``TestRabbitBroker``, ``testing`` is what test mode records,
``runtime`` starts and stops the plugin with the broker, follows subscribers that join
late and chooses the sink, ``checks`` refuses or warns of how an app is wired, ``app``
is what the plugin plans for an app the operator command loads, ``schema`` adds each
covered queue's ``.dlq`` to the app's AsyncAPI document, and ``_internals`` is
every private FastStream name the plugin relies on, checked at install.
"""
