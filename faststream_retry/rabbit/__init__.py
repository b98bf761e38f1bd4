"""The RabbitMQ transport, on aio-pika: what the middleware's runtime and the worker run.

No module here imports FastStream (the FastStream side is ``middleware.rabbit``).
The AMQP parts: ``channels`` keeps two channels open, ``checks`` compares a
``core.topology.Plan`` with the broker before anything is declared, ``declare`` declares
it, ``publisher`` publishes confirmed copies, ``acks`` and ``deadlines`` settle and time
deliveries, ``arguments`` reads queue arguments, ``registry`` records and reads which
queues use the plugin, and ``probe`` looks at a queue without changing it.
What runs on them: ``live`` holds a started runtime's channels, publisher and re-check
consumers, ``recheck`` re-checks a copy a delay tier hands back, ``consumer`` is the
skeleton of the re-check and intake consumers (their consumers, deliveries in flight,
settling, stopping), ``step`` publishes one step's copy, ``requeues`` counts the requeues
of copies this process could not confirm, and ``dlq_depths`` samples the dead-letter queues' depths.
"""
