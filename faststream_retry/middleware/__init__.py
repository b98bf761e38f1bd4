"""The FastStream side: the only package that imports FastStream.

``middleware`` is ``RetryMiddleware`` and the scope of one message, ``runtime`` starts and
stops the plugin with the broker and follows subscribers that join late, ``checks``
refuses or warns of how an app is wired, ``gate`` finds the outage gate a message
passes, ``testing`` is what test mode records, ``app`` is what the plugin plans for an
app the operator command loads, and ``_internals`` is every private FastStream name the
plugin relies on, checked at install.
"""
