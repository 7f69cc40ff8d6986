"""Per-request metrics: bound label children count into the same series as labels() would."""

from __future__ import annotations

from webhook.policy.decision import Finding
from webhook.server.metrics import Metrics


def test_repeated_requests_add_up_in_one_series_and_labels_stay_bounded() -> None:
    metrics = Metrics()
    kinds = frozenset({"Pod"})
    for _ in range(3):
        metrics.count_request("/mutate", "Pod", "CREATE", "patch", kinds)
    metrics.count_request("/mutate", "Secret", "PATCH", "allow", kinds)
    metrics.count_request("/nope", "", "", "error", kinds)
    text = metrics.render().decode()
    assert 'gpu_admission_requests_total{decision="patch",endpoint="/mutate",kind="Pod",operation="CREATE"} 3.0' in text
    assert 'gpu_admission_requests_total{decision="allow",endpoint="/mutate",kind="other",operation="other"} 1.0' in text
    assert 'gpu_admission_requests_total{decision="error",endpoint="other",kind="",operation=""} 1.0' in text


def test_latency_and_findings_are_counted_per_label_set() -> None:
    metrics = Metrics()
    for seconds in (0.0004, 0.002, 0.002):
        metrics.observe_latency("/validate", seconds)
    metrics.count_findings([Finding("p", "quota", "enforce", "x"), Finding("p", "quota", "enforce", "y")])
    metrics.count_findings([Finding("p", "shm", "audit", "z")])
    text = metrics.render().decode()
    assert 'gpu_admission_request_duration_seconds_bucket{endpoint="/validate",le="0.0005"} 1.0' in text
    assert 'gpu_admission_request_duration_seconds_bucket{endpoint="/validate",le="0.0025"} 3.0' in text
    assert 'gpu_admission_request_duration_seconds_count{endpoint="/validate"} 3.0' in text
    assert 'gpu_admission_findings_total{mode="enforce",policy="p",rule="quota"} 2.0' in text
    assert 'gpu_admission_findings_total{mode="audit",policy="p",rule="shm"} 1.0' in text


def test_the_lock_free_request_series_expose_what_prometheus_clients_own_types_do() -> None:
    """Requests and latency are counted in plain dicts (AnsweredSeries); a scrape must read as
    prometheus_client's Counter and Histogram would: names, labels, buckets (le inclusive), sums."""
    import re

    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from webhook.server.metrics import _LATENCY_BUCKETS

    registry = CollectorRegistry()
    counter = Counter("gpu_admission_requests", "Admission requests answered.",
                      ["endpoint", "kind", "operation", "decision"], registry=registry)
    histogram = Histogram("gpu_admission_request_duration_seconds", "Time to answer an admission request.",
                          ["endpoint"], buckets=_LATENCY_BUCKETS, registry=registry)
    metrics = Metrics()
    for endpoint, seconds in (("/validate", 0.0004), ("/validate", 0.0005), ("/mutate", 0.002), ("/validate", 7.0),
                              ("/validate", 0.3), ("/mutate", 0.0025)):
        histogram.labels(endpoint).observe(seconds)
        metrics.observe_latency(endpoint, seconds)
    for labels in (("/mutate", "Pod", "CREATE", "patch"),) * 3 + (("/validate", "Pod", "UPDATE", "deny"),):
        counter.labels(*labels).inc()
        metrics.count_request(*labels, frozenset({"Pod"}))

    def lines(text: bytes) -> set[str]:  # creation times differ
        return {re.sub(r"(_created(\{.*\})?) \S+$", r"\1 T", line) for line in text.decode().splitlines()}

    assert lines(generate_latest(registry)) <= lines(metrics.render())
    assert 'gpu_admission_request_duration_seconds_bucket{endpoint="/validate",le="+Inf"} 4.0' in metrics.render().decode()
