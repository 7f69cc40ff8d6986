"""Prometheus metrics of one server instance, on its own registry (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """Every metric the server exports; ``render`` is the /metrics body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpu_admission_requests", "Admission requests answered.",
            ["endpoint", "kind", "operation", "decision"], registry=r,
        )
        self.latency = Histogram(
            "gpu_admission_request_duration_seconds", "Time to answer an admission request.",
            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.findings = Counter(
            "gpu_admission_findings", "Rule findings by policy, rule and mode (audit mode shows here).",
            ["policy", "rule", "mode"], registry=r,
        )
        self.reloads = Counter(
            "gpu_admission_policy_reloads", "Policy directory reloads by result.", ["result"], registry=r,
        )
        self.policies_loaded = Gauge(
            "gpu_admission_policies_loaded", "GPUPolicy documents in force.", registry=r,
        )
        self.cert_not_after = Gauge(
            "gpu_admission_certificate_not_after_seconds", "Expiry of the certificates in use (unix time).",
            ["cert"], registry=r,
        )
        self.tls_reloads = Counter(
            "gpu_admission_certificate_reloads", "Serving certificate reloads by result.", ["result"], registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
