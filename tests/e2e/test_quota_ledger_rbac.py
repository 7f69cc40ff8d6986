"""Only the webhook's ServiceAccount writes the GPU quota ledger: a namespace editor cannot free quota.

A team member with Kubernetes' own editing rights in their namespace
(``system:aggregate-to-edit``, what the ``edit`` ClusterRole aggregates) fills
the namespace's cap, then tries to give the GPUs back by editing the ledger
in gpu-admission's namespace: every verb is refused, and the cap holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.admission import NAMESPACE, SERVICE_ACCOUNT
from tests.e2e.apiserver import ApiServer
from tests.e2e.conftest import Burst
from tests.e2e.fixtures import charged, gpu_container, ledgers, pod
from tests.e2e.kube import Kube, Refused, eventually
from webhook.ledger import document

USER = "e2e-team-editor"


@pytest.fixture
def team_editor(admin: Kube, apiserver: ApiServer, burst: Burst, tmp_path: Path) -> Iterator[tuple[Kube, str]]:
    """A user who may edit everything a namespace editor may, in one namespace under the caps."""
    (namespace,) = burst()
    admin.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "team-editor", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:aggregate-to-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    })
    user = Kube(apiserver.kubeconfig(tmp_path / "team-editor.kubeconfig", f"{USER}-token"))
    try:
        yield user, namespace
    finally:
        user.close()


def _allowed(admin: Kube, user: str, verb: str, groups: list[str] | None = None) -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=groups, resource_attributes=client.V1ResourceAttributes(
            namespace=NAMESPACE, verb=verb, group=document.GROUP, resource=document.PLURAL)))
    answer = client.AuthorizationV1Api(admin.api).create_subject_access_review(review)
    return answer.status is not None and bool(answer.status.allowed)


def test_a_namespace_editor_cannot_free_quota_by_editing_the_ledger(admin: Kube, team_editor: tuple[Kube, str]) -> None:
    user, namespace = team_editor
    eventually(lambda: _can_create_pods(user, namespace), what="the editor's grant taking effect")
    for i in range(5):
        user.create(pod(f"p{i}", namespace, gpu_container()))
    charges = charged(admin, namespace)
    assert len(charges) == 5
    custom = client.CustomObjectsApi(user.api)
    # the namespace's charges are in its team's ledger (its namespace cap is judged there)
    (key,) = {k for k, held in document.effective(ledgers(admin)).items() if set(held) & set(charges)}
    name = document.name_of(key)
    attempts = {
        "patch": lambda: custom.patch_namespaced_custom_object(
            document.GROUP, document.VERSION, NAMESPACE, document.PLURAL, name,
            {"status": {"charges": ""}}),
        "delete": lambda: custom.delete_namespaced_custom_object(
            document.GROUP, document.VERSION, NAMESPACE, document.PLURAL, name),
        "create": lambda: custom.create_namespaced_custom_object(
            document.GROUP, document.VERSION, NAMESPACE, document.PLURAL,
            {"apiVersion": document.API_VERSION, "kind": document.KIND,
             "metadata": {"name": "mine"}, "spec": {"scope": "namespace", "group": namespace, "modelLabel": "x"}}),
        "get": lambda: custom.get_namespaced_custom_object(
            document.GROUP, document.VERSION, NAMESPACE, document.PLURAL, name),
    }
    for verb, attempt in attempts.items():
        with pytest.raises(ApiException) as refused:
            attempt()
        assert refused.value.status == 403, (verb, refused.value.status)
    assert charged(admin, namespace) == charges
    with pytest.raises(Refused) as over:
        user.create(pod("p5", namespace, gpu_container()))
    assert f"namespace {namespace} uses 5 of 5" in over.value.message
    # who may: the webhook's ServiceAccount, and nobody the namespace's own accounts stand for
    account = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    assert _allowed(admin, account, "patch", ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"])
    assert not _allowed(admin, USER, "patch")
    assert not _allowed(admin, f"system:serviceaccount:{namespace}:default", "patch",
                        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"])


def _can_create_pods(user: Kube, namespace: str) -> bool:
    try:
        user.create(pod("probe", namespace, gpu_container()), dry_run="All")
    except Refused:
        return False
    return True
