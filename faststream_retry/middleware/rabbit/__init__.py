"""The FastStream side on a ``RabbitBroker``: ``runtime`` (start, stop, late joiners), ``sink``."""
