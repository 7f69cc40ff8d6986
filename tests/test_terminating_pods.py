"""Terminating pods hold their GPUs for their grace period, as ResourceQuota counts them (issue #41).

kube-apiserver's pod evaluator (QuotaV1Pod) counts a pod being deleted until
``deletionTimestamp + deletionGracePeriodSeconds`` has passed. The rule
(``webhook.kube.termination``), the live index's usage sums (with its clock),
the recount (``webhook.ledger.recount``) and the pod watch
(``PodFollower``) all count so: a pod deleted with a 1 h grace period that
stays Terminating keeps its charge, and one past it does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from tests.support import POLICIES
from webhook.kube import termination
from webhook.ledger import recount
from webhook.ledger.upkeep import PodFollower
from webhook.policy import loader
from webhook.policy.charges import LedgerKey
from webhook.view.aggregates import Aggregates
from webhook.view.snapshot import SnapshotView

DELETED = datetime(2026, 1, 1, tzinfo=UTC).timestamp()  # when the delete was asked for
GRACE = 3600
POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: caps}
spec:
  rules: {quota: {resourceQuotas: false, limits: [{max: 8}]}}
"""
KEY = LedgerKey("namespace", "ml", "", "nvidia.com/gpu.product")


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, gpus: int = 1, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", **meta},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"}}


def deleted(name: str, gpus: int = 1, grace: int = GRACE) -> dict[str, Any]:
    """Deleted at DELETED with ``grace``: kube-apiserver writes deletionTimestamp = the delete + the grace."""
    return pod(name, gpus, deletionTimestamp=_stamp(DELETED + grace), deletionGracePeriodSeconds=grace)


def test_the_rule_is_resourcequotas() -> None:
    leaving = deleted("p")
    end = DELETED + 2 * GRACE  # deletionTimestamp + deletionGracePeriodSeconds
    assert termination.released_at(leaving) == end
    assert termination.holds(leaving, DELETED)
    assert termination.holds(leaving, DELETED + GRACE + 1)  # past deletionTimestamp: still counted
    assert termination.holds(leaving, end)
    assert not termination.holds(leaving, end + 1)
    assert termination.holds(leaving)  # no clock: until it is gone
    no_grace = pod("q", deletionTimestamp=_stamp(DELETED))
    assert termination.holds(no_grace, DELETED + 10 * GRACE)  # (ResourceQuota: no grace period, no end)
    assert not termination.holds({**pod("r"), "status": {"phase": "Succeeded"}}, DELETED)
    assert termination.holds(pod("s"), DELETED)


def test_the_live_usage_sums_drop_a_terminating_pod_once_its_grace_has_passed() -> None:
    clock = [DELETED]
    aggregates = Aggregates(lambda: clock[0])
    aggregates.replace_namespaces([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}])
    aggregates.replace_pods([pod("running", 2)])
    aggregates.put_pod(deleted("leaving", 4))

    def held() -> Decimal:
        return sum(aggregates.gpu_usage("nvidia.com/gpu.product").in_namespace("ml").values(), Decimal(0))

    assert held() == 6
    clock[0] = DELETED + GRACE + 60  # past its deletionTimestamp, within its grace
    assert held() == 6
    clock[0] = DELETED + 2 * GRACE + 1
    assert held() == 2
    aggregates.replace_pods([pod("running", 2), deleted("leaving", 4)])  # (a relist, past its end)
    assert held() == 2


def test_the_recount_charges_a_terminating_pod_until_its_grace_has_passed() -> None:
    policies = loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + POLICY)
    view = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
                                      pod("running"), deleted("leaving")], known=("namespaces", "pods"))
    assert set(recount.holdings(policies, view, KEY, ["ml"], DELETED + GRACE + 60)) == {"uid-running", "uid-leaving"}
    assert set(recount.holdings(policies, view, KEY, ["ml"], DELETED + 2 * GRACE + 1)) == {"uid-running"}


class _Upkeep:
    """What the pod watch's follower calls: its releases recorded, the clock the ledger's."""

    def __init__(self, now: float) -> None:
        self.released: list[tuple[list[str], str]] = []
        self.ledger = self
        self.store = self
        self._now = now

    def now(self) -> float:
        return self._now

    def holds(self, uid: str) -> bool:
        return True  # (charged: the self-healing's is tests/test_ledger_heal.py)

    def on_loop(self, call: Any, *args: Any) -> None:
        call(*args)

    def release_later(self, uids: list[str], reason: str) -> None:
        self.released.append((uids, reason))

    def recount_soon(self) -> None:
        pass

    def uncharged(self, pod: Any) -> None:
        pass  # (a stored pod holding GPUs: the self-healing's, tests/test_ledger_heal.py)


def test_the_pod_watch_keeps_a_terminating_pods_charge() -> None:
    upkeep = _Upkeep(DELETED + 1)
    follower = PodFollower(upkeep)  # type: ignore[arg-type]
    follower.put(pod("p"))
    follower.put(deleted("p"))
    assert upkeep.released == []  # Terminating, within its grace: still charged
    follower.put(deleted("q", grace=0))  # (grace 0: its object goes at once, and so does its charge)
    upkeep._now = DELETED + 2 * GRACE + 1
    follower.put(deleted("p"))
    assert upkeep.released == [(["uid-q"], "deleted"), (["uid-p"], "deleted")]
    follower.discard("ml", "p")
    assert upkeep.released[-1] == (["uid-p"], "deleted")


