"""Prometheus metrics of one server instance, on its own registry (no globals).

The two series every admission touches (requests answered, and their
latency) are counted in plain dicts and lists and turned into metric
families only when scraped (``AnsweredSeries``): prometheus_client's own
counter and histogram take a lock per increment and walk the buckets in
Python, together ~1.3 µs of each request; these cost ~0.4 µs. Admissions are
counted on the event loop's thread only (a review evaluated in a worker
thread is counted once its answer is back on the loop), and /metrics is
rendered there too, so no lock is needed. The rarer series are counted
through label children bound once per label set and kept: ``labels()``
joins, checks and hashes its values under the metric's lock on every call,
several times the cost of the increment itself.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from webhook.policy.decision import Finding

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: the label value of anything outside the known set: labels come from
#: requests, and each new value is a new time series (and a lone surrogate
#: in one would make every later scrape fail to encode)
OTHER = "other"
ENDPOINTS = frozenset({"/mutate", "/validate"})
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT", ""})
#: why a request or connection was refused before (or instead of) its evaluation (docs/robustness.md)
REJECT_REASONS = frozenset({
    "header-timeout", "connection-cap", "body-timeout", "too-large", "too-many-objects", "encoding", "framing",
    "limit", "deadline", "client-name",
})

_Key = TypeVar("_Key", bound=tuple[str, ...])

#: (a tuple of any length to the compiled core: one of 13 floats would be 13 unboxed doubles, boxed into a
#: new tuple of floats for every call of bisect that reads it)
_LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_REQUEST_LABELS = ("endpoint", "kind", "operation", "decision")


class AnsweredSeries:
    """``gpu_admission_requests_total`` and ``gpu_admission_request_duration_seconds``, counted
    without locks (event loop thread only) and exposed as prometheus_client's Counter and
    Histogram expose them: the same names, labels, buckets and ``_created`` samples."""

    def __init__(self) -> None:
        #: label values -> [count, created]
        self.requests: dict[tuple[str, str, str, str], list[float]] = {}
        #: endpoint -> [a count per bucket (observations above the previous bound, the last one
        #: past every bound), sum, created]
        self.latency: dict[str, tuple[list[int], list[float]]] = {}

    def count(self, key: tuple[str, str, str, str]) -> None:
        series = self.requests.get(key)
        if series is None:
            self.requests[key] = [1.0, time.time()]
        else:
            series[0] += 1

    def observe(self, endpoint: str, seconds: float) -> None:
        series = self.latency.get(endpoint)
        if series is None:
            series = self.latency[endpoint] = ([0] * (len(_LATENCY_BUCKETS) + 1), [0.0, time.time()])
        series[0][bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        series[1][0] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("gpu_admission_requests", "Admission requests answered.", labels=_REQUEST_LABELS)
        for key, (count, created) in self.requests.items():
            requests.add_metric(key, count, created=created)
        yield requests
        name = "gpu_admission_request_duration_seconds"
        latency = HistogramMetricFamily(name, "Time to answer an admission request.", labels=("endpoint",))
        for endpoint, (counts, (total, created)) in self.latency.items():
            buckets, seen = [], 0
            for bound, in_bucket in zip((*map(floatToGoString, _LATENCY_BUCKETS), "+Inf"), counts):
                seen += in_bucket
                buckets.append((bound, float(seen)))
            latency.add_metric((endpoint,), buckets, total)
            latency.samples.append(Sample(name + "_created", {"endpoint": endpoint}, created))
        yield latency


class Metrics:
    """Every metric the server exports; ``render`` is the /metrics body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.answered = AnsweredSeries()
        r.register(self.answered)  # type: ignore[arg-type]
        self.findings = Counter(
            "gpu_admission_findings", "Rule findings by policy, rule and mode (audit mode shows here).",
            ["policy", "rule", "mode"], registry=r,
        )
        self.exceptions = Counter(
            "gpu_admission_exceptions",
            "Admissions where a GPUPolicyException lifted a rule that would have run, by exception and endpoint.",
            ["exception", "endpoint"], registry=r,
        )
        self.reloads = Counter(
            "gpu_admission_policy_reloads", "Policy directory reloads by result.", ["result"], registry=r,
        )
        self.policies_loaded = Gauge(
            "gpu_admission_policies_loaded", "GPUPolicy documents in force.", registry=r,
        )
        self.policy_set = Info(
            "gpu_admission_policy_set",
            "The policy files in force: a digest of their names and contents (and of the compiled output's "
            "record with --compiled); replicas that run the same files show the same.",
            registry=r,
        )
        self.cert_not_after = Gauge(
            "gpu_admission_certificate_not_after_seconds", "Expiry of the certificates in use (unix time).",
            ["cert"], registry=r,
        )
        self.tls_reloads = Counter(
            "gpu_admission_certificate_reloads", "Serving certificate reloads by result.", ["result"], registry=r,
        )
        self.policy_files_loadable = Gauge(
            "gpu_admission_policy_files_loadable",
            "1 when the policy files on disk load and validate now, 0 when they do not (the last good set is in force).",
            registry=r,
        )
        self.rejected = Counter(
            "gpu_admission_rejected_requests",
            "Requests refused before evaluation (body too large, bad encoding, timeouts, limits) by reason.",
            ["reason"], registry=r,
        )
        self.parked = Counter(
            "gpu_admission_parked_connections",
            "Connections whose request head trickled in (still incomplete after the listener's trickle time): "
            "not read again until the head's deadline.",
            registry=r,
        )
        self.connections = Gauge("gpu_admission_open_connections", "Client connections open now.", registry=r)
        # label children by label values; request label values are bounded (see count_request),
        # finding ones come from the policy set
        self._finding_children: dict[tuple[str, str, str], Any] = {}
        self._reject_children: dict[tuple[str], Any] = {}
        self._exception_children: dict[tuple[str, str], Any] = {}

    def count_request(self, endpoint: str, kind: str, operation: str, decision: str, known_kinds: frozenset[str]) -> None:
        """Count one answered admission request, its labels bounded to known values."""
        key = (
            endpoint if endpoint in ENDPOINTS else OTHER,
            kind if kind in known_kinds or not kind else OTHER,
            operation if operation in OPERATIONS else OTHER,
            decision,
        )
        self.answered.count(key)

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        self.answered.observe(endpoint if endpoint in ENDPOINTS else OTHER, seconds)

    def count_findings(self, findings: Iterable[Finding]) -> None:
        """Count rule findings by policy, rule and mode (violations: a note is no finding of its mode)."""
        for finding in findings:
            if finding.note:
                continue
            _child(self._finding_children, self.findings, (finding.policy, finding.rule, finding.mode)).inc()

    def count_exceptions(self, endpoint: str, names: Iterable[str]) -> None:
        """Count the exceptions that lifted rules in one admission (names come from the policy set)."""
        key_endpoint = endpoint if endpoint in ENDPOINTS else OTHER
        for name in names:
            _child(self._exception_children, self.exceptions, (name, key_endpoint)).inc()

    def reject(self, reason: str) -> None:
        """Count one refusal; a reason outside REJECT_REASONS is counted as ``other``."""
        key = (reason if reason in REJECT_REASONS else OTHER,)
        _child(self._reject_children, self.rejected, key).inc()

    def count_log_drops(self, dropped: Callable[[], int]) -> None:
        """Export ``gpu_admission_log_lines_dropped_total``: the count ``dropped()`` returns when scraped."""
        self.registry.register(_LogDrops(dropped))  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LogDrops:
    """Log lines dropped because the log output did not take them (webhook.log_output), read when scraped."""

    def __init__(self, dropped: Callable[[], int]) -> None:
        self._dropped = dropped

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "gpu_admission_log_lines_dropped",
            "Log lines dropped because the log output (stderr) did not take them in time: its reader stalled.",
            value=self._dropped(),
        )


def _child(children: dict[_Key, Any], metric: Any, key: _Key) -> Any:
    """The child of ``metric`` for the label values ``key``, bound on first use and kept in ``children``."""
    child = children.get(key)
    if child is None:
        child = children[key] = metric.labels(*key)
    return child
