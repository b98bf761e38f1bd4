"""The worker command's tracing from the standard OTEL_* environment (no span is sent here).

tests/integration/test_worker_node.py runs the real command into an OTLP receiver.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from faststream_retry.worker.tracing import SERVICE_NAME, tracing_from_environment

if TYPE_CHECKING:
    from faststream_retry.worker.tracing import Tracing

_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def configured(monkeypatch: pytest.MonkeyPatch, **env: str) -> Tracing:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tracing_from_environment()


def exporters(provider: Any) -> list[Any]:
    """The exporters behind the provider's batch processors."""
    processors = provider._active_span_processor._span_processors
    return [p.span_exporter for p in processors]


def service(provider: Any) -> object:
    return provider.resource.attributes.get("service.name")


def shut(tracing: Tracing) -> None:
    if tracing.provider is not None:
        tracing.provider.shutdown()


class TestOff:
    def test_nothing_set_is_no_tracing_and_no_collector_needed(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tracing = configured(monkeypatch)
        assert (tracing.provider, tracing.problem) == (None, False)
        assert "no OTEL_EXPORTER_OTLP_ENDPOINT" in tracing.said

    def test_disabled_or_none_wins_over_an_endpoint(self, monkeypatch: pytest.MonkeyPatch) -> None:
        endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        disabled = configured(monkeypatch, OTEL_SDK_DISABLED=" TRUE ", **endpoint)
        assert (disabled.provider, disabled.said) == (None, "tracing off: OTEL_SDK_DISABLED=true")
        none = configured(monkeypatch, OTEL_SDK_DISABLED="false", OTEL_TRACES_EXPORTER="None")
        assert (none.provider, none.said) == (None, "tracing off: OTEL_TRACES_EXPORTER=none")

    def test_a_provider_set_already_gets_the_spans(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Under opentelemetry-instrument the global provider is the one to use."""
        monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
        tracing = configured(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
        assert tracing.provider is None
        assert tracing.said == "tracing to the tracer provider set already"


class TestOn:
    def test_an_endpoint_means_otlp_over_http_as_the_worker_s_service(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tracing = configured(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318/")
        try:
            assert tracing.provider is not None
            assert tracing.problem is False
            (exporter,) = exporters(tracing.provider)
            assert isinstance(exporter, OTLPSpanExporter)
            assert service(tracing.provider) == SERVICE_NAME
            assert tracing.said == (
                f"tracing to OTLP/HTTP http://collector:4318/v1/traces as service {SERVICE_NAME!r}"
            )
        finally:
            shut(tracing)

    def test_the_service_name_and_the_traces_endpoint_are_the_environment_s(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        named = configured(
            monkeypatch,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://collector:4318/custom",
            OTEL_SERVICE_NAME="retry-worker",
        )
        try:
            assert named.provider is not None
            assert service(named.provider) == "retry-worker"
            assert "OTLP/HTTP http://collector:4318/custom as service 'retry-worker'" in named.said
        finally:
            shut(named)
        monkeypatch.delenv("OTEL_SERVICE_NAME")
        by_attributes = configured(
            monkeypatch, OTEL_RESOURCE_ATTRIBUTES="service.name=billing-retries,team=payments"
        )
        try:
            assert by_attributes.provider is not None
            assert service(by_attributes.provider) == "billing-retries"
        finally:
            shut(by_attributes)

    def test_the_exporters_otel_traces_exporter_names(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tracing = configured(monkeypatch, OTEL_TRACES_EXPORTER="console, otlp")
        try:
            assert tracing.provider is not None
            kinds = [type(e) for e in exporters(tracing.provider)]
            assert kinds == [ConsoleSpanExporter, OTLPSpanExporter]
            assert tracing.said.startswith(
                "tracing to the console, OTLP/HTTP http://localhost:4318/v1/traces"
            )
        finally:
            shut(tracing)


class TestProblems:
    """An environment asking for what cannot be sent: said (a WARNING), and no tracing."""

    @pytest.mark.parametrize(
        ("env", "said"),
        [
            ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin' is not one"),
            (
                {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
                },
                "OTLP protocol 'http/json' is not supported here",
            ),
            (
                {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
                "pip install opentelemetry-exporter-otlp-proto-grpc",
            ),
        ],
    )
    def test_each_names_the_fix(
        self, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
    ) -> None:
        monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
        tracing = configured(monkeypatch, **env)
        assert (tracing.provider, tracing.problem) == (None, True)
        assert said in tracing.said

    def test_no_sdk_names_the_extra(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
        tracing = configured(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318")
        assert (tracing.provider, tracing.problem) == (None, True)
        assert tracing.said.endswith("pip install 'faststream-retry[otel]'")

    def test_no_otlp_exporter_names_the_extra(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(
            sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None
        )
        tracing = configured(monkeypatch, OTEL_TRACES_EXPORTER="otlp")
        assert (tracing.provider, tracing.problem) == (None, True)
        assert "no OTLP exporter: pip install 'faststream-retry[otel]'" in tracing.said
