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
