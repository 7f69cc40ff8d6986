"""The securityContext rule: its whole-context write agrees with its field-by-field defaults; explicit root is kept whole."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import apply_patch, assert_schema_valid
from webhook.gpu import resources as gpu
from webhook.kube.patch import PatchBuilder
from webhook.kube.workload import PodTarget
from webhook.policy import schema
from webhook.policy.context import Findings, RuleContext
from webhook.policy.match import Classifier
from webhook.policy.request import Request
from webhook.policy.rules import security_context
from webhook.policy.settings.mutation import SecurityContextRule
from webhook.view.snapshot import EMPTY_VIEW

POLICY = schema.GPUPolicy.model_validate(
    {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "p"},
     "spec": {"rules": {"securityContext": {}}}}
)


def _context(pod: dict[str, Any]) -> RuleContext:
    builder = PatchBuilder(pod)
    target = PodTarget(("spec",), ("metadata",))
    return RuleContext(
        Request.for_object(pod), EMPTY_VIEW, "mutate", POLICY, "securityContext", "enforce", target,
        gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES), {}, builder, Findings(), builder.owned(("spec",)),
        Classifier(()),
    )


def _field_by_field(ctx: RuleContext, cfg: SecurityContextRule) -> None:
    refs = gpu.containers(ctx.spec)
    pod_sc, scs = security_context._sc(ctx.spec), [security_context._sc(ref.container) for ref in refs]
    security_context._pod_defaults(ctx, cfg, pod_sc, scs)
    for ref, sc in zip(refs, scs):
        security_context._container_defaults(ctx, ref, sc, security_context._asks_for_root(pod_sc))


EMPTY: st.SearchStrategy[Any] = st.sampled_from([{}, None, "absent"])


def _pod(pod_sc: Any, containers: list[Any], init: list[Any]) -> dict[str, Any]:
    """A pod of these securityContexts ("absent": no field), as a fresh tree, as JSON gives
    (the strategies hand one dict to several places)."""
    def container(name: str, sc: Any) -> dict[str, Any]:
        return {"name": name, "image": "x"} | ({} if sc == "absent" else {"securityContext": sc})

    spec: dict[str, Any] = {"containers": [container(f"c{i}", sc) for i, sc in enumerate(containers)]}
    if init:
        spec["initContainers"] = [container(f"i{i}", sc) for i, sc in enumerate(init)]
    if pod_sc != "absent":
        spec["securityContext"] = pod_sc
    pod: dict[str, Any] = json.loads(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}))
    return pod


@settings(max_examples=200, deadline=None)
@given(
    run_as_user=st.none() | st.integers(1, 5000), run_as_group=st.none() | st.integers(0, 5000),
    fs_group=st.none() | st.integers(0, 5000), seccomp=st.sampled_from(["RuntimeDefault", "Localhost", None]),
    pod_sc=EMPTY, containers=st.lists(EMPTY, max_size=3), init=st.lists(EMPTY, max_size=2),
)
def test_an_empty_pod_gets_what_the_field_by_field_defaults_give(
    run_as_user: int | None, run_as_group: int | None, fs_group: int | None, seccomp: Any,
    pod_sc: Any, containers: list[Any], init: list[Any],
) -> None:
    cfg = SecurityContextRule(runAsUser=run_as_user, runAsGroup=run_as_group, fsGroup=fs_group, seccompProfile=seccomp)

    pod = _pod(pod_sc, containers, init)
    whole, expected = _context(pod), _context(pod)
    security_context.run(whole, security_context.Settings(cfg))
    _field_by_field(expected, cfg)
    assert json.dumps(whole.builder.ops) == json.dumps(expected.builder.ops), "the same patch, keys in the same order"
    assert apply_patch(pod, whole.builder.ops) == whole.builder.doc == expected.builder.doc
    assert [what for _, _, what in whole.sink.changes] == (["securityContext"] if expected.builder.ops else [])


#: identities: root asked for (runAsUser 0, runAsNonRoot false), another user chosen, or neither
USERS: list[dict[str, Any]] = [{}, {"runAsUser": 0}, {"runAsNonRoot": False}, {"runAsUser": 1000}, {"runAsNonRoot": True},
         {"runAsNonRoot": False, "runAsUser": 2000}, {"runAsUser": 0, "runAsNonRoot": True}]
POD_CONTEXTS: st.SearchStrategy[Any] = st.sampled_from(["absent", *USERS, {"runAsUser": 0, "fsGroup": 7},
                                                        {"runAsGroup": 0, "seccompProfile": {"type": "Localhost", "localhostProfile": "p"}}])
#: beside the identity: capabilities, privileges, seccomp
EXTRAS: list[dict[str, Any]] = [
    {}, {"capabilities": {"drop": ["NET_RAW"]}}, {"capabilities": {"add": ["NET_ADMIN"]}}, {"capabilities": {}},
    {"privileged": True}, {"allowPrivilegeEscalation": True}, {"seccompProfile": {"type": "RuntimeDefault"}},
]
CONTAINER_CONTEXTS: st.SearchStrategy[Any] = st.just("absent") | st.builds(
    lambda user, extra: user | extra, st.sampled_from(USERS), st.sampled_from(EXTRAS))


def _root(sc: Any) -> bool:
    return isinstance(sc, dict) and (sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False)


def _runs_as_root(sc: Any, pod_sc: Any) -> bool:
    """The model: a container runs as root when it asks, or the pod asks and the container chooses no user."""
    own = sc if isinstance(sc, dict) else {}
    return _root(own) or (_root(pod_sc) and own.get("runAsUser") is None and own.get("runAsNonRoot") is not True)


@settings(max_examples=300, deadline=None)
@given(pod_sc=POD_CONTEXTS, containers=st.lists(CONTAINER_CONTEXTS, min_size=1, max_size=3),
       init=st.lists(CONTAINER_CONTEXTS, max_size=2))
def test_root_keeps_its_capabilities_and_the_pod_gets_no_identity(
    pod_sc: Any, containers: list[Any], init: list[Any]
) -> None:
    pod = _pod(pod_sc, containers, init)
    ctx = _context(pod)
    security_context.run(ctx, security_context.Settings(SecurityContextRule()))
    patched = apply_patch(pod, ctx.builder.ops)
    assert_schema_valid(patched)
    pod_before = pod_sc if isinstance(pod_sc, dict) else {}
    any_root = _root(pod_before) or any(_root(sc) for sc in [*containers, *init])
    pod_after = patched["spec"].get("securityContext", {})
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy"):
        if any_root:  # the pod's identity is the user's: what it set, nothing added
            assert pod_after.get(key) == pod_before.get(key), key
        else:
            assert pod_after.get(key) is not None or key == "runAsNonRoot" and "runAsNonRoot" in pod_before, key
    if not all(isinstance(sc, dict) and sc.get("seccompProfile") for sc in [*containers, *init]):
        assert pod_after["seccompProfile"] == pod_before.get("seccompProfile", {"type": "RuntimeDefault"})
    for list_name, scs in (("containers", containers), ("initContainers", init)):
        for before, after in zip(scs, patched["spec"].get(list_name, [])):
            sc = after["securityContext"]
            own = before if isinstance(before, dict) else {}
            if _runs_as_root(before, pod_sc):
                assert sc.get("capabilities") == own.get("capabilities"), "root keeps its capabilities"
            elif not own.get("privileged"):
                assert "ALL" in sc["capabilities"]["drop"]
            if not own.get("privileged"):
                assert sc["allowPrivilegeEscalation"] is own.get("allowPrivilegeEscalation", False)
    again = _context(patched)
    security_context.run(again, security_context.Settings(SecurityContextRule()))
    assert again.builder.ops == [], "a second pass changes nothing"
