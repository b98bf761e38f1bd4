"""The FastStream side on a ``RedisBroker``: ``runtime`` starts and stops the transport.

``test_mode`` is test mode's sink under ``TestRedisBroker``.

The transport is ``faststream_retry.redis``; FastStream's Redis subscribers are read by
``middleware.redis_subscribers`` (no redis-py), which the broker-neutral checks share.
"""
