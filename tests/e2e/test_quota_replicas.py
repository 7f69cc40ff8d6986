"""Several replicas, one ledger: exactly the cap admitted however the reviews are spread (issue 33).

Two and three ``serve`` processes share a kube-apiserver of their own (so
that no other server's release window runs over their charges) and are sent
48 concurrent validating reviews of distinct one-GPU pods, round-robin,
under a team cap of 8 (e2e-burst: two namespaces of one team, 5 GPUs a
namespace): exactly 8 are admitted, 20 times in a row. Then one replica is
killed (SIGKILL) during a burst: nothing past the cap, and its charges
(whose pods never come: the reviews are the test's) are released within the
window by the replicas left.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import replicas
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer
from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import BURST_LABEL, BURST_POLICY, RESERVE_CAP, RESERVE_LABEL, RESERVE_POLICY, ledger
from tests.e2e.kube import Kube, eventually
from tests.e2e.replicas import Replica, Replicas
from tests.support import POLICIES
from webhook.ledger import reservation

CAP, REVIEWS, REPETITIONS = 8, 48, 20
#: long enough that no burst outlasts it (a burst takes about a second), short enough to wait for
WINDOW = 8.0


@pytest.fixture(scope="module")
def cluster(apiserver: ApiServer, workdir: Path) -> Iterator[tuple[Kube, Replicas]]:
    own = ApiServer(apiserver.assets, workdir / "kube-replicas")
    own.start()
    admin = Kube(own.kubeconfig(workdir / "replicas-admin.kubeconfig", ADMIN_TOKEN))
    folder = workdir / "replicas"
    folder.mkdir()
    policies = folder / "policies"
    shutil.copytree(POLICIES, policies)
    (policies / "e2e-burst.yaml").write_text(BURST_POLICY)
    (policies / "e2e-reserve.yaml").write_text(RESERVE_POLICY)
    servers = Replicas(folder, policies, replicas.install(admin, own, folder), WINDOW)
    try:
        servers.start(3)
        yield admin, servers
    finally:
        servers.stop()
        admin.close()
        own.cleanup()


def _team(admin: Kube, servers: Replicas, label: str = BURST_LABEL) -> tuple[str, list[str]]:
    """A new team of two namespaces under the e2e-burst caps (or those ``label`` selects), known to every replica."""
    team = f"vision-{uuid.uuid4().hex[:6]}"
    names = [f"e2e-replicas-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for name in names:
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": {OPT_IN: "true", label: "on", "team": team}}})
    want = len(admin.list("v1", "Namespace"))
    def known() -> bool:
        return all(r.metric('gpu_admission_cluster_objects{resource="namespaces"}', servers.context) == want
                   for r in servers.running)

    eventually(known, what="every replica's view holding the namespaces")
    return team, names


def _burst(servers: Replicas, targets: list[Replica], namespaces: list[str], count: int = REVIEWS,
           prefix: str = "p") -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` reviews at once, spread round-robin over ``targets``: (review, answer) pairs."""
    reviews = [replicas.pod_review(namespaces[i % 2], f"{prefix}{i}") for i in range(count)]
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda i: replicas.post(targets[i % len(targets)], servers.context, reviews[i]),
                                range(count)))
    return list(zip(reviews, answers))


def _uid(review: dict[str, Any]) -> str:
    return str(review["request"]["object"]["metadata"]["uid"])


@pytest.mark.parametrize("count", [2, 3])
def test_reviews_spread_over_replicas_admit_exactly_the_cap_every_time(
    cluster: tuple[Kube, Replicas], count: int
) -> None:
    admin, servers = cluster
    targets = servers.running[:count]
    for repetition in range(REPETITIONS):
        team, namespaces = _team(admin, servers)
        answered = _burst(servers, targets, namespaces)
        errors = [a["error"] for _, a in answered if "error" in a]
        assert not errors, errors
        admitted = {_uid(r) for r, a in answered if a["allowed"]}
        refusals = [a["status"]["message"] for _, a in answered if not a["allowed"]]
        assert len(admitted) == CAP, (repetition, len(admitted), refusals[:3])
        # every refusal was a full cap, not a ledger that could not be reached in time
        assert all("uses 8 of 8" in m or "uses 5 of 5" in m for m in refusals), refusals
        assert set(ledger(admin, "team", team)) == admitted
    # and they did race: writes were refused for another replica's, judged again, and decided in time
    conflicts = sum(r.metric("gpu_admission_quota_ledger_conflicts_total", servers.context) for r in targets)
    assert conflicts > 0


