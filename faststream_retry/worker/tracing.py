"""The worker command's tracing, configured by the standard OpenTelemetry environment.

A team that runs ``faststream-retry worker`` writes no Python, so the command sets up
what an instrumented service's SDK would: a ``TracerProvider`` whose resource comes from
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (``faststream-retry-worker`` when
neither names the service), and a ``BatchSpanProcessor`` around the exporter
``OTEL_TRACES_EXPORTER`` names: ``otlp`` (OTLP over HTTP, or gRPC when
``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` says so and its exporter is installed), or
``console``. The exporter reads the rest itself (``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``..._HEADERS``, ``..._TIMEOUT``), the provider the sampler (``OTEL_TRACES_SAMPLER``), the
processor its batch settings (``OTEL_BSP_*``), and ``OTEL_PROPAGATORS`` the propagators.

Tracing is on when the environment asks for it: an OTLP endpoint or an exporter is set.
With none, nothing is exported and no collector is needed (an SDK would otherwise send to
``localhost:4318`` and log a failure every few seconds). ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off, and so does a tracer provider set already
(``opentelemetry-instrument faststream-retry worker``): the worker's spans go to that one.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import ProxyTracerProvider

if TYPE_CHECKING:
    from collections.abc import Mapping

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["SERVICE_NAME", "Tracing", "tracing_from_environment"]

SERVICE_NAME = "faststream-retry-worker"
"""The service name when ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` give none."""

_ASKING = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
"""Any of these set: the environment asks for traces."""

_EXTRA = "pip install 'faststream-retry[otel]'"


@dataclass(frozen=True, slots=True)
class Tracing:
    """What the environment configured: the provider (``None``: no tracing) and why."""

    provider: TracerProvider | None
    said: str
    """One line for the log: where spans go, or why none are exported."""
    problem: bool = False
    """The environment asks for traces that cannot be sent (said is a WARNING then)."""


def tracing_from_environment() -> Tracing:
    """Return the tracer provider the standard ``OTEL_*`` variables configure (module docstring).

    Never raises: an exporter that cannot be made is a ``problem`` to log, and the
    worker retries without traces. The SDK reads the process's environment itself.
    """
    env = os.environ
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    off = _off(env, names)
    if off is not None:
        return Tracing(None, off)
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - an extra
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError:
        said = f"the environment asks for traces, but there is no SDK: {_EXTRA}"
        return Tracing(None, said, problem=True)
    exporters: list[tuple[str, SpanExporter]] = []
    for name in names or ["otlp"]:
        made = _exporter(name, env)
        if isinstance(made, str):
            return Tracing(None, made, problem=True)
        exporters.append(made)
    resource = Resource.create()
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for _, exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    service = resource.attributes.get("service.name")
    where = ", ".join(where for where, _ in exporters)
    return Tracing(provider, f"tracing to {where} as service {service!r}")


def _off(env: Mapping[str, str], names: list[str]) -> str | None:
    """Return why the environment leaves tracing off, or ``None`` when it asks for it."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "tracing off: OTEL_SDK_DISABLED=true"
    if "none" in names:
        return "tracing off: OTEL_TRACES_EXPORTER=none"
    if not any(env.get(key, "").strip() for key in _ASKING):
        return "tracing off: no OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER"
    if not isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        return "tracing to the tracer provider set already"
    return None


def _exporter(name: str, env: Mapping[str, str]) -> tuple[str, SpanExporter] | str:
    """Return where the exporter ``name`` sends and the exporter, or why there is none."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

        return "the console", ConsoleSpanExporter()
    if name != "otlp":
        return f"OTEL_TRACES_EXPORTER={name!r} is not one the worker knows: otlp, console or none"
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        return _grpc(env)
    if protocol != "http/protobuf":
        return f"OTLP protocol {protocol!r} is not supported here: http/protobuf or grpc"
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
    except ImportError:
        return f"the environment asks for OTLP traces, but there is no OTLP exporter: {_EXTRA}"
    # Where the exporter sends, as it reads it: the traces endpoint as given, or the
    # base endpoint with the signal's path.
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318").rstrip("/")
    where = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{base}/v1/traces"
    return f"OTLP/HTTP {where}", OTLPSpanExporter()


def _grpc(env: Mapping[str, str]) -> tuple[str, SpanExporter] | str:
    # Not a dependency of any extra (grpcio is large): used when installed.
    try:
        module = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    except ImportError:
        return (
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs its exporter: pip install "
            "opentelemetry-exporter-otlp-proto-grpc (or use http/protobuf, the default)"
        )
    where = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"
    )
    exporter: SpanExporter = module.OTLPSpanExporter()
    return f"OTLP/gRPC {where}", exporter
