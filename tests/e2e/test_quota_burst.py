"""Exact GPU caps when pods arrive all at once (issue 33): the charge ledger in the API server.

Each row of the issue's table, through kube-apiserver with deploy/'s webhook
configurations and one ``serve`` (a team cap of 8 GPUs over two namespaces
labelled ``team: <a team>``, a namespace cap of 5, e2e-burst in
tests/e2e/fixtures.py): what is stored, and that every pod refused was
refused by a full cap. Then what a charge becomes when its pod is refused
after it was charged (a native ResourceQuota lower than the cap, a second
validating webhook that denies): released within the window, and the cap
fills again.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from decimal import Decimal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import denying_webhook
from tests.e2e.admission import QUOTA_WINDOW, Admission
from tests.e2e.apiserver import REPO
from tests.e2e.conftest import Burst
from tests.e2e.fixtures import BURST_LABEL, charged, gpu_container, ledger, ledgers, native_quota, pod
from tests.e2e.kube import Kube, Object, Refused, eventually
from webhook.ledger import document
from webhook.ledger.document import Entry
from webhook.policy.charges import Holding, LedgerKey

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'
#: how long a released charge may take to go: the window, then the sweep that finds it and the write
RELEASED_WITHIN = QUOTA_WINDOW + 10

def create_at_once(admin: Kube, pods: list[Object]) -> tuple[list[Object], list[str]]:
    """Every pod created at the same moment, one client each: (what was stored, the refusals)."""
    def create(p: Object) -> Object | str:
        try:
            return admin.create(p)
        except Refused as exc:
            return exc.message

    with ThreadPoolExecutor(len(pods)) as pool:
        results = list(pool.map(create, pods))
    return [r for r in results if isinstance(r, dict)], [r for r in results if isinstance(r, str)]


def stored(admin: Kube, *namespaces: str) -> list[Object]:
    return [p for ns in namespaces for p in admin.list("v1", "Pod", ns)]


def team_of(admin: Kube, namespace: str) -> str:
    return str(admin.get("v1", "Namespace", namespace)["metadata"]["labels"]["team"])


def assert_refused_by_a_full_cap(refusals: list[str], namespace_cap: str = "uses 5 of 5",
                                 team_cap: str = "uses 8 of 8") -> None:
    for message in refusals:
        assert DENIED in message, message
        assert namespace_cap in message or team_cap in message, message


def test_pods_created_one_after_another_stop_at_the_namespace_cap(admin: Kube, burst: Burst) -> None:
    (namespace,) = burst()
    refusals = []
    for i in range(6):
        try:
            admin.create(pod(f"p{i}", namespace, gpu_container()))
        except Refused as exc:
            refusals.append(exc.message)
    assert len(stored(admin, namespace)) == 5
    assert len(refusals) == 1 and f"namespace {namespace} uses 5 of 5 nvidia.com/gpu" in refusals[0], refusals


def test_24_pods_at_once_into_a_teams_two_namespaces_fill_its_cap_of_8_exactly(admin: Kube, burst: Burst) -> None:
    a, b = burst(2)
    made, refusals = create_at_once(admin, [pod(f"p{i}", (a, b)[i % 2], gpu_container()) for i in range(24)])
    assert len(stored(admin, a, b)) == 8, (len(made), refusals)
    assert_refused_by_a_full_cap(refusals)
    team = team_of(admin, a)
    uids = {p["metadata"]["uid"] for p in made}
    assert set(ledger(admin, "team", team)) == uids
    # the charges of stored pods stay past the window: the cap stays full
    time.sleep(QUOTA_WINDOW + 2)
    assert set(ledger(admin, "team", team)) == uids
    # and they were settled: moved out of the part admission writes, which stays small
    parts = [p for p in map(document.read, ledgers(admin)) if p is not None and p.key.group == team]
    assert {p.part: set(p.charges) for p in parts} == {document.RECENT: set(), document.SETTLED: uids}
    with pytest.raises(Refused) as refused:
        admin.create(pod("one-more", a, gpu_container()))
    assert f"team {team} (team={team}) uses 8 of 8 nvidia.com/gpu" in refused.value.message, refused.value.message
    assert "held in" in refused.value.message


def test_16_pods_at_once_into_one_namespace_fill_its_cap_of_5_exactly(admin: Kube, burst: Burst) -> None:
    (namespace,) = burst()
    made, refusals = create_at_once(admin, [pod(f"p{i}", namespace, gpu_container()) for i in range(16)])
    assert len(stored(admin, namespace)) == 5, refusals
    assert_refused_by_a_full_cap(refusals)
    assert set(charged(admin, namespace)) == {p["metadata"]["uid"] for p in made}


def test_a_dry_run_is_judged_against_the_ledger_and_charges_nothing(admin: Kube, burst: Burst) -> None:
    (namespace,) = burst()
    for i in range(4):
        admin.create(pod(f"p{i}", namespace, gpu_container()))
    before = charged(admin, namespace)
    answer = admin.create(pod("dry", namespace, gpu_container()), dry_run="All")
    assert answer["metadata"]["name"] == "dry"
    assert charged(admin, namespace) == before  # nothing written
    admin.create(pod("p4", namespace, gpu_container()))
    with pytest.raises(Refused) as refused:
        admin.create(pod("dry", namespace, gpu_container()), dry_run="All")
    assert f"namespace {namespace} uses 5 of 5" in refused.value.message


def _admits(admin: Kube, probe: Object) -> bool:
    try:
        admin.create(probe, dry_run="All")
    except Refused:
        return False
    return True


def _released(admin: Kube, namespace: str, keep: set[str]) -> Callable[[], bool]:
    return lambda: set(charged(admin, namespace)) == keep


def test_pods_a_resource_quota_refuses_after_their_charge_give_it_back_and_the_cap_fills_again(
    admin: Kube, admission: Admission, burst: Burst
) -> None:
    (namespace,) = burst()
    quota = native_quota(admin, admission, namespace, 2)
    made, refusals = create_at_once(admin, [pod(f"p{i}", namespace, gpu_container()) for i in range(5)])
    assert len(made) == 2, refusals  # the ResourceQuota plugin, after the webhooks, is exact too
    kept = {p["metadata"]["uid"] for p in made}
    # whatever the webhook charged for the three refused pods goes within the window
    eventually(_released(admin, namespace, kept), timeout=RELEASED_WITHIN,
               what="the charges of pods the ResourceQuota refused released")
    # room again under our cap of 5: raise the native quota, and three more fill it
    admin.patch(quota, {"spec": {"hard": {"requests.nvidia.com/gpu": "10"}}})
    admin.patch(quota, {"status": {"hard": {"requests.nvidia.com/gpu": "10"}, "used": {"requests.nvidia.com/gpu": "2"}}},
                subresource="status")
    eventually(lambda: _admits(admin, pod("probe", namespace, gpu_container())), what="the view holding the raised quota")
    more, refusals = create_at_once(admin, [pod(f"q{i}", namespace, gpu_container()) for i in range(6)])
    assert len(stored(admin, namespace)) == 5, refusals
    assert_refused_by_a_full_cap(refusals)


def test_a_pod_another_webhook_refuses_after_its_charge_gives_it_back(
    admin: Kube, burst: Burst, tmp_path: Path
) -> None:
    (namespace,) = burst()
    with denying_webhook.registered(admin, tmp_path):
        deny = {denying_webhook.SELECT_LABEL: "on"}
        made, refusals = create_at_once(admin, [pod(f"d{i}", namespace, gpu_container(), labels=deny)
                                                for i in range(5)])
        assert not made and all(denying_webhook.MESSAGE in m for m in refusals), refusals
        # kube-apiserver calls the validating webhooks in parallel and waits for all: ours charged
        # every pod before the other's refusal was returned
        assert len(charged(admin, namespace)) == 5
    eventually(_released(admin, namespace, set()), timeout=RELEASED_WITHIN,
               what="the charges of pods another webhook refused released")
    made, refusals = create_at_once(admin, [pod(f"p{i}", namespace, gpu_container()) for i in range(7)])
    assert len(stored(admin, namespace)) == 5, refusals


def test_pods_that_finish_or_go_give_their_gpus_back_at_once(admin: Kube, burst: Burst) -> None:
    (namespace,) = burst()
    made = [admin.create(pod(f"p{i}", namespace, gpu_container())) for i in range(5)]
    # what the kubelet would report of a pod that ran to completion
    admin.patch(made[0], {"status": {"phase": "Succeeded"}}, subresource="status")
    admin.delete(made[1])
    left = {p["metadata"]["uid"] for p in made[2:]}
    # well before the window: the watch saw them go
    eventually(_released(admin, namespace, left), timeout=QUOTA_WINDOW,
               what="the charges of a finished and a deleted pod released")
    admin.create(pod("q0", namespace, gpu_container()))
    admin.create(pod("q1", namespace, gpu_container()))
    with pytest.raises(Refused):
        admin.create(pod("q2", namespace, gpu_container()))


def test_terminating_pods_hold_their_gpus_until_they_are_gone(admin: Kube, burst: Burst) -> None:
    """A pod deleted with a grace period keeps running, and its GPUs, until it exits (a training job
    checkpointing on SIGTERM): its charge stays, as ResourceQuota counts it (issue #41)."""
    (namespace,) = burst()  # a namespace cap of 5
    # bound (nodeName): kube-apiserver deletes unbound pods at once, whatever the grace
    held = [admin.create(pod(f"p{i}", namespace, gpu_container(), nodeName="gpu-node-1")) for i in range(4)]
    marker = admin.create(pod("marker", namespace, gpu_container(), nodeName="gpu-node-1"))
    for made in held:
        admin.delete(made, grace=3600)
    assert all(admin.get("v1", "Pod", p["metadata"]["name"], namespace)["metadata"].get("deletionTimestamp") for p in held)
    admin.delete(marker, grace=0)  # gone at once: once its charge is released, the watch has seen the rest
    terminating = {p["metadata"]["uid"] for p in held}
    eventually(_released(admin, namespace, terminating), timeout=RELEASED_WITHIN,
               what="the marker's charge released, the terminating pods' kept")
    admin.create(pod("new-0", namespace, gpu_container()))
    with pytest.raises(Refused) as refused:
        admin.create(pod("new-1", namespace, gpu_container()))
    assert f"namespace {namespace} uses 5 of 5" in refused.value.message
    # control: gone (grace 0), they free their GPUs at once
    for made in held:
        admin.delete(made, grace=0)
    eventually(lambda: len(charged(admin, namespace)) == 1, timeout=RELEASED_WITHIN,
               what="the terminating pods' charges released")
    for i in range(1, 5):
        admin.create(pod(f"new-{i}", namespace, gpu_container()))


def test_pods_admitted_while_no_cap_applied_are_charged_when_one_does(admin: Kube, burst: Burst) -> None:
    (namespace,) = burst()
    made = [admin.create(pod(f"p{i}", namespace, gpu_container())) for i in range(2)]
    ns = admin.get("v1", "Namespace", namespace)
    admin.patch(ns, {"metadata": {"labels": {BURST_LABEL: None}}})  # the caps stop applying here
    quiet = [admin.create(pod(f"q{i}", namespace, gpu_container())) for i in range(2)]
    admin.patch(ns, {"metadata": {"labels": {BURST_LABEL: "on"}}})  # and apply again: a recount
    every = {p["metadata"]["uid"] for p in made + quiet}
    eventually(lambda: set(charged(admin, namespace)) == every, timeout=QUOTA_WINDOW + 10,
               what="the recount charging the pods admitted meanwhile")
    admin.create(pod("last", namespace, gpu_container()))
    with pytest.raises(Refused) as refused:
        admin.create(pod("over", namespace, gpu_container()))
    assert f"namespace {namespace} uses 5 of 5" in refused.value.message


def test_audit_counts_charges_in_flight_as_used(admin: Kube, admission: Admission, burst: Burst, tmp_path: Path) -> None:
    (namespace,) = burst()
    made = [admin.create(pod(f"p{i}", namespace, gpu_container())) for i in range(3)]
    # a ledger as the webhook leaves it mid-burst: the 3 stored pods, and 2 admitted but not stored yet
    # (in a namespace of its own, which no server sweeps)
    ledgers = f"e2e-ledgers-{namespace[-8:]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ledgers}})
    key = LedgerKey("namespace", namespace, "", "nvidia.com/gpu.product")
    one = (("nvidia.com/gpu", Decimal(1)),)
    entries = {p["metadata"]["uid"]: Entry(Holding(namespace, p["metadata"]["name"], "", None, one), time.time())
               for p in made}
    entries |= {f"in-flight-{i}": Entry(Holding(namespace, f"coming-{i}", "", None, one), time.time()) for i in range(2)}
    client.CustomObjectsApi(admin.api).create_namespaced_custom_object(
        document.GROUP, document.VERSION, ledgers, document.PLURAL,
        document.new_object(key, ledgers, entries))
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod("next", namespace, gpu_container())))

    def audit(quota_namespace: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "webhook", "audit", "--cluster", "--kubeconfig",
                               str(admission.admin_kubeconfig), "--policies", str(admission.policies),
                               "--quota-namespace", quota_namespace, str(manifest)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)

    counted = audit(ledgers)
    assert counted.returncode == 1, counted.stdout + counted.stderr
    assert f"namespace {namespace} uses 5 of 5 nvidia.com/gpu" in counted.stdout, counted.stdout
    assert (f"note: GPU quota ledger: 2 charges in flight counted as used (pods admitted, not stored yet): "
            f"{namespace}/coming-0, {namespace}/coming-1") in counted.stderr, counted.stderr
    # without them (no ledger there), the 3 stored pods leave room
    empty = audit(f"{ledgers}-none")
    assert empty.returncode == 0, empty.stdout + empty.stderr
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ledgers}})


