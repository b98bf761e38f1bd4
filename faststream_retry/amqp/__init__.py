"""The AMQP side, on aio-pika: channels, deadlines, acks, publishing, checking, declaring.

No module here imports FastStream. ``channels`` keeps two channels open, ``checks``
compares a ``core.topology.Plan`` with the broker before anything is declared,
``declare`` declares it, ``publisher`` publishes confirmed copies, ``registry`` records
and reads which queues use the plugin, and ``probe`` looks at a queue without changing it.
"""
