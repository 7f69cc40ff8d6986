"""Which namespaces reach gpu-admission: opted-in ones only, never the control plane's, and who may opt in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.admission import DEPLOY
from tests.e2e.apiserver import ApiServer
from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, Refused, documents, eventually

#: no node could ever run this; gpu-admission refuses it wherever it looks
INVALID_MIG = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-9g.99gb": 1}}}


def _untouched(stored: Object) -> None:
    assert not stored["spec"].get("runtimeClassName")
    assert "gpu-admission.io/mutated" not in (stored["metadata"].get("annotations") or {})


def test_a_namespace_not_opted_in_is_not_touched(admin: Kube, namespace: str, plain_namespace: str) -> None:
    # the same pods in an opted-in namespace prove the webhooks are up and looking right now
    mutated = admin.create(pod("gpu", namespace, gpu_container()), dry_run="All")
    assert mutated["spec"].get("runtimeClassName") == "nvidia"
    assert "gpu-admission.io/mutated" in mutated["metadata"]["annotations"]
    with pytest.raises(Refused):
        admin.create(pod("mig", namespace, INVALID_MIG), dry_run="All")
    _untouched(admin.create(pod("gpu", plain_namespace, gpu_container())))
    _untouched(admin.create(pod("mig", plain_namespace, INVALID_MIG)))


def test_kube_system_is_never_touched_even_when_labelled(admin: Kube, namespace: str) -> None:
    system = admin.get("v1", "Namespace", "kube-system")
    admin.patch(system, {"metadata": {"labels": {OPT_IN: "true"}}})
    try:
        # the opted-in namespace proves the webhooks are up and looking right now
        with pytest.raises(Refused):
            admin.create(pod("mig", namespace, INVALID_MIG), dry_run="All")
        _untouched(admin.create(pod("gpu", "kube-system", gpu_container()), dry_run="All"))
        _untouched(admin.create(pod("mig", "kube-system", INVALID_MIG), dry_run="All"))
    finally:
        admin.patch(system, {"metadata": {"labels": {OPT_IN: None}}})


EDITOR_TOKEN = "e2e-namespace-editor-token"
NAMESPACE_EDITOR: list[Object] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "e2e-namespace-editor"},
     "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "create", "update", "patch"]},
               # the other doors a namespace's labels go through (the label guard covers them too)
               {"apiGroups": [""], "resources": ["namespaces/status"], "verbs": ["get", "update", "patch"]},
               {"apiGroups": [""], "resources": ["namespaces/finalize"], "verbs": ["update"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "e2e-namespace-editor"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-namespace-editor"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "e2e-namespace-editor"}]},
]
OPT_IN_GRANT: Object = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "e2e-opt-in"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-admission-opt-in"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "e2e-namespace-editor"}],
}


@pytest.fixture
def editor(admin: Kube, apiserver: ApiServer, tmp_path: Path) -> Iterator[Kube]:
    """A user who may edit namespaces, with deploy/optional's label guard in force."""
    guard = documents(DEPLOY / "optional" / "label-guard.yaml")
    for obj in [*NAMESPACE_EDITOR, *guard]:
        admin.ensure(obj)
    user = Kube(apiserver.kubeconfig(tmp_path / "editor.kubeconfig", EDITOR_TOKEN))
    try:
        yield user
    finally:
        user.close()
        for obj in reversed([*NAMESPACE_EDITOR, *guard, OPT_IN_GRANT]):
            admin.delete(obj)


def _namespace(name: str, labels: dict[str, str]) -> Object:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_the_label_guard_keeps_opting_in_to_those_granted_the_verb(admin: Kube, editor: Kube) -> None:
    opted_in = _namespace("e2e-guarded", {OPT_IN: "true"})

    def refused_by_guard() -> Refused | None:
        try:
            editor.create(opted_in, dry_run="All")
        except Refused as exc:
            return exc if exc.status == 403 and "gpu-admission-label-guard" in exc.message else None
        return None

    refused = eventually(refused_by_guard, what="the label guard refusing an opt-in")
    assert 'needs the verb "label" on namespaces.gpu-admission.io' in refused.message
    plain = editor.create(_namespace("e2e-guarded", {"purpose": "vision"}))  # other labels need nothing
    with pytest.raises(Refused) as opting_in:
        editor.patch(plain, {"metadata": {"labels": {OPT_IN: "true"}}})
    assert "gpu-admission-opt-in" in opting_in.value.message
    admin.create(OPT_IN_GRANT)
    labelled = eventually(lambda: _try_patch(editor, plain, {"metadata": {"labels": {OPT_IN: "true"}}}),
                          what="the granted verb taking effect")
    assert labelled["metadata"]["labels"][OPT_IN] == "true"
    admin.delete(plain)


