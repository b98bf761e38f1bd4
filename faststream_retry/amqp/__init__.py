"""The AMQP side, on aio-pika and no FastStream: what a standalone retry worker reuses.

``channels`` keeps the plugin's two channels open, ``declare`` checks and declares a
``topology.Plan``, ``publisher`` publishes confirmed copies and ``recheck`` runs the
re-check consumers.
"""
