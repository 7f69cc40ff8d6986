"""Prometheus metrics of the cluster index, computed when scraped.

A custom collector rather than Gauge/Counter objects: the values already
live in each watch's state, and an age must be computed at scrape time.
It is registered only on the registry the caller passes, never on
prometheus_client's global default registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from webhook.cluster.state import ResourceState

PREFIX = "gpu_admission_cluster"

#: A reading of the index: per resource, its state and how many objects it holds.
Reading = Mapping[str, tuple[ResourceState, int]]


class IndexCollector:
    """Exports the synced flag, last event age, relists, errors and object counts."""

    def __init__(self, read: Callable[[], Reading], clock: Callable[[], float]) -> None:
        self._read = read
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # Lets the registry refuse a second index on the same registry.
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        synced, age, relists, errors, objects = families
        now = self._clock()
        for resource, (state, count) in sorted(self._read().items()):
            synced.add_metric([resource], 1.0 if state.synced else 0.0)
            if state.last_event is not None:
                age.add_metric([resource], max(0.0, now - state.last_event))
            relists.add_metric([resource], state.relists)
            errors.add_metric([resource], state.watch_errors)
            objects.add_metric([resource], count)
        return iter(families)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily,
                             CounterMetricFamily, GaugeMetricFamily]:  # fmt: skip
        labels = ["resource"]
        return (
            GaugeMetricFamily(f"{PREFIX}_synced", "1 once the first full list of the resource is stored.",
                              labels=labels),  # fmt: skip
            GaugeMetricFamily(
                f"{PREFIX}_last_event_age_seconds",
                "Seconds since the last list page, watch event or bookmark of the resource.",
                labels=labels,
            ),
            CounterMetricFamily(f"{PREFIX}_relists", "Full relists after the first list (410 Gone, failures).",
                                labels=labels),  # fmt: skip
            CounterMetricFamily(
                f"{PREFIX}_watch_errors",
                "Failed list or watch requests, dropped watch streams and watch ERROR events.",
                labels=labels,
            ),
            GaugeMetricFamily(f"{PREFIX}_objects", "Objects of the resource held by the index.", labels=labels),
        )
