"""Where a kind's pod specs are found: a plain path (every built-in kind's) is looked up once, and finds
exactly what expanding it as a pattern finds, whatever the object holds there."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube.patch import lookup
from webhook.kube.workload import BUILTIN_KINDS, KindPaths, PodTarget, expand, pod_targets

KEYS = ("spec", "template", "metadata", "jobTemplate", "0", "workers")
values = st.recursive(
    st.none() | st.integers(0, 3) | st.text(max_size=2),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=20,
)
plain = st.lists(st.sampled_from(("spec", "template", "jobTemplate", "workers")), min_size=0, max_size=3)


def expanded(obj: Any, paths: KindPaths) -> list[PodTarget]:
    """What pod_targets found before plain paths were looked up: every pattern expanded."""
    found = []
    for pattern in paths.template_patterns:
        for path in expand(obj, pattern):
            if isinstance(lookup(obj, (*path, "spec")), dict):
                found.append(PodTarget((*path, "spec"), (*path, "metadata")))
    for pattern in paths.pod_spec_patterns:
        for path in expand(obj, pattern):
            if isinstance(lookup(obj, path), dict):
                found.append(PodTarget(tuple(path), ("metadata",) if path == ("spec",) else None))
    return found


@settings(max_examples=400, deadline=None)
@given(obj=st.dictionaries(st.sampled_from(KEYS), values, max_size=4), template=plain, pod_spec=plain,
       builtin=st.sampled_from(BUILTIN_KINDS))
def test_a_plain_path_finds_what_its_expansion_finds(obj: dict[str, Any], template: list[str], pod_spec: list[str],
                                                     builtin: KindPaths) -> None:
    custom = KindPaths("example.com", "Trainer", templates=("/" + "/".join(template),),
                       pod_specs=("/" + "/".join(pod_spec),))
    for paths in (custom, builtin):
        assert pod_targets(obj, paths) == expanded(obj, paths)


def test_only_plain_paths_are_looked_up_once() -> None:
    paths = KindPaths("example.com", "Trainer", templates=("/spec/template", "/spec/workers/*/template", "/spec/0/template"))
    assert [t is not None for t in paths.template_targets] == [True, False, False]
    assert all(t is not None for kind in BUILTIN_KINDS for t in (*kind.template_targets, *kind.pod_spec_targets))
    # "0" of a list is its first item, as expand reads it; a plain lookup would not find it
    obj: dict[str, Any] = {"spec": [{"template": {"spec": {"containers": []}}}]}
    assert pod_targets(obj, paths) == [PodTarget(("spec", 0, "template", "spec"), ("spec", 0, "template", "metadata"))]
    deployment = next(k for k in BUILTIN_KINDS if k.kind == "Deployment")
    assert pod_targets({"spec": {"template": {"spec": {}}}}, deployment) == [
        PodTarget(("spec", "template", "spec"), ("spec", "template", "metadata"))]
    assert pod_targets({"spec": {"template": {"spec": []}}}, deployment) == []
    assert pod_targets({"spec": {"template": None}}, deployment) == []
