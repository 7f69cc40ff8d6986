"""Reservations (docs/quota.md): far from a cap, pods are admitted against room a replica holds in the
ledger, their charges recorded after; the cap still fills exactly, and what was reserved goes back.

Through kube-apiserver with deploy/'s webhook configurations and one ``serve``
(the suite's release window: 3 s, so a reservation admits pods for 0.75 s):
namespaces under the e2e-reserve caps (64 GPUs a namespace and a team), which
leave room enough for reservations.
"""

from __future__ import annotations

from tests.e2e.admission import QUOTA_WINDOW, Admission
from tests.e2e.conftest import Burst
from tests.e2e.fixtures import BURST_LABEL, RESERVE_CAP, RESERVE_LABEL, charged, gpu_container, ledgers, pod
from tests.e2e.kube import Kube, Object, eventually
from tests.e2e.test_quota_burst import DENIED, create_at_once, stored
from webhook.ledger import document, reservation

RESERVED = "gpu_admission_quota_reserved_charges_total"


def _reserved(admission: Admission) -> float:
    status, text = admission.get("/metrics")
    assert status == 200, text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(RESERVED + " "))


def _reservations(admin: Kube) -> list[str]:
    return [uid for held in document.effective(ledgers(admin)).values() for uid in held
            if reservation.is_reservation(uid)]


def _recorded(admin: Kube, namespace: str, made: list[Object]) -> None:
    """The pods' charges recorded, and the room reserved and not used gone back: the ledger holds the pods."""
    uids = {p["metadata"]["uid"] for p in made}
    eventually(lambda: set(charged(admin, namespace)) == uids and not _reservations(admin), timeout=QUOTA_WINDOW + 10,
               what="the reserved pods recorded, and the reservations gone")


def test_a_burst_far_from_the_cap_is_admitted_against_reservations_and_still_fills_the_cap_exactly(
    admin: Kube, admission: Admission, burst: Burst
) -> None:
    (namespace,) = burst(**{BURST_LABEL: "off", RESERVE_LABEL: "on"})
    before = _reserved(admission)
    # the first pod reserves room (a quarter of what the caps leave), the next ones take from it
    first = [admin.create(pod(f"first-{i}", namespace, gpu_container())) for i in range(4)]
    made, refusals = create_at_once(admin, [pod(f"p{i}", namespace, gpu_container()) for i in range(RESERVE_CAP + 12)])
    made += first
    assert len(stored(admin, namespace)) == RESERVE_CAP, refusals
    for message in refusals:
        assert DENIED in message and f"uses {RESERVE_CAP} of {RESERVE_CAP}" in message, message
    # some were admitted with no write of their own
    assert _reserved(admission) - before >= 3
    _recorded(admin, namespace, made)


def test_pods_admitted_one_after_another_against_a_reservation_are_recorded(
    admin: Kube, admission: Admission, burst: Burst
) -> None:
    (namespace,) = burst(**{BURST_LABEL: "off", RESERVE_LABEL: "on"})
    before = _reserved(admission)
    made = [admin.create(pod(f"p{i}", namespace, gpu_container())) for i in range(6)]
    assert _reserved(admission) - before >= 1
    _recorded(admin, namespace, made)
