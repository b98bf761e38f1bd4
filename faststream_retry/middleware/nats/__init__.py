"""The FastStream side on a ``NatsBroker``.

``runtime`` starts and stops the transport (``faststream_retry.nats``) with the broker,
and ``test_mode`` is test mode's sink under ``TestNatsBroker``. FastStream's JetStream
subscribers are read by ``middleware.nats_subscribers``, which the broker-neutral checks
share.
"""
