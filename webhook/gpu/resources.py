"""GPU resource names and what a pod spec asks of them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from decimal import Decimal
from typing import Any, Final

from webhook.kube import quantity
from webhook.kube.patch import as_dict
from webhook.kube.value_text import text

#: Resource names treated as GPUs unless a policy lists more (FACTS §3).
DEFAULT_GPU_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
)

CONTAINER_LISTS: Final[tuple[str, ...]] = ("initContainers", "containers")


@dataclass(frozen=True)
class ResourceMatcher:
    """Matches resource names against exact names and ``prefix*`` patterns."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]
    #: name → frozenset({name}) when it matches, else an empty one: what ``names_in`` remembers
    #: of the resource names seen so far (few: cpu, memory, the GPUs...); bounded
    answers: dict[str, frozenset[str]] = dataclass_field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, patterns: Iterable[str]) -> ResourceMatcher:
        patterns = tuple(patterns)
        return cls(
            exact=frozenset(p for p in patterns if not p.endswith("*")),
            prefixes=tuple(p[:-1] for p in patterns if p.endswith("*")),
        )

    def __call__(self, name: str) -> bool:
        return name in self.exact or (bool(self.prefixes) and name.startswith(self.prefixes))

    def names_in(self, resources: dict[Any, Any], names: frozenset[str]) -> frozenset[str]:
        """``names`` and the names of a resource map this matches (``names`` itself when it has no other).

        Name by name from remembered answers: a container's maps hold a few names, and each one
        is a dict lookup here, where set operations would build two sets per map (gpu_slots runs
        for every container of every pod)."""
        answers = self.answers
        for name in resources:
            found = answers.get(name)
            if found is None:
                found = self._answer(name)
            if found and found is not names:
                names = found if not names else names | found
        return names

    def _answer(self, name: object) -> frozenset[str]:
        found = frozenset((name,)) if type(name) is str and self(name) else _NO_NAMES
        if type(name) is str and len(self.answers) < MATCHES_SEEN:  # names can be user-chosen: bounded
            self.answers[name] = found
        return found

    def any_of(self, slots: Slots) -> bool:
        """Does any container of these slots mention a resource this matches?"""
        exact, prefixes = self.exact, self.prefixes
        last: frozenset[str] | None = None
        for names in slots.values():
            if names is last:  # (containers asking for the same GPUs share one set: names_in)
                continue
            last = names
            for name in names:
                if name in exact or (prefixes and name.startswith(prefixes)):
                    return True
        return False


_CONTAINER_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


class ContainerRef:
    """One container of a pod spec: which list, where, and the container itself."""

    __slots__ = ("list_name", "index", "container")

    def __init__(self, list_name: str, index: int, container: Mapping[str, Any]) -> None:
        self.list_name = list_name  # "containers", "initContainers" (or "ephemeralContainers": rules/gpu_access)
        self.index = index
        self.container = container

    def __repr__(self) -> str:
        return f"ContainerRef({self.list_name!r}, {self.index})"

    @property
    def name(self) -> str:
        return text(self.container.get("name", f"#{self.index}"))

    @property
    def is_init(self) -> bool:
        return self.list_name == "initContainers"

    def label(self) -> str:
        kind = _CONTAINER_KINDS.get(self.list_name, "container")
        return f'{kind} "{self.name}"'


def containers(spec: Mapping[str, Any]) -> list[ContainerRef]:
    """Init containers then app containers of a pod spec (ephemeral ones never hold GPUs)."""
    refs = []
    spec = as_dict(spec)
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if type(items) is list:
            for index, container in enumerate(items):
                if type(container) is dict:
                    refs.append(ContainerRef(list_name, index, container))
    return refs


