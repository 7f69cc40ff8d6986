"""Where pod specs live inside the kinds gpu-admission looks at."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.kube.patch import Path, as_dict, lookup
from webhook.kube.value_text import text


def split_pointer(path: str) -> tuple[str, ...]:
    """``/a/b~1c`` → ("a", "b/c")."""
    if not path or path == "/":
        return ()
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/"))


@dataclass(frozen=True)
class PodTarget:
    """One pod spec inside an object: where its spec and metadata are."""

    spec_path: tuple[str | int, ...]
    meta_path: tuple[str | int, ...] | None

    @property
    def is_pod(self) -> bool:
        return self.spec_path == ("spec",) and self.meta_path == ("metadata",)

    def where(self) -> str:
        """Where the spec is, for messages: "" for a pod, else e.g. "spec.template"."""
        if self.is_pod:
            return ""
        return field_path(self.spec_path[:-1] if self.meta_path is not None else self.spec_path)


@dataclass(frozen=True, eq=False)
class KindPaths:
    """The pod templates (metadata + spec) and bare pod specs of one kind.

    Paths are JSON pointers where ``*`` stands for every key of a map or
    every item of a list, e.g. ``/spec/pytorchReplicaSpecs/*/template``.
    """

    group: str
    kind: str
    templates: tuple[str, ...] = ()
    pod_specs: tuple[str, ...] = ()
    # the pointers split, worked out once: fields, not cached properties, which compiled
    # (mypyc) work out again on every read, on every admission
    template_patterns: tuple[tuple[str, ...], ...] = field(init=False, repr=False)
    pod_spec_patterns: tuple[tuple[str, ...], ...] = field(init=False, repr=False)
    is_pod: bool = field(init=False, repr=False)  # the pod spec at /spec, no templates: a Pod
    #: per template pattern and per pod spec pattern, in order: the PodTarget it names when it is a plain
    #: path (no ``*``, no index: what a built-in kind has), found with one lookup; None: expanded
    template_targets: tuple[PodTarget | None, ...] = field(init=False, repr=False)
    pod_spec_targets: tuple[PodTarget | None, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        templates = tuple(split_pointer(t) for t in self.templates)
        pod_specs = tuple(split_pointer(t) for t in self.pod_specs)
        object.__setattr__(self, "template_patterns", templates)
        object.__setattr__(self, "pod_spec_patterns", pod_specs)
        object.__setattr__(self, "is_pod", pod_specs == (("spec",),) and not self.templates)
        object.__setattr__(self, "template_targets", tuple(
            PodTarget((*p, "spec"), (*p, "metadata")) if _plain(p) else None for p in templates))
        object.__setattr__(self, "pod_spec_targets", tuple(
            PodTarget(p, ("metadata",) if p == ("spec",) else None) if _plain(p) else None for p in pod_specs))


def _plain(pattern: tuple[str, ...]) -> bool:
    """A pattern that names one path: no ``*``, no key that ``expand`` reads as a list index."""
    return all(key != "*" and not key.isdigit() for key in pattern)


#: Kinds Kubernetes itself defines; custom resources come from GPUWorkloadKind policies.
BUILTIN_KINDS: tuple[KindPaths, ...] = (
    KindPaths("", "Pod", pod_specs=("/spec",)),
    KindPaths("", "PodTemplate", templates=("/template",)),
    KindPaths("", "ReplicationController", templates=("/spec/template",)),
    KindPaths("apps", "Deployment", templates=("/spec/template",)),
    KindPaths("apps", "StatefulSet", templates=("/spec/template",)),
    KindPaths("apps", "DaemonSet", templates=("/spec/template",)),
    KindPaths("apps", "ReplicaSet", templates=("/spec/template",)),
    KindPaths("batch", "Job", templates=("/spec/template",)),
    KindPaths("batch", "CronJob", templates=("/spec/jobTemplate/spec/template",)),
)


def field_path(path: tuple[str | int, ...]) -> str:
    """A path as messages write it: ("spec", "workerGroupSpecs", 0, "template") → "spec.workerGroupSpecs[0].template"."""
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")


def expand(doc: Any, pattern: Sequence[str]) -> Iterator[tuple[str | int, ...]]:
    """Concrete paths in ``doc`` that match a pattern with ``*`` wildcards."""
    yield from _expand(doc, tuple(pattern), ())


def _expand(node: Any, rest: tuple[str, ...], done: tuple[str | int, ...]) -> Iterator[tuple[str | int, ...]]:
    if not rest:
        yield done
        return
    head, tail = rest[0], rest[1:]
    if head == "*":
        if isinstance(node, dict):
            for key in node:
                yield from _expand(node[key], tail, (*done, key))
        elif isinstance(node, list):
            for index, item in enumerate(node):
                yield from _expand(item, tail, (*done, index))
    elif isinstance(node, dict) and head in node:
        yield from _expand(node[head], tail, (*done, head))
    elif isinstance(node, list) and head.isdigit() and int(head) < len(node):
        yield from _expand(node[int(head)], tail, (*done, int(head)))


_POD = PodTarget(("spec",), ("metadata",))


def pod_targets(obj: Mapping[str, Any], paths: KindPaths) -> list[PodTarget]:
    """Every pod spec of ``obj`` that exists and is a mapping."""
    found: list[PodTarget] = []
    if paths.is_pod:
        if type(as_dict(obj).get("spec")) is dict:
            found.append(_POD)
        return found
    for pattern, target in zip(paths.template_patterns, paths.template_targets):
        if target is not None:  # (a plain path: the one expand would give, if its spec is there)
            if isinstance(lookup(obj, target.spec_path), dict):
                found.append(target)
            continue
        for path in expand(obj, pattern):
            if isinstance(lookup(obj, (*path, "spec")), dict):
                found.append(PodTarget((*path, "spec"), (*path, "metadata")))
    for pattern, target in zip(paths.pod_spec_patterns, paths.pod_spec_targets):
        if target is not None:
            if isinstance(lookup(obj, target.spec_path), dict):
                found.append(target)
            continue
        for path in expand(obj, pattern):
            if isinstance(lookup(obj, path), dict):
                meta = ("metadata",) if path == ("spec",) else None
                found.append(PodTarget(tuple(path), meta))
    return found


def kind_index(kinds: Iterable[KindPaths]) -> dict[tuple[str, str], KindPaths]:
    """(group, kind) → paths; later entries override earlier ones."""
    return {(k.group, k.kind): k for k in kinds}


def binds_to_nodes(group: str, kind: str, target: PodTarget) -> bool:
    """Is ``target`` a DaemonSet's pod template? Its controller puts a pod on every node the template
    selects and tolerates, bound to that node, whatever the pod asks for: the template's own tolerations
    and selectors place its pods, and nothing added to a pod moves it."""
    return kind == "DaemonSet" and group == "apps" and not target.is_pod


def is_windows(spec: Mapping[str, Any]) -> bool:
    """A pod spec for Windows nodes (no /dev/shm, no Linux security fields, no Linux runtime class):
    ``os.name: windows``, or, in pods written before that field (and still common), a
    ``nodeSelector`` on ``kubernetes.io/os: windows`` (which every HostProcess pod also needs)."""
    spec = as_dict(spec)
    pod_os = spec.get("os")
    if type(pod_os) is dict and pod_os.get("name") == "windows":
        return True
    selector = spec.get("nodeSelector")
    return type(selector) is dict and selector.get("kubernetes.io/os") == "windows"


def owner_kinds(meta: Mapping[str, Any]) -> set[str]:
    """Kinds of the object's ownerReferences."""
    refs = as_dict(meta).get("ownerReferences")
    if not isinstance(refs, list):
        return set()
    return {text(r.get("kind")) for r in refs if isinstance(r, dict)}


def as_path(path: Path) -> tuple[str | int, ...]:
    """A path as a tuple, for hashing and concatenation."""
    return tuple(path)
