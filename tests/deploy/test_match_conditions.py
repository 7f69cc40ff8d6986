"""The CEL in deploy/ does what its comments say, on real API server requests.

The webhooks' matchConditions run on the AdmissionReview requests that
kube-apiserver 1.36 sent (../shared/corpus), and on variants of them built
here; the label guard's policy runs on namespace create/update requests.
The evaluator is cel-python. Like cel-go in the API server it fails on a
missing map key, so an unguarded field access on any of these inputs fails
the test; unlike cel-go it forgives a missing intermediate inside has(), so
test_has_guards_each_level checks those guards statically.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import celpy
import pytest
from celpy import celtypes

import deploy_tree

CORPUS = deploy_tree.SHARED / "corpus" / "admissionreviews" / "kube-apiserver-1.36"
BASE = deploy_tree.base()
WEBHOOKS = [
    hook
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    for hook in deploy_tree.one(kind, docs=BASE)["webhooks"]
]
HOOK_IDS = [h["name"] for h in WEBHOOKS]
ENV = celpy.Environment()


def _program(expression: str) -> Any:
    return ENV.program(ENV.compile(expression))


def _activation(request: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """CEL variables as the API server binds them: `request` is the
    AdmissionRequest without object/oldObject, omitempty fields absent."""
    bare = {k: v for k, v in request.items() if k not in ("object", "oldObject")}
    return {
        "request": celpy.json_to_cel(bare),
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
        **extra,
    }


def _rule_matches(hook: dict[str, Any], request: dict[str, Any]) -> bool:
    """The API server's rule match (exact versions; the corpus is all v1)."""
    res = request["resource"]
    sub = request.get("subResource", "")
    resource = f"{res['resource']}/{sub}" if sub else res["resource"]
    for rule in hook["rules"]:
        if (request["operation"] in rule["operations"] or "*" in rule["operations"]) \
                and (res["group"] in rule["apiGroups"] or "*" in rule["apiGroups"]) \
                and (res["version"] in rule["apiVersions"] or "*" in rule["apiVersions"]) \
                and resource in rule["resources"]:
            return True
    return False


def _conditions(hook: dict[str, Any], request: dict[str, Any]) -> dict[str, bool]:
    """Each matchCondition's result; an evaluation error fails the test, as it
    would make the API server apply failurePolicy (Fail: reject)."""
    results = {}
    for condition in hook["matchConditions"]:
        try:
            value = _program(condition["expression"]).evaluate(_activation(request))
        except celpy.CELEvalError as exc:
            pytest.fail(f"{condition['name']} errors on {request.get('name')}: {exc}")
        assert isinstance(value, celtypes.BoolType), (condition["name"], value)
        results[condition["name"]] = bool(value)
    return results


def _sent(hook: dict[str, Any], request: dict[str, Any]) -> bool:
    return _rule_matches(hook, request) and all(_conditions(hook, request).values())


def _corpus(name: str) -> dict[str, Any]:
    path = CORPUS / name
    if not path.is_file():
        pytest.skip(f"corpus not found: {path}")
    return json.loads(path.read_text("utf-8"))["request"]


def _pod(name: str = "000_mutate_create_pods_.json") -> dict[str, Any]:
    return copy.deepcopy(_corpus(name))


