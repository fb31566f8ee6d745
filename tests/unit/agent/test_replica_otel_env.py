"""OpenTelemetry's settings reach replicas from their agent's environment (so that their spans go where the control
plane's go), but not the agent's service name: a replica names its own."""

from __future__ import annotations

from ember_runtime.agent.sandbox import environment

AGENT_ENV = {"PATH": "/usr/bin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
             "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20collector-key", "OTEL_BSP_SCHEDULE_DELAY": "500",
             "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1",
             "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod", "OTEL_SERVICE_NAME": "ember-agent",
             "OTELX_NOT_OURS": "x", "EMBER_TOKEN": "nope"}


def test_the_otel_variables_reach_a_replica_except_the_service_name() -> None:
    for sandboxed in (True, False):
        env = environment({"EMBER_DEVICE": "cpu"}, AGENT_ENV, sandboxed=sandboxed)
        assert {k: v for k, v in env.items() if k.startswith("OTEL")} == {
            k: v for k, v in AGENT_ENV.items() if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME"}
        assert "EMBER_TOKEN" not in env

