"""The standalone retry worker: retries for consumers in any language.

``worker`` runs it and ``consumer`` consumes the intake. It imports the core, the
reporting, ``amqp`` and ``engine``, never FastStream, ``middleware`` or ``ops``.
"""
