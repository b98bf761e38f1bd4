"""The AMQP side, on aio-pika: what a standalone retry worker reuses.

No module here imports FastStream. ``channels`` keeps the plugin's two channels open,
``declare`` checks and declares a ``topology.Plan``, ``publisher`` publishes confirmed
copies and ``recheck`` runs the re-check consumers.
"""
