"""The AMQP side, on aio-pika: channels, deadlines, acks, publishing, declaring, the registry.

No module here imports FastStream. ``channels`` keeps two channels open, ``declare``
checks and declares a ``core.topology.Plan``, ``publisher`` publishes confirmed copies and
``registry`` records and reads which queues use the plugin.
"""
