"""What is told of each retry: the reporter, and the logs, spans and metrics it drives.

``reporter`` is the one path every event takes and keeps reporting from deciding a
message's fate; ``spans``, ``metrics`` and ``lines`` each say, in one table keyed by
``EventKind``, what an event's span carries, what it counts and what its log line says;
``telemetry`` holds OpenTelemetry's tracer and instruments; ``depths`` says when the
dead-letter gauge is sampled (each transport says how); ``log`` is the plugin's logger,
which every layer above writes through. A span's broker (``messaging.system``) is data
the runtime passes (``Reporter.on``).

Imports the core and OpenTelemetry's API, nothing of a broker.
"""
