"""The standalone retry worker: retries for consumers in any language.

``worker`` runs it, ``consumer`` consumes the intake, and ``declare`` declares and checks
the intake's exchange and queues. It imports the core, the reporting, ``amqp`` and
``engine``, never FastStream, ``middleware`` or ``ops``.
"""