def _set_resources(request: dict[str, Any], resources: Any, init: bool = False) -> dict[str, Any]:
    spec = request["object"]["spec"]
    for container in spec["containers"]:
        if resources is None:
            container.pop("resources", None)
        else:
            container["resources"] = copy.deepcopy(resources)
    if init:
        spec["initContainers"] = [{"name": "fetch", "image": "busybox",
                                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return request


def _claims(request: dict[str, Any], claims: list[Any] | None = None) -> dict[str, Any]:
    """The pod asks for its GPU as NVIDIA's DRA demo pods do: a claim from a template."""
    spec = request["object"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}] if claims is None else claims
    for container in spec["containers"]:
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return request


def _claim_request(kind: str, version: str = "v1", owner: str | None = None) -> dict[str, Any]:
    """A CREATE of a ResourceClaim or ResourceClaimTemplate, built from the pod request's envelope."""
    request = copy.deepcopy(_corpus("001_validate_create_pods_.json"))
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[kind]
    for key in ("kind", "requestKind"):
        request[key] = {"group": "resource.k8s.io", "version": version, "kind": kind}
    for key in ("resource", "requestResource"):
        request[key] = {"group": "resource.k8s.io", "version": version, "resource": plural}
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    request["object"] = {"apiVersion": f"resource.k8s.io/{version}", "kind": kind,
                         "metadata": {"name": "gpu", "namespace": request["namespace"]},
                         "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}
    if owner:  # the resourceclaim controller's claim for a pod
        request["object"]["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": owner, "name": "p", "uid": "u", "controller": True}]
    return request


# (kind, version, owner, sent to the validating webhook?) — the mutating one never sees claims
CLAIM_CASES = [
    ("ResourceClaim", "v1", None, True),
    ("ResourceClaimTemplate", "v1", None, True),
    ("ResourceClaimTemplate", "v1beta1", None, True),  # every served version
    ("ResourceClaim", "v1beta2", None, True),
    # generated from a template, or an owner forged by the tenant (issue #42 row 8): the webhook
    # cannot tell them apart by ownerReferences, so every claim is sent and checked
    ("ResourceClaim", "v1", "Pod", True),
    ("ResourceClaim", "v1", "ConfigMap", True),
    ("ResourceClaimTemplate", "v1", "ConfigMap", True),
]


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
@pytest.mark.parametrize("kind,version,owner,expected", CLAIM_CASES,
                         ids=[f"{k} {v} {o or 'unowned'}" for k, v, o, _ in CLAIM_CASES])
def test_dra_claims_reach_the_validating_webhook_only(hook: dict[str, Any], kind: str, version: str,
                                                      owner: str | None, expected: bool) -> None:
    validating = hook["name"].startswith("validate.")
    assert _sent(hook, _claim_request(kind, version, owner)) is (expected and validating)


def _owned(request: dict[str, Any], kind: str, controller: bool | None) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "name": "owner",
                           "uid": "7b0c7a4e-0000-4000-8000-000000000001"}
    if controller is not None:
        ref["controller"] = controller
    request["object"]["metadata"]["ownerReferences"] = [ref]
    return request


def _as_replicaset(deployment_request: dict[str, Any]) -> dict[str, Any]:
    request = copy.deepcopy(deployment_request)
    for key in ("kind", "requestKind"):
        request[key] = {"group": "apps", "version": "v1", "kind": "ReplicaSet"}
    for key in ("resource", "requestResource"):
        request[key] = {"group": "apps", "version": "v1", "resource": "replicasets"}
    request["object"]["kind"] = "ReplicaSet"
    return request


# Real requests, as sent: (file, sent to both webhooks? or per webhook)
CORPUS_CASES = [
    ("000_mutate_create_pods_.json", True),
    ("001_validate_create_pods_.json", True),
    ("002_mutate_create_pods_.json", True),
    ("004_mutate_update_pods_.json", True),
    ("006_mutate_create_deployments_.json", True),
    ("007_mutate_create_jobs_.json", True),
    ("008_mutate_create_cronjobs_.json", True),
    ("009_mutate_delete_pods_.json", False),  # DELETE: not in the rules
    ("011_mutate_create_pods_dryrun.json", True),
    ("013_mutate_create_statefulsets_.json", True),
    ("014_mutate_create_daemonsets_.json", False),  # dcgm-exporter: its template asks for no GPU
    # a debug container added to a GPU pod: the validating webhook alone judges it (issue #42)
    ("015_mutate_update_pods_ephemeralcontainers_.json", {"mutate": False, "validate": True}),
    ("017_validate_create_pytorchjobs_.json", True),
    ("018_validate_create_rayclusters_.json", True),
]