def _forge(admission: Admission, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """An AdmissionReview of a new GPU pod sent straight to the webhook's port, as kube-apiserver never sent it."""
    obj = pod(name, namespace, gpu_container())
    obj["metadata"]["uid"] = uid
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"review-{uid}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": namespace, "name": name, "object": obj, "dryRun": False}}
    ctx = ssl.create_default_context(cafile=str(admission.cert_dir / "ca.crt"))
    request = urllib.request.Request(f"https://127.0.0.1:{admission.port}/validate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:
        return dict(json.loads(answer.read())["response"])


def test_reviews_forged_to_the_webhooks_port_hold_no_gpus_past_the_window(admin: Kube, admission: Admission,
                                                                          burst: Burst) -> None:
    """Issue #42: a name no pod can have is refused and charges nothing; a ghost with a name a pod could have
    is charged (the webhook cannot tell), and released within the window: no pod by that uid exists."""
    (namespace,) = burst()
    refused = _forge(admission, namespace, "ghost%zz-0d6c5f0e", "ghost-uid-0")
    assert refused["allowed"] is False
    assert "cannot be charged to the GPU quota ledger: its name 'ghost%zz-0d6c5f0e' is not a DNS-1123 subdomain" in \
        refused["status"]["message"], refused
    ghosts = [_forge(admission, namespace, f"ghost-{i}", f"ghost-uid-{i + 1}") for i in range(3)]
    assert all(g["allowed"] for g in ghosts), ghosts
    assert set(charged(admin, namespace)) == {"ghost-uid-1", "ghost-uid-2", "ghost-uid-3"}
    eventually(_released(admin, namespace, set()), timeout=RELEASED_WITHIN, what="the ghosts' charges released")
    made, refusals = create_at_once(admin, [pod(f"p{i}", namespace, gpu_container()) for i in range(7)])
    assert len(made) == 5, refusals
