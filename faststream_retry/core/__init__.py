"""The pure core: every rule of a retry, with no broker, no FastStream and no telemetry.

What a failure is (``classify``), how long it waits (``policy``, ``tiers``), what becomes
of it (``decision``, ``intake``, ``outage``), where its copy goes and what is told of it
(``steps``), what the copy carries (``headers``, ``fit``), every name on the broker
(``topology``), what an operator is told when the broker refuses it (``advice``,
``versions``), the options (``config``, ``worker_config``), their defaults
(``defaults``) and how a duration is written (``durations``). Each module here is
mutation-tested (``scripts/mutation``) and imports only the standard library, pydantic
and this folder; the import contract in ``pyproject.toml`` holds it to that.
"""
