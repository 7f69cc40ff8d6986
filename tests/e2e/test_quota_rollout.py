"""A policy rollout: replicas on different policy versions overlap, and a team cap still holds (issue 41).

Replicas of ``serve`` share a kube-apiserver of their own, each with one
version of the policy e2e-rollout: the team cap of 8 in ``enforce`` (the new
version), or the old one: quota ``off``, in ``warn``, the cap raised to 16,
or the quota rule removed. Spread over two or three of them (mixed
versions), 4 reviews of one-GPU pods are admitted, then 16 more are sent at
once: at most 8 are admitted in all, 20 times in a row (a new team each
time), whichever replica answers. The control: two replicas both on the new
version fill the cap exactly (8 admitted: no wrong refusal).

Each replica states its caps in the ledgers (``webhook.ledger.statements``)
before it is Ready; the others judge and charge pods under them too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import replicas
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer
from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import _labelled_policy, ledger
from tests.e2e.kube import Kube, eventually
from tests.e2e.replicas import Replica, Replicas

CAP, HELD, BURST, REPETITIONS = 8, 4, 16, 20
WINDOW = 8.0
LABEL = "e2e.gpu-admission.io/rollout"


def _quota(mode: str, cap: int) -> str:
    return f"""\
    quota:
      mode: "{mode}"
      clusterUnavailable: fail-closed
      limits:
        - {{scope: team, max: {cap}}}
"""


#: the versions of the policy e2e-rollout a replica may run
VERSIONS = {
    "new": _quota("enforce", CAP),
    "off": _quota("off", CAP),
    "warn": _quota("warn", CAP),
    "raised": _quota("enforce", 2 * CAP),
    "removed": "    resourceShape: {mode: audit, maxPerPod: 8, nodeCapacity: false}\n",
}


@pytest.fixture(scope="module")
def cluster(apiserver: ApiServer, workdir: Path) -> Iterator[tuple[Kube, Replicas, dict[str, Replica]]]:
    own = ApiServer(apiserver.assets, workdir / "kube-rollout")
    own.start()
    admin = Kube(own.kubeconfig(workdir / "rollout-admin.kubeconfig", ADMIN_TOKEN))
    folder = workdir / "rollout"
    folder.mkdir()
    folders = {}
    for version, rules in VERSIONS.items():
        folders[version] = folder / f"policies-{version}"
        folders[version].mkdir()
        (folders[version] / "e2e-rollout.yaml").write_text(_labelled_policy("e2e-rollout", LABEL, "Pod", rules))
    servers = Replicas(folder, folders["new"], replicas.install(admin, own, folder), WINDOW)
    try:
        by_version = {version: servers.start(1, policies=folders[version])[0] for version in VERSIONS}
        by_version["new-2"] = servers.start(1, policies=folders["new"])[0]
        yield admin, servers, by_version
    finally:
        servers.stop()
        admin.close()
        own.cleanup()


def _team(admin: Kube, servers: Replicas) -> tuple[str, str]:
    """A new team (one namespace under the e2e-rollout policy), known to every replica."""
    team, name = f"vision-{uuid.uuid4().hex[:6]}", f"e2e-rollout-{uuid.uuid4().hex[:8]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {OPT_IN: "true", LABEL: "on", "team": team}}})
    want = len(admin.list("v1", "Namespace"))
    eventually(lambda: all(r.metric('gpu_admission_cluster_objects{resource="namespaces"}', servers.context) == want
                           for r in servers.running), what="every replica's view holding the namespace")
    return team, name


def _send(servers: Replicas, targets: list[Replica], namespace: str, prefix: str, count: int) -> list[dict[str, Any]]:
    """``count`` reviews at once, round-robin over ``targets``: the answers."""
    reviews = [replicas.pod_review(namespace, f"{prefix}{i}") for i in range(count)]
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda i: replicas.post(targets[i % len(targets)], servers.context, reviews[i]),
                                range(count)))
    assert not [a["error"] for a in answers if "error" in a]
    return answers


def _round(admin: Kube, servers: Replicas, targets: list[Replica]) -> tuple[str, int, list[str]]:
    """A new team; 4 reviews admitted, then 16 at once: (the team, how many admitted in all, the refusals)."""
    team, namespace = _team(admin, servers)
    held = _send(servers, targets, namespace, "h", HELD)
    assert all(a["allowed"] for a in held), held
    burst = _send(servers, targets, namespace, "b", BURST)
    return team, HELD + sum(1 for a in burst if a["allowed"]), [a["status"]["message"] for a in burst
                                                               if not a["allowed"]]


MIXES = [("new", "off"), ("new", "warn"), ("new", "raised"), ("new", "removed"), ("off", "new", "raised"),
         ("warn", "removed", "new")]


@pytest.mark.parametrize("mix", MIXES, ids="+".join)
def test_replicas_on_two_policy_versions_never_admit_past_the_cap(
    cluster: tuple[Kube, Replicas, dict[str, Replica]], mix: tuple[str, ...]
) -> None:
    admin, servers, by_version = cluster
    targets = [by_version[v] for v in mix]
    for repetition in range(REPETITIONS):
        team, admitted, refusals = _round(admin, servers, targets)
        assert admitted <= CAP, (mix, repetition, admitted, refusals[:3])
        assert all(f"of {CAP} nvidia.com/gpu" in m for m in refusals), refusals[:3]
        assert len(ledger(admin, "team", team)) <= CAP
    # the replicas on the old version say they enforce the new one's caps
    for version in mix:
        if version != "new":
            assert by_version[version].metric('gpu_admission_quota_stated_caps{origin="other"}', servers.context) >= 1


def test_two_replicas_on_the_new_version_fill_the_cap_exactly(
    cluster: tuple[Kube, Replicas, dict[str, Replica]]
) -> None:
    admin, servers, by_version = cluster
    targets = [by_version["new"], by_version["new-2"]]
    for repetition in range(REPETITIONS):
        team, admitted, refusals = _round(admin, servers, targets)
        assert admitted == CAP, (repetition, admitted, refusals[:3])
        assert len(ledger(admin, "team", team)) == CAP