def _template(request: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload request's template (CronJobs nest theirs in a Job's)."""
    spec = request["object"]["spec"]
    return (spec["jobTemplate"]["spec"] if "jobTemplate" in spec else spec)["template"]["spec"]


def _without_gpus(request: dict[str, Any]) -> dict[str, Any]:
    for container in _template(request)["containers"]:
        for field in ("limits", "requests"):
            for name in [n for n in (container.get("resources") or {}).get(field, {}) if "gpu" in n]:
                del container["resources"][field][name]
    return request


TEMPLATES = ["006_mutate_create_deployments_.json", "007_mutate_create_jobs_.json",
             "008_mutate_create_cronjobs_.json", "013_mutate_create_statefulsets_.json"]


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
@pytest.mark.parametrize("name", TEMPLATES)
def test_built_in_workloads_are_sent_only_when_their_template_asks_for_a_gpu(hook: dict[str, Any], name: str) -> None:
    """A Deployment, Job, CronJob or StatefulSet without GPUs costs no call, and an outage cannot block it."""
    assert _sent(hook, _pod(name)) is True
    plain = _without_gpus(_pod(name))
    assert _conditions(hook, plain)["workload-templates-requesting-gpus"] is False
    assert _sent(hook, plain) is False
    claims = _without_gpus(_pod(name))
    _template(claims)["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    assert _sent(hook, claims) is True
    mig = _without_gpus(_pod(name))
    _template(mig).setdefault("initContainers", []).append(
        {"name": "i", "image": "x", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}})
    assert _sent(hook, mig) is True
    for reach in ({"runtimeClassName": "nvidia"}, {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]}):
        reaching = _without_gpus(_pod(name))
        _template(reaching).update(reach)
        assert _sent(hook, reaching) is True, reach  # issue #42: it could reach GPUs without asking
    env = _without_gpus(_pod(name))
    _template(env)["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert _sent(hook, env) is True
    odd = _pod(name)
    odd["object"]["spec"].pop("jobTemplate", None)
    odd["object"]["spec"].pop("template", None)
    assert _conditions(hook, odd)["workload-templates-requesting-gpus"] is False  # no error, not sent


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
def test_custom_resource_workloads_are_sent_as_they_are(hook: dict[str, Any]) -> None:
    assert _conditions(hook, _pod("017_validate_create_pytorchjobs_.json"))["workload-templates-requesting-gpus"] is True


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
@pytest.mark.parametrize("name,expected", CORPUS_CASES, ids=[c[0] for c in CORPUS_CASES])
def test_real_requests(hook: dict[str, Any], name: str, expected: bool | dict[str, bool]) -> None:
    if isinstance(expected, dict):
        expected = expected[hook["name"].split(".")[0]]
    assert _sent(hook, _corpus(name)) is expected


def test_every_corpus_request_evaluates_without_error() -> None:
    if not CORPUS.is_dir():
        pytest.skip(f"corpus not found: {CORPUS}")
    files = sorted(CORPUS.glob("*.json"))
    assert files
    for path in files:
        request = json.loads(path.read_text("utf-8"))["request"]
        for hook in WEBHOOKS:
            if request.get("object") is not None:
                _conditions(hook, request)


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
def test_subresource_requests_are_kept_away_even_if_rules_widen(hook: dict[str, Any]) -> None:
    """Debug containers go to the validating webhook alone; every other subresource to none."""
    request = _pod("015_mutate_update_pods_ephemeralcontainers_.json")
    assert request["subResource"] == "ephemeralcontainers"
    validating = hook["name"].startswith("validate.")
    assert _conditions(hook, request)["exclude-subresources"] is validating
    assert _rule_matches(hook, request) is validating
    request["subResource"] = "status"
    assert _conditions(hook, request)["exclude-subresources"] is False
    deployment = _pod("006_mutate_create_deployments_.json")
    deployment["subResource"] = "ephemeralcontainers"  # no such subresource: the condition names pods'
    assert _conditions(hook, deployment)["exclude-subresources"] is False
    assert _conditions(hook, _pod())["exclude-subresources"] is True


def _debug(request: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """015's request with ``container`` as the debug container, on the pod made a CPU pod."""
    spec = request["object"]["spec"]
    spec["ephemeralContainers"] = [{"name": "debug", "image": "busybox:1.36", **container}]
    for c in [*spec["containers"], *request["oldObject"]["spec"]["containers"]]:
        c.pop("resources", None)
    return request