def _try_patch(kube: Kube, obj: Object, patch: Object) -> Object | None:
    try:
        return kube.patch(obj, patch)
    except Refused:
        return None


def _guard_refusal(attempt: Callable[[], object]) -> Refused | None:
    """The label guard's refusal of ``attempt``; None if it passed (and raise any other refusal)."""
    try:
        attempt()
    except Refused as exc:
        if exc.status == 403 and "gpu-admission-label-guard" in exc.message:
            return exc
        raise
    return None


def test_the_label_guard_covers_status_finalize_and_the_team_label(admin: Kube, editor: Kube) -> None:
    """A user granted namespaces/status and namespaces/finalize but not the verb "label" can remove
    neither the opt-in label nor the team label (which GPU quota caps count namespaces by) through
    them, nor change the team label or a workload-classes.gpu-admission.io/ label anywhere; other
    labels pass; once granted the verb, all pass."""
    created = admin.create(_namespace("e2e-doors", {OPT_IN: "true", "team": "vision",
                                                    "workload-classes.gpu-admission.io/training": "true"}))
    try:
        def status_patch(labels: dict[str, str | None], **query: str) -> Callable[[], object]:
            return lambda: editor.patch(created, {"metadata": {"labels": labels}}, subresource="status", **query)

        def finalize_without(key: str) -> Callable[[], object]:
            def put() -> object:
                current = editor.get("v1", "Namespace", "e2e-doors")
                current["metadata"]["labels"].pop(key)
                return editor.replace(current, subresource="finalize")
            return put

        # the guard (created by the fixture) takes a moment to be in force: asked by dry runs, which
        # change nothing if it is not yet
        eventually(lambda: _guard_refusal(lambda: editor.patch(created, {"metadata": {"labels": {OPT_IN: None}}},
                                                               dry_run="All")),
                   what="the label guard in force")
        refused = _guard_refusal(status_patch({OPT_IN: None}))
        assert refused is not None and "opting namespace e2e-doors out of GPU admission" in refused.message
        by_finalize = _guard_refusal(finalize_without(OPT_IN))
        assert by_finalize is not None and "opting namespace e2e-doors out of" in by_finalize.message
        for attempt in (status_patch({"team": "robotics"}), status_patch({"team": None}), finalize_without("team"),
                        lambda: editor.patch(created, {"metadata": {"labels": {"team": "robotics"}}})):
            team = _guard_refusal(attempt)
            assert team is not None and "changing the label team of namespace e2e-doors" in team.message
        # a namespace allowing itself a workload class (and its priority): set through any door, or removed
        allow = "workload-classes.gpu-admission.io/inference"
        for attempt in (lambda: editor.patch(created, {"metadata": {"labels": {allow: "true"}}}),
                        status_patch({allow: "true"}), status_patch({"workload-classes.gpu-admission.io/training": None})):
            allowing = _guard_refusal(attempt)
            assert allowing is not None and "changing the label workload-classes.gpu-admission.io/" in allowing.message
        labels = admin.get("v1", "Namespace", "e2e-doors")["metadata"]["labels"]
        assert labels[OPT_IN] == "true" and labels["team"] == "vision" and allow not in labels
        assert labels["workload-classes.gpu-admission.io/training"] == "true"
        # controls: an ordinary label passes through every door
        assert _guard_refusal(status_patch({"purpose": "status"})) is None
        assert _guard_refusal(lambda: editor.patch(created, {"metadata": {"labels": {"purpose": "main"}}})) is None
        assert _guard_refusal(finalize_without("purpose")) is None
        # granted the verb, every door opens
        admin.create(OPT_IN_GRANT)
        eventually(lambda: _guard_refusal(status_patch({"team": "robotics"}, dry_run="All")) is None,
                   what="the granted verb taking effect")
        assert _guard_refusal(status_patch({"team": "robotics"})) is None
        assert _guard_refusal(finalize_without(OPT_IN)) is None
        assert _guard_refusal(status_patch({"team": None})) is None
        labels = admin.get("v1", "Namespace", "e2e-doors")["metadata"]["labels"]
        assert OPT_IN not in labels and "team" not in labels
    finally:
        admin.delete(created)