def test_a_replica_killed_during_a_burst_overshoots_nothing_and_leaks_nothing_past_the_window(
    cluster: tuple[Kube, Replicas]
) -> None:
    admin, servers = cluster
    team, namespaces = _team(admin, servers)
    victim = servers.running[-1]
    reviews = [replicas.pod_review(namespaces[i % 2], f"p{i}") for i in range(REVIEWS)]
    targets = servers.running[:]
    with ThreadPoolExecutor(REVIEWS) as pool:
        futures = [pool.submit(replicas.post, targets[i % len(targets)], servers.context, reviews[i])
                   for i in range(REVIEWS)]
        time.sleep(0.05)  # the burst under way
        servers.kill(victim)
        answers = [f.result() for f in futures]
    admitted = {_uid(r) for r, a in zip(reviews, answers) if a.get("allowed")}
    sent_to_victim = {_uid(reviews[i]) for i in range(REVIEWS) if targets[i % len(targets)] is victim}
    charged = set(ledger(admin, "team", team))
    assert len(admitted) <= CAP and len(charged) <= CAP, (admitted, charged)
    assert admitted <= charged  # an allowed pod holds its charge
    # the replicas left still decide: the rest of the team's room goes to new reviews, and no more
    survivors = servers.running[:]
    more = [replicas.pod_review(namespaces[i % 2], f"q{i}") for i in range(16)]
    with ThreadPoolExecutor(len(more)) as pool:
        later = list(pool.map(lambda i: replicas.post(survivors[i % len(survivors)], servers.context, more[i]),
                              range(len(more))))
    assert not [a for a in later if "error" in a]
    charged = set(ledger(admin, "team", team))
    assert len(charged) <= CAP, charged
    # no pod of these reviews is ever stored: every charge, the victim's first, goes within the window
    started = time.monotonic()
    eventually(lambda: not set(ledger(admin, "team", team)) & sent_to_victim, timeout=WINDOW + 20,
               what="the killed replica's charges released")
    eventually(lambda: not ledger(admin, "team", team), timeout=WINDOW + 20, what="every charge released")
    assert time.monotonic() - started <= WINDOW + 20
    released = sum(r.metric('gpu_admission_quota_releases_total{reason="unseen"}', servers.context) for r in survivors)
    assert released >= len(charged)


def test_replicas_holding_reservations_never_pass_the_cap_and_a_killed_ones_room_comes_back(
    cluster: tuple[Kube, Replicas]
) -> None:
    """Far from the cap (e2e-reserve: 64 GPUs) replicas admit against reservations (docs/quota.md). Spread
    over them, a burst never passes the cap; a replica killed holding a reservation leaves it in the ledger
    until the window has passed, then the others free it: nothing is held for ever."""
    admin, servers = cluster

    def reserved() -> float:
        return sum(r.metric("gpu_admission_quota_reserved_charges_total", servers.context) for r in servers.running)

    team, namespaces = _team(admin, servers, RESERVE_LABEL)
    before = reserved()
    # first one pod of each namespace through each replica, one at a time: the write of its charge grants
    # that replica a reservation of its shape (far from the cap). A burst alone may be judged whole in
    # the first writes on a slow machine, before any reservation is there to admit against
    answered = []
    for j, replica in enumerate(servers.running):
        for k, namespace in enumerate(namespaces):
            review = replicas.pod_review(namespace, f"w{j}-{k}")
            answered.append((review, replicas.post(replica, servers.context, review)))
    answered += _burst(servers, servers.running[:], namespaces, RESERVE_CAP + 32)
    assert not [a["error"] for _, a in answered if "error" in a]
    admitted = {_uid(r) for r, a in answered if a["allowed"]}
    refusals = [a["status"]["message"] for _, a in answered if not a["allowed"]]
    assert len(admitted) <= RESERVE_CAP, len(admitted)
    assert all(f"of {RESERVE_CAP}" in m for m in refusals), refusals[:3]
    assert reserved() > before
    # a new team: the victim admits a few reviews, from a reservation it holds, and dies
    team, namespaces = _team(admin, servers, RESERVE_LABEL)
    victim = servers.running[-1]
    first = _burst(servers, [victim], namespaces, 4, prefix="v")
    assert all(a["allowed"] for _, a in first), first
    assert any(reservation.is_reservation(uid) for uid in ledger(admin, "team", team))
    servers.kill(victim)
    # the others never pass the cap: the victim's reviews and its reservation count
    answered = _burst(servers, servers.running[:], namespaces, RESERVE_CAP + 16, prefix="s")
    admitted = {_uid(r) for r, a in answered if a["allowed"]}
    assert len(admitted) + len(first) <= RESERVE_CAP, len(admitted)
    # the reviews' pods are never stored: every charge goes within the window, the victim's reservation too
    eventually(lambda: not ledger(admin, "team", team), timeout=WINDOW + 30, what="every charge and reservation gone")
    answered = _burst(servers, servers.running[:], namespaces, RESERVE_CAP + 16, prefix="t")
    assert len({_uid(r) for r, a in answered if a["allowed"]}) <= RESERVE_CAP