# (description, the debug container, sent to the validating webhook?) — never to the mutating one
DEBUG_CASES = [
    ("a plain debug container on a CPU pod", {}, False),
    ("NVIDIA_VISIBLE_DEVICES=all on a CPU pod", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, True),
    ("an NVIDIA_ envFrom prefix on a CPU pod", {"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}]}, True),
    # privileged is refused only in GPU pods, which are sent anyway
    ("privileged on a CPU pod", {"securityContext": {"privileged": True}}, False),
]


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
@pytest.mark.parametrize("case,container,expected", DEBUG_CASES, ids=[c[0] for c in DEBUG_CASES])
def test_debug_containers_that_reach_gpus_are_sent_to_the_validating_webhook(
    hook: dict[str, Any], case: str, container: dict[str, Any], expected: bool
) -> None:
    request = _debug(_pod("015_mutate_update_pods_ephemeralcontainers_.json"), container)
    assert _sent(hook, request) is (expected and hook["name"].startswith("validate."))


# (description, how to change the GPU pod of 000, sent?)
POD_VARIANTS = [
    ("cpu only", lambda r: _set_resources(r, {"limits": {"cpu": "1", "memory": "1Gi"}}), False),
    ("no resources field", lambda r: _set_resources(r, None), False),
    ("empty resources", lambda r: _set_resources(r, {}), False),
    ("requests only", lambda r: _set_resources(r, {"requests": {"nvidia.com/gpu": "1"}}), True),
    ("limits only", lambda r: _set_resources(r, {"limits": {"nvidia.com/gpu": "1"}}), True),
    ("MIG device", lambda r: _set_resources(r, {"limits": {"nvidia.com/mig-1g.10gb": "1"}}), True),
    ("shared GPU", lambda r: _set_resources(r, {"limits": {"nvidia.com/gpu.shared": "1"}}), True),
    ("AMD GPU", lambda r: _set_resources(r, {"limits": {"amd.com/gpu": "1"}}), True),
    ("HAMi memory", lambda r: _set_resources(r, {"limits": {"nvidia.com/gpumem": "4000"}}), True),
    ("GPU in an init container only", lambda r: _set_resources(r, None, init=True), True),
    ("no containers at all", lambda r: (r["object"]["spec"].pop("containers"), r)[1], False),
    # NVIDIA's DRA quickstart pods (corpus/manifests/NVIDIA__k8s-dra-driver__demo__specs__quickstart__*):
    # no GPU resource name anywhere, the GPU comes through a claim
    ("DRA claim, no resources", lambda r: _claims(_set_resources(r, None)), True),
    ("DRA claim, empty list", lambda r: _claims(_set_resources(r, None), []), False),
    ("owned GPU pod", lambda r: _owned(r, "ReplicaSet", True), True),
    # issue #42: pods that could reach a node's GPUs without requesting one (policies/gpu-access-guard.yaml)
    ("cpu, runtimeClassName", lambda r: _cpu(r, runtimeClassName="nvidia"), True),
    ("cpu, empty runtimeClassName", lambda r: _cpu(r, runtimeClassName=""), False),
    ("cpu, hostPath", lambda r: _cpu(r, volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]), True),
    ("cpu, other volumes", lambda r: _cpu(r, volumes=[{"name": "d", "emptyDir": {}}]), False),
    ("cpu, NVIDIA_VISIBLE_DEVICES", lambda r: _cpu(r, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), True),
    ("cpu, NVIDIA_DRIVER_CAPABILITIES in an init container",
     lambda r: _cpu(r, init_env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]), True),
    ("cpu, other env", lambda r: _cpu(r, env=[{"name": "PORT", "value": "80"}]), False),
    ("cpu, env without a name", lambda r: _cpu(r, env=[{"value": "80"}]), False),
    ("cpu, envFrom prefix NVIDIA_", lambda r: _cpu(r, envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}]), True),
    ("cpu, envFrom prefix NVIDIA_MIG_M", lambda r: _cpu(r, envFrom=[{"prefix": "NVIDIA_MIG_M", "secretRef": {"name": "m"}}]), True),
    ("cpu, envFrom prefix N", lambda r: _cpu(r, envFrom=[{"prefix": "N", "configMapRef": {"name": "m"}}]), True),
    ("cpu, envFrom prefix APP_", lambda r: _cpu(r, envFrom=[{"prefix": "APP_", "configMapRef": {"name": "m"}}]), False),
    ("cpu, envFrom prefix VISIBLE_DEVICES", lambda r: _cpu(r, envFrom=[{"prefix": "VISIBLE_DEVICES", "configMapRef": {"name": "m"}}]), False),
    ("cpu, envFrom without prefix", lambda r: _cpu(r, envFrom=[{"configMapRef": {"name": "m"}}]), False),
    # privileged is refused only in GPU pods, which are sent anyway
    ("cpu, privileged", lambda r: _cpu(r, privileged=True), False),
]


