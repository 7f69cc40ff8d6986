"""Prometheus metrics of the GPU quota ledger (docs/quota.md), on the server's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "gpu_admission_quota"

#: what became of a pod's charges: written, refused (a cap is full), judged only (a dry run), not
#: judged (the ledger could not be reached in time: the rule's clusterUnavailable decided)
OUTCOMES = ("charged", "denied", "dry-run", "unavailable")
#: why charges were removed: the pod finished or was deleted (seen by the watch), it never
#: appeared within the window, the pod's other charge was refused, or a recount found it gone
RELEASES = ("finished", "deleted", "unseen", "rolled-back", "recount")
#: why the API server refused a ledger write for what it holds (``webhook.cluster.session.ApiError.refused``)
REFUSALS = ("too-large", "invalid", "forbidden", "bad-request")


class LedgerMetrics:
    """Counters of charges, conflicts, retries, releases and recount corrections."""

    def __init__(self, registry: CollectorRegistry, window: float) -> None:
        self.charges = Counter(f"{PREFIX}_charges", "Pods judged against the GPU quota ledger, by outcome.",
                               ["outcome"], registry=registry)
        self.conflicts = Counter(f"{PREFIX}_ledger_conflicts",
                                 "Ledger writes refused because another writer changed the ledger first (409).",
                                 registry=registry)
        self.retries = Counter(f"{PREFIX}_ledger_retries", "Ledger writes tried again, by reason.",
                               ["reason"], registry=registry)
        self.releases = Counter(f"{PREFIX}_releases", "Charges removed from the ledger, by reason.",
                                ["reason"], registry=registry)
        self.corrections = Counter(f"{PREFIX}_recount_corrections",
                                   "Charges a recount from the cluster view added or removed.", ["change"],
                                   registry=registry)
        self.in_flight = Gauge(f"{PREFIX}_charges_in_flight",
                               "Charges whose pod the cluster view does not show yet.", registry=registry)
        self.window = Gauge(f"{PREFIX}_release_window_seconds",
                            "How long a charge may wait for its pod to appear before it is released.",
                            registry=registry)
        self.window.set(window)
        self.reserved = Counter(f"{PREFIX}_reserved_charges",
                                "Pods admitted against a reservation of this replica, their charges recorded after.",
                                registry=registry)
        self.unavailable = Counter(f"{PREFIX}_ledger_unavailable",
                                   "Pods admitted or refused without the ledger (clusterUnavailable decided), by decision.",
                                   ["decision"], registry=registry)
        self.refused = Counter(f"{PREFIX}_ledger_refused",
                               "Pods refused because the API server refused the ledger's write for what it holds "
                               "(whatever clusterUnavailable says), by reason.", ["reason"], registry=registry)
        self.healed = Counter(f"{PREFIX}_uncharged_pods_charged",
                              "Stored pods the pod watch saw holding GPUs with no charge, charged at once.",
                              registry=registry)
        self.served = Gauge(f"{PREFIX}_ledger_served",
                            "Whether the API server serves GPUQuotaLedgers (API discovery; 0: the CRD is not installed).",
                            registry=registry)
        self.missing = Gauge(f"{PREFIX}_ledger_missing",
                             "1 while a policy enforces GPU caps and GPUQuotaLedgers are not served (the server is "
                             "not Ready).", registry=registry)
        self.stated = Gauge(f"{PREFIX}_stated_caps",
                            "Policies whose caps the ledgers state, live: own (this replica's, renewed here), "
                            "other (another policy version's, enforced here too until they lapse), unreadable "
                            "(another version's this one cannot read: not enforced here).", ["origin"],
                            registry=registry)
        for origin in ("own", "other", "unreadable"):
            self.stated.labels(origin)
        for reason in REFUSALS:
            self.refused.labels(reason)
        for outcome in OUTCOMES:
            self.charges.labels(outcome)
        for reason in RELEASES:
            self.releases.labels(reason)
        for reason in ("conflict", "error"):
            self.retries.labels(reason)
        for change in ("added", "removed"):
            self.corrections.labels(change)
        for decision in ("fail-open", "fail-closed"):
            self.unavailable.labels(decision)