def resource_map(container: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """``resources.limits`` or ``resources.requests`` of a container, {} when absent."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return {}
    values = resources.get(field)
    return values if isinstance(values, dict) else {}


def gpu_names(container: Mapping[str, Any], is_gpu: ResourceMatcher) -> AbstractSet[str]:
    """GPU resource names the container asks for (more than zero) in limits or requests."""
    limits, requests = resource_map(container, "limits"), resource_map(container, "requests")
    names = {n for n in limits if is_gpu(n)}
    names.update(n for n in requests if is_gpu(n))
    return held(names, limits, requests) if names else names


def is_zero(value: object) -> bool:
    """Is this a quantity of exactly zero ("0", 0, "0m", "0.0", "0Gi", or null, which kube-apiserver
    decodes as a zero quantity)? What does not parse is not zero."""
    return value is None or quantity.parse_quantity(value) == 0


def held(names: AbstractSet[str], limits: object, requests: object) -> AbstractSet[str]:
    """The ``names`` that limits or requests give as other than zero (``names`` itself when all are).

    Helm charts write ``nvidia.com/gpu: 0`` for their CPU mode: such a
    container gets no device, so it is no GPU container. A name is dropped
    only when every quantity given for it is zero; one that does not parse
    stays (kube-apiserver refuses it, and resourceShape says so).
    """
    if type(limits) is dict:
        for name in names:  # (gpu_slots inlines this loop)
            if text(limits.get(name))[:1] not in _NOT_ZERO:
                break
        else:
            return names  # every limit a count ("4"): nothing to parse
    return _parsed_held(names, limits, requests)


def _parsed_held(names: AbstractSet[str], limits: object, requests: object) -> set[str]:
    maps = [m for m in (limits, requests) if type(m) is dict]
    return {n for n in names if not all(is_zero(m[n]) for m in maps if n in m)}


#: first characters of a quantity that cannot be zero ("4", "8", "1k": what
#: does not parse stays too): the counts GPUs are asked in, sorted without parsing
_NOT_ZERO: Final = frozenset("123456789")


_NO_NAMES: Final[frozenset[str]] = frozenset()

#: how many resource names a matcher remembers (names can be user-chosen)
MATCHES_SEEN = 1024

#: (container list, index) → GPU resource names of that container, for the
#: containers that ask for any (a name given as zero is not asked for). Rules
#: never change resources, so one evaluation works this out once per pod spec.
Slots = dict[tuple[str, int], frozenset[str]]


def gpu_slots(spec: Mapping[str, Any], is_gpu: ResourceMatcher) -> Slots:
    """Each container that asks for a GPU resource (more than zero of it: ``held``), by position."""
    slots: Slots = {}
    spec = as_dict(spec)
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if type(items) is not list:
            continue
        for index, container in enumerate(items):
            resources = container.get("resources") if type(container) is dict else None
            if type(resources) is not dict:
                continue
            limits, requests = resources.get("limits"), resources.get("requests")
            if type(limits) is dict:
                names = is_gpu.names_in(limits, _NO_NAMES)
                if type(requests) is dict:
                    names = is_gpu.names_in(requests, names)
            elif type(requests) is dict:
                names = is_gpu.names_in(requests, _NO_NAMES)
                limits = _NO_LIMITS  # no limit to read below: held decides from the requests
            else:
                continue
            if names:
                # a limit written as a count ("4") is no zero; only other spellings ("0", 0, "0m") are parsed
                for name in names:
                    if text(limits.get(name))[:1] not in _NOT_ZERO:
                        names = frozenset(_parsed_held(names, limits, requests))
                        break
                if names:
                    slots[(list_name, index)] = names
    return slots


_NO_LIMITS: Final[dict[str, Any]] = {}


def narrow(slots: Slots, is_gpu: ResourceMatcher) -> Slots:
    """The slots as a stricter matcher sees them."""
    narrowed = {pos: frozenset(n for n in names if is_gpu(n)) for pos, names in slots.items()}
    return {pos: names for pos, names in narrowed.items() if names}


def gpu_count(container: Mapping[str, Any], name: str) -> Decimal:
    """How many of ``name`` the container gets: the limit, else the request, else 0."""
    for field in ("limits", "requests"):
        value = quantity.parse_quantity(resource_map(container, field).get(name))
        if value is not None:
            return value
    return Decimal(0)


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A native sidecar: an init container with ``restartPolicy: Always``, which keeps running beside
    the app containers for the pod's whole life (ask it of init containers only)."""
    return container.get("restartPolicy") == "Always"


def pod_gpus(spec: Mapping[str, Any], is_gpu: ResourceMatcher, slots: Slots | None = None) -> dict[str, Decimal]:
    """GPUs the pod needs per resource name, as the scheduler counts them.

    Init containers run one at a time before the app containers, but native
    sidecars (init containers with ``restartPolicy: Always``) keep running
    beside everything started after them. So the pod needs the larger of:
    every app container plus every sidecar, and each plain init container
    plus the sidecars started before it (Kubernetes' effective request).
    Containers without GPUs add nothing, so ``slots`` (``gpu_slots`` of this
    spec for ``is_gpu``, or narrowed to it) may narrow the walk to the others.
    """
    app: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    peak: dict[str, Decimal] = {}
    # ``slots`` (in the pod's order) skip the containers without GPUs and name the GPUs of the others
    found: list[tuple[ContainerRef, Iterable[str]]]
    if slots is None:
        found = [(ref, gpu_names(ref.container, is_gpu)) for ref in containers(spec)]
    else:
        found = [(ContainerRef(n, i, spec[n][i]), names) for (n, i), names in slots.items()]
    for ref, names in found:
        if not ref.is_init:
            for name in names:
                app[name] = app.get(name, Decimal(0)) + gpu_count(ref.container, name)
        elif is_sidecar(ref.container):
            for name in names:
                sidecars[name] = sidecars.get(name, Decimal(0)) + gpu_count(ref.container, name)
        else:
            for name in names:
                during = gpu_count(ref.container, name) + sidecars.get(name, Decimal(0))
                peak[name] = max(peak.get(name, Decimal(0)), during)
    total: dict[str, Decimal] = {}
    for name in app.keys() | sidecars.keys() | peak.keys():
        running = app.get(name, Decimal(0)) + sidecars.get(name, Decimal(0))
        total[name] = max(running, peak.get(name, Decimal(0)))
    return total