def _cpu(request: dict[str, Any], env: list[Any] | None = None, init_env: list[Any] | None = None,
         envFrom: list[Any] | None = None, privileged: bool = False, **spec: Any) -> dict[str, Any]:
    """000's pod without GPUs, with these pod spec fields and container settings."""
    _set_resources(request, {"limits": {"cpu": "1"}})
    pod = request["object"]["spec"]
    pod.update(spec)
    for container in pod["containers"]:
        if env is not None:
            container["env"] = env
        if envFrom is not None:
            container["envFrom"] = envFrom
        if privileged:
            container["securityContext"] = {"privileged": True}
    if init_env is not None:
        pod["initContainers"] = [{"name": "init", "image": "busybox", "env": init_env}]
    return request


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
@pytest.mark.parametrize("variant,expected", [(v, e) for v, _, e in POD_VARIANTS],
                         ids=[v for v, _, _ in POD_VARIANTS])
def test_pods_are_sent_only_when_they_ask_for_or_reach_a_gpu(hook: dict[str, Any], variant: str,
                                                    expected: bool) -> None:
    change = next(c for v, c, _ in POD_VARIANTS if v == variant)
    request = change(_pod())
    assert _sent(hook, request) is expected
    if request.get("oldObject"):
        return
    update = copy.deepcopy(request)  # UPDATE carries both objects
    update["operation"], update["oldObject"] = "UPDATE", copy.deepcopy(request["object"])
    assert _sent(hook, update) is expected


@pytest.mark.parametrize("hook", WEBHOOKS, ids=HOOK_IDS)
def test_controller_owned_workloads_are_left_to_their_owner(hook: dict[str, Any]) -> None:
    deployment = _corpus("006_mutate_create_deployments_.json")
    replicaset = _as_replicaset(deployment)
    assert _sent(hook, copy.deepcopy(replicaset)) is True  # a bare ReplicaSet
    assert _sent(hook, _owned(copy.deepcopy(replicaset), "Deployment", True)) is False
    # An owner that is not the controller does not write the template.
    assert _sent(hook, _owned(copy.deepcopy(replicaset), "Deployment", False)) is True
    assert _sent(hook, _owned(copy.deepcopy(replicaset), "Deployment", None)) is True
    job = _owned(copy.deepcopy(_corpus("007_mutate_create_jobs_.json")), "CronJob", True)
    assert _sent(hook, job) is False


# has(a.b.c) in cel-go fails when a.b is absent; cel-python answers false.
# So every has() argument's parent must be guarded by a has() of its own,
# be a variable, or be a field the API server always sets.
ALWAYS_PRESENT = {"object.metadata", "oldObject.metadata", "request.resource", "request"}
_HAS = re.compile(r"has\(([A-Za-z_][\w.]*)\)")


def _cel_sources() -> list[tuple[str, str]]:
    found = [(f"{h['name']}/{c['name']}", c["expression"])
             for h in WEBHOOKS for c in h["matchConditions"]]
    policy = deploy_tree.one("ValidatingAdmissionPolicy", "gpu-admission-label-guard")["spec"]
    found += [(f"label-guard/{v['name']}", v["expression"]) for v in policy["variables"]]
    found += [(f"label-guard/validation{i}", v["expression"])
              for i, v in enumerate(policy["validations"])]
    return found


@pytest.mark.parametrize("where,expression", _cel_sources(), ids=[w for w, _ in _cel_sources()])
def test_has_guards_each_level(where: str, expression: str) -> None:
    ENV.compile(expression)  # parses
    guarded = set(_HAS.findall(expression))
    for path in guarded:
        parent = path.rsplit(".", 1)[0]
        if "." not in parent:  # a variable: object, request, a comprehension's c
            continue
        assert parent in guarded or parent in ALWAYS_PRESENT, \
            f"{where}: has({path}) needs has({parent}) first"


