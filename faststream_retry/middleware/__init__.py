"""The FastStream side: the only package that imports FastStream.

``middleware`` is ``RetryMiddleware`` and the scope of one message, ``runtime`` starts and
stops the plugin with the broker, ``wiring`` checks how the app is wired, ``gate`` holds
messages during an outage, ``testing`` is what test mode records, and ``_internals`` is
every private FastStream name the plugin relies on, checked at import.
"""
