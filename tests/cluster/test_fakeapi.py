"""The fake API server answers the real client as kube-apiserver would.

Other tests trust the fake, so its protocol is pinned here: list and watch
shapes, pagination, resourceVersion semantics, Status errors, TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client

from tests.fakeapi import INITIAL_EVENTS_END, FakeApiServer

from . import builders


def _raw(response: Any) -> dict[str, Any]:
    return json.loads(response.data)  # type: ignore[no-any-return]


def _events(response: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.data.decode().splitlines() if line]


def _status(exc: client.ApiException) -> dict[str, Any]:
    assert exc.body is not None
    return json.loads(exc.body)  # type: ignore[no-any-return]


def _names(objects: Iterable[client.V1Namespace]) -> list[str | None]:
    names = []
    for obj in objects:
        assert obj.metadata is not None
        names.append(obj.metadata.name)
    return names


def test_list_has_the_api_server_shape(api: FakeApiServer) -> None:
    api.add(builders.pod("a"))
    body = _raw(client.CoreV1Api(api.api_client()).list_namespaced_pod("default", _preload_content=False))
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert body["metadata"] == {"resourceVersion": api.resource_version}
    (item,) = body["items"]
    assert "kind" not in item and "apiVersion" not in item
    meta = item["metadata"]
    assert {"uid", "creationTimestamp", "resourceVersion", "managedFields"} <= set(meta)
    assert int(meta["resourceVersion"]) <= int(api.resource_version)
    typed = client.SchedulingV1Api(api.api_client()).list_priority_class()
    assert typed.items == [] and typed.metadata is not None
    assert typed.metadata.resource_version == api.resource_version


def test_resource_versions_are_global_and_increasing(api: FakeApiServer) -> None:
    first = api.add(builders.node("n1"))["metadata"]["resourceVersion"]
    second = api.add(builders.namespace("team-a"))["metadata"]["resourceVersion"]
    third = api.modify(builders.node("n1"))["metadata"]["resourceVersion"]
    assert int(first) < int(second) < int(third) == int(api.resource_version)


def test_pagination_is_a_consistent_snapshot(api: FakeApiServer) -> None:
    api.add_many(builders.pod(f"p{i:02}") for i in range(7))
    v1 = client.CoreV1Api(api.api_client())
    page = _raw(v1.list_pod_for_all_namespaces(limit=3, _preload_content=False))
    assert [p["metadata"]["name"] for p in page["items"]] == ["p00", "p01", "p02"]
    assert page["metadata"]["remainingItemCount"] == 4
    list_rv = page["metadata"]["resourceVersion"]
    api.delete("Pod", "p05", "default")  # after the first page: not seen by this list
    api.add(builders.pod("p99"))
    names = []
    while page["metadata"].get("continue"):
        names += [p["metadata"]["name"] for p in page["items"]]
        page = _raw(v1.list_pod_for_all_namespaces(limit=3, _continue=page["metadata"]["continue"],
                                                   _preload_content=False))  # fmt: skip
        assert page["metadata"]["resourceVersion"] == list_rv
    names += [p["metadata"]["name"] for p in page["items"]]
    assert names == [f"p{i:02}" for i in range(7)]


def test_continue_token_expires_with_compaction(api: FakeApiServer) -> None:
    api.add_many(builders.pod(f"p{i}") for i in range(4))
    v1 = client.CoreV1Api(api.api_client())
    token = _raw(v1.list_pod_for_all_namespaces(limit=2, _preload_content=False))["metadata"]["continue"]
    api.add(builders.pod("later"))
    api.compact()
    with pytest.raises(client.ApiException) as caught:
        v1.list_pod_for_all_namespaces(limit=2, _continue=token)
    assert caught.value.status == 410
    status = _status(caught.value)
    assert status["kind"] == "Status" and status["reason"] == "Expired" and status["code"] == 410


def test_watch_replays_history_from_a_resource_version(api: FakeApiServer) -> None:
    start = api.resource_version
    api.add(builders.pod("a"))
    api.modify(builders.pod("a", phase="Succeeded"))
    api.delete("Pod", "a", "default")
    api.add(builders.node("n1"))  # another resource: not in the pod stream
    v1 = client.CoreV1Api(api.api_client())
    events = _events(v1.list_pod_for_all_namespaces(watch=True, resource_version=start, timeout_seconds=1,
                                                    _preload_content=False))  # fmt: skip
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert all(e["object"]["kind"] == "Pod" and e["object"]["apiVersion"] == "v1" for e in events)
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[-1] < int(api.resource_version)


def test_watch_without_resource_version_starts_with_synthetic_adds(api: FakeApiServer) -> None:
    api.add(builders.runtime_class("nvidia"))
    api_client = api.api_client()
    events = _events(client.NodeV1Api(api_client).list_runtime_class(
        watch=True, timeout_seconds=1, allow_watch_bookmarks=True, send_initial_events=True,
        resource_version_match="NotOlderThan", _preload_content=False))  # fmt: skip
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    bookmark = events[1]["object"]
    assert bookmark == {"kind": "RuntimeClass", "apiVersion": "node.k8s.io/v1",
                        "metadata": {"resourceVersion": api.resource_version,
                                     "annotations": {INITIAL_EVENTS_END: "true"}}}  # fmt: skip


def test_watch_from_a_compacted_version_gets_an_expired_error_event(api: FakeApiServer) -> None:
    old = api.resource_version
    api.add(builders.pod("a"))
    api.compact()
    events = _events(client.CoreV1Api(api.api_client()).list_pod_for_all_namespaces(
        watch=True, resource_version=old, timeout_seconds=5, _preload_content=False))  # fmt: skip
    (error,) = events
    assert error["type"] == "ERROR"
    assert error["object"] == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": f"too old resource version: {old} ({api.resource_version})",
                               "reason": "Expired", "code": 410}  # fmt: skip


def test_crud_answers_with_status_objects(api: FakeApiServer) -> None:
    v1 = client.CoreV1Api(api.api_client())
    with pytest.raises(client.ApiException) as missing:
        v1.read_namespaced_secret("tls", "default")
    assert missing.value.status == 404
    assert _status(missing.value) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": 'secrets "tls" not found', "reason": "NotFound",
                                      "details": {"name": "tls", "kind": "secrets"}, "code": 404}  # fmt: skip
    tls = client.V1ObjectMeta(name="tls")
    created = v1.create_namespaced_secret("default", client.V1Secret(metadata=tls, string_data={"ca": "x"}))
    assert created.data == {"ca": "eA=="} and created.metadata is not None and created.metadata.uid
    with pytest.raises(client.ApiException) as exists:
        v1.create_namespaced_secret("default", client.V1Secret(metadata=tls))
    assert exists.value.status == 409 and _status(exists.value)["reason"] == "AlreadyExists"
    stale = created.to_dict()
    v1.patch_namespaced_secret("tls", "default", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(client.ApiException) as conflict:
        v1.replace_namespaced_secret("tls", "default", client.V1Secret(metadata=client.V1ObjectMeta(
            name="tls", resource_version=stale["metadata"]["resource_version"])))
    assert conflict.value.status == 409 and _status(conflict.value)["reason"] == "Conflict"
    with pytest.raises(client.ApiException) as no_namespace:
        v1.create_namespaced_secret("nowhere", client.V1Secret(metadata=tls))
    assert no_namespace.value.status == 404 and "namespaces" in _status(no_namespace.value)["message"]


def test_webhook_configurations_patch_by_merge_and_json_patch(api: FakeApiServer) -> None:
    admission = client.AdmissionregistrationV1Api(api.api_client())
    webhook = client.V1ValidatingWebhook(
        name="gpu.example.com", admission_review_versions=["v1"], side_effects="None",
        client_config=client.AdmissionregistrationV1WebhookClientConfig(
            service=client.AdmissionregistrationV1ServiceReference(name="gpu", namespace="default")))
    created = admission.create_validating_webhook_configuration(
        client.V1ValidatingWebhookConfiguration(metadata=client.V1ObjectMeta(name="gpu"), webhooks=[webhook]))
    assert created.metadata is not None and created.metadata.generation == 1
    admission.patch_validating_webhook_configuration(
        "gpu", {"webhooks": [{"name": "gpu.example.com", "clientConfig": {"caBundle": "Q0E="}}]})
    stored = api.get("ValidatingWebhookConfiguration", "gpu")
    assert stored is not None
    assert stored["webhooks"][0]["clientConfig"] == {"service": {"name": "gpu", "namespace": "default"},
                                                     "caBundle": "Q0E="}  # fmt: skip
    admission.patch_validating_webhook_configuration(
        "gpu", [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": "TkVX"}])
    stored = api.get("ValidatingWebhookConfiguration", "gpu")
    assert stored is not None and stored["webhooks"][0]["clientConfig"]["caBundle"] == "TkVX"
    assert stored["metadata"]["generation"] == 3
    with pytest.raises(client.ApiException) as missing:
        admission.read_mutating_webhook_configuration("gpu")
    assert _status(missing.value)["details"] == {"name": "gpu", "group": "admissionregistration.k8s.io",
                                                 "kind": "mutatingwebhookconfigurations"}  # fmt: skip


def test_fail_next_and_request_log(api: FakeApiServer) -> None:
    v1 = client.CoreV1Api(api.api_client())
    api.fail_next(2, status=503, path_contains="/nodes")
    for _ in range(2):
        with pytest.raises(client.ApiException) as failed:
            v1.list_node()
        assert failed.value.status == 503 and _status(failed.value)["reason"] == "ServiceUnavailable"
    v1.list_namespace()
    assert v1.list_node().items == []
    assert [r.status for r in api.requests(path_contains="/nodes")] == [503, 503, 200]


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context, str(cert_path)


def test_serves_tls_when_given_a_context(tmp_path: Path) -> None:
    context, ca = _self_signed(tmp_path)
    with FakeApiServer(ssl_context=context) as api:
        assert api.url.startswith("https://127.0.0.1:")
        names = _names(client.CoreV1Api(api.api_client(ssl_ca_cert=ca)).list_namespace().items)
        assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