# The label guard (deploy/optional/label-guard.yaml).

POLICY = deploy_tree.one("ValidatingAdmissionPolicy", "gpu-admission-label-guard")
KEY = "gpu-admission.io/enabled"


def _namespace(labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "team-a"}
    if labels is not None:
        meta["labels"] = {"kubernetes.io/metadata.name": "team-a", **labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def _guard_allows(old: dict[str, Any] | None, new: dict[str, Any], may_label: bool) -> bool:
    """Evaluate the policy; `mayLabel` (an authorizer call cel-python cannot
    make) is what RBAC would answer."""
    request = {"operation": "UPDATE" if old else "CREATE", "object": new, "oldObject": old,
               "resource": {"group": "", "version": "v1", "resource": "namespaces"}}
    variables: dict[Any, Any] = {}
    for var in POLICY["spec"]["variables"]:
        if var["name"] == "mayLabel":
            assert "authorizer." in var["expression"] and "check('label')" in var["expression"]
            value = celtypes.BoolType(may_label)
        else:
            value = _program(var["expression"]).evaluate(
                _activation(request, variables=celtypes.MapType(variables)))
        variables[celtypes.StringType(var["name"])] = value
    activation = _activation(request, variables=celtypes.MapType(variables))
    for validation in POLICY["spec"]["validations"]:
        _program(validation["messageExpression"]).evaluate(activation)
        if not _program(validation["expression"]).evaluate(activation):
            return False
    return True


GUARD_CASES = [
    # (old labels, new labels, allowed without the verb)
    ("create without labels", None, None, True),
    ("create, other labels", None, {"purpose": "a"}, True),
    ("create with a team", None, {"team": "a"}, False),
    ("create opted in", None, {KEY: "true"}, False),
    ("create labelled false", None, {KEY: "false"}, True),
    ("opt in", {"team": "a"}, {"team": "a", KEY: "true"}, False),
    ("opt out by removal", {KEY: "true"}, {}, False),
    ("opt out by value", {KEY: "true"}, {KEY: "false"}, False),
    ("opt in from false", {KEY: "false"}, {KEY: "true"}, False),
    ("false to absent", {KEY: "false"}, {}, True),
    ("false to another value", {KEY: "false"}, {KEY: "no"}, True),
    ("labels dropped entirely", {KEY: "true"}, None, False),
    ("unrelated label edit", {KEY: "true", "team": "a"}, {KEY: "true", "team": "a", "purpose": "b"}, True),
    ("no labels before or after", None, None, True),
    ("team changed", {"team": "a"}, {"team": "b"}, False),
    ("team removed", {KEY: "true", "team": "a"}, {KEY: "true"}, False),
    ("team set", {KEY: "true"}, {KEY: "true", "team": "a"}, False),
    ("team set empty", {}, {"team": ""}, False),
    ("team and opt-in kept, others dropped", {KEY: "true", "team": "a", "x": "1"}, {KEY: "true", "team": "a"}, True),
]


@pytest.mark.parametrize("case,old,new,allowed", GUARD_CASES, ids=[c[0] for c in GUARD_CASES])
def test_label_guard(case: str, old: dict | None, new: dict | None, allowed: bool) -> None:
    old_ns = None if case.startswith("create") else _namespace(old)
    new_ns = _namespace(new)
    assert _guard_allows(old_ns, new_ns, may_label=False) is allowed
    assert _guard_allows(old_ns, new_ns, may_label=True) is True


def test_label_guard_is_bound_to_deny() -> None:
    binding = deploy_tree.one("ValidatingAdmissionPolicyBinding", "gpu-admission-label-guard")
    assert binding["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = POLICY["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                      "resources": ["namespaces", "namespaces/status", "namespaces/finalize"]}]
    role = deploy_tree.one("ClusterRole", "gpu-admission-opt-in")
    assert role["rules"] == [{"apiGroups": ["gpu-admission.io"], "resources": ["namespaces"],
                              "verbs": ["label"]}]
