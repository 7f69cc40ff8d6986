"""The securityContext rule's whole-context write agrees with its field-by-field defaults."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import apply_patch
from webhook.policy import gpu, schema
from webhook.policy.context import Findings, RuleContext
from webhook.policy.match import Classifier
from webhook.policy.mutation_settings import SecurityContextRule
from webhook.policy.patch import PatchBuilder
from webhook.policy.request import Request
from webhook.policy.rules import security_context
from webhook.policy.view import EMPTY_VIEW
from webhook.policy.workload import PodTarget

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
    scs = [security_context._sc(ref.container) for ref in refs]
    security_context._pod_defaults(ctx, cfg, security_context._sc(ctx.spec), scs)
    for ref, sc in zip(refs, scs):
        security_context._container_defaults(ctx, ref, sc)


EMPTY: st.SearchStrategy[Any] = st.sampled_from([{}, None, "absent"])


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

    def container(name: str, sc: Any) -> dict[str, Any]:
        return {"name": name, "image": "x"} | ({} if sc == "absent" else {"securityContext": sc})

    spec: dict[str, Any] = {"containers": [container(f"c{i}", sc) for i, sc in enumerate(containers)]}
    if init:
        spec["initContainers"] = [container(f"i{i}", sc) for i, sc in enumerate(init)]
    if pod_sc != "absent":
        spec["securityContext"] = pod_sc
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    whole, expected = _context(pod), _context(pod)
    security_context.run(whole, cfg)
    _field_by_field(expected, cfg)
    assert json.dumps(whole.builder.ops) == json.dumps(expected.builder.ops), "the same patch, keys in the same order"
    assert apply_patch(pod, whole.builder.ops) == whole.builder.doc == expected.builder.doc
    assert [c.what for c in whole.sink.changes] == (["securityContext"] if expected.builder.ops else [])
