"""What a rule sees while it runs on one pod spec, and how it reports back."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final, Literal

from webhook.gpu import resources
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube.patch import PatchBuilder, lookup
from webhook.kube.workload import PodTarget, owner_kinds
from webhook.policy import match, schema
from webhook.policy.charges import Charge
from webhook.policy.decision import Change, Finding
from webhook.policy.request import Phase, Request
from webhook.view.claim_gpus import PodClaims
from webhook.view.device_classes import ClusterClasses
from webhook.view.protocol import ClusterView

_NO_CLASSES = match.Classifier(())


class Findings:
    """Collects what rules found and changed during one evaluation.

    A plain class with slots (one is made per admission): compiled, a
    dataclass with default factories keeps an interpreted ``__init__``.
    """

    __slots__ = ("findings", "changes", "lifted", "charges")

    def __init__(self, findings: list[Finding] | None = None, changes: list[Change] | None = None) -> None:
        self.findings: list[Finding] = findings if findings is not None else []
        self.changes: list[Change] = changes if changes is not None else []
        #: policy → the rules exceptions lifted where they would have run (None until one did)
        self.lifted: dict[str, set[str]] | None = None
        #: what the pod charges to enforced GPU caps (None until a quota rule charges)
        self.charges: list[Charge] | None = None


_NO_SLOTS: resources.Slots = {}

#: pod spec pointer → container list → its items' pointers ("/spec/containers/0", …): built once, not per write
_ITEM_POINTERS: Final[dict[str, dict[str, list[str]]]] = {}


def _item_at(spec_at: str, list_name: str, index: int) -> str:
    """The JSON pointer of a pod spec's container, remembered (bounded: pod spec paths can be a custom kind's)."""
    lists = _ITEM_POINTERS.get(spec_at)
    if lists is None:
        if len(_ITEM_POINTERS) >= 256:
            return f"{spec_at}/{list_name}/{index}"
        lists = _ITEM_POINTERS[spec_at] = {}
    items = lists.get(list_name)
    if items is not None and index < len(items):
        return items[index]
    if index >= 1024:
        return f"{spec_at}/{list_name}/{index}"
    # a longer list replaces the shorter one whole (worker threads evaluate too: no list seen half-grown)
    known = items or []
    items = lists[list_name] = known + [f"{spec_at}/{list_name}/{i}" for i in range(len(known), index + 1)]
    return items[index]


_POD_META = ("metadata",)


class RuleContext:
    """What a rule sees while it runs on one pod spec.

    A plain class with slots rather than a dataclass: one is made per pod
    spec on every admission, and what is worked out later (the workload
    class, the containers owned, the DRA device classes) starts as None.
    Every attribute is set in ``__init__``: one read from the class instead
    would not be specialized by CPython.
    """

    __slots__ = (
        "request", "view", "phase", "policy", "step", "target", "is_gpu", "ns_labels", "builder", "sink", "spec", "spec_at",
        "classes", "slots", "claims", "_device_classes", "_workload_class", "_extended_gpus", "_containers", "ns_known",
    )

    def __init__(
        self, request: Request, view: ClusterView, phase: Phase, policy: schema.GPUPolicy, rule: str,
        mode: schema.Mode, target: PodTarget, is_gpu: resources.ResourceMatcher, ns_labels: Mapping[str, str],
        builder: PatchBuilder, sink: Findings, spec: dict[str, Any] | None = None,
        classes: match.Classifier = _NO_CLASSES, slots: resources.Slots = _NO_SLOTS, claims: PodClaims | None = None,
        device_classes: Mapping[str, DeviceClassInfo] | None = None, ns_known: bool | None = None,
    ) -> None:
        self.request, self.view, self.phase, self.policy = request, view, phase, policy
        #: the rule running, its mode and its policy's name, set by the engine before each rule
        self.step: tuple[str, schema.Mode, str] = (rule, mode, policy.metadata.name)
        self.target, self.is_gpu, self.ns_labels, self.builder, self.sink = target, is_gpu, ns_labels, builder, sink
        #: the pod spec as earlier rules left it: the builder's own copy, which
        #: rules change only through the builder and never replace whole
        self.spec: dict[str, Any] = spec if spec is not None else {}
        #: the pod spec's JSON pointer, where ``builder.put`` and ``append_to`` write below it
        self.spec_at = builder.pointer(target.spec_path)
        self.classes, self.slots = classes, slots
        #: the pod spec's DRA claims as resolved through the view (None: it names none)
        self.claims = claims
        #: DRA device classes of GPUs: the policy set's table, until device_classes wraps it in a
        #: ClusterClasses (the engine passes the one it already made when the pod names claims)
        self._device_classes = device_classes
        self._workload_class: str | None = None
        #: (matcher, what extended_gpus() found with it): rules ask several times per pod spec
        self._extended_gpus: tuple[resources.ResourceMatcher, dict[str, Decimal]] | None = None
        #: container → (the container as the builder's own, its JSON pointer): container_at; keyed
        #: by an int (its index, or -1 - index for an init container): no tuple built and hashed
        self._containers: dict[int, tuple[dict[str, Any], str]] | None = None
        #: whether the view knows the request's namespace (None: not asked yet; the engine, which looked
        #: the namespace up for its labels, says so: one call of the view per pod, not one per rule)
        self.ns_known = ns_known

    def dry_run(self) -> RuleContext:
        """A copy whose rule writes into a scratch builder and records its changes apart, its findings
        with this one's: a mutation in warn/audit mode reports what it would change and changes nothing."""
        builder = PatchBuilder(self.builder.doc)
        # the spec and the containers owned are the scratch builder's, not this one's
        clone = RuleContext(
            self.request, self.view, self.phase, self.policy, self.step[0], self.step[1], self.target, self.is_gpu,
            self.ns_labels, builder, Findings(findings=self.sink.findings), builder.owned(self.target.spec_path),
            self.classes, self.slots, self.claims, self._device_classes, self.ns_known,
        )
        clone.step = self.step
        # what this context already worked out holds for the copy
        clone._workload_class, clone._extended_gpus = self._workload_class, self._extended_gpus
        return clone

    def namespace_known(self) -> bool:
        """Whether the cluster view knows the request's namespace (its labels in ``ns_labels`` are then the
        namespace's own, not only the name label): a view not synced, or one that has not seen a namespace
        just made, does not."""
        known = self.ns_known
        if known is None:
            known = self.ns_known = self.view.namespace(self.request.namespace) is not None
        return known

    @property
    def rule(self) -> str:
        return self.step[0]

    @property
    def mode(self) -> schema.Mode:
        return self.step[1]

    @property
    def device_classes(self) -> ClusterClasses:
        """DRA device classes of GPUs: the policy set's table, and the cluster's classes selecting the same devices."""
        found = self._device_classes
        if type(found) is not ClusterClasses:
            found = self._device_classes = ClusterClasses(found or {}, self.view)
        return found

    @property
    def workload_class(self) -> str:
        """The pod spec's workload class ("" when none matches), worked out on first use."""
        found = self._workload_class
        if found is None:
            meta, request = self.meta, self.request
            found = self._workload_class = self.classes.classify(
                meta, owner_kinds(meta), request.kind, request.namespace, self.ns_labels
            )
        return found

    @property
    def meta(self) -> Mapping[str, Any]:
        """The pod (template) metadata, {} when the spec has none."""
        path = self.target.meta_path
        if path == _POD_META:  # a Pod: its own metadata, read without a walk
            value = self.builder.doc.get("metadata")
        else:
            value = lookup(self.builder.doc, path) if path is not None else None
        return value if isinstance(value, dict) else {}

    def spec_path(self, *rest: str | int) -> tuple[str | int, ...]:
        return (*self.target.spec_path, *rest)

    def container_at(self, list_name: str, index: int) -> tuple[dict[str, Any], str]:
        """A container of this pod spec as the builder's own, and its JSON pointer: where to write
        into it with ``put``/``append_to``.

        Only for containers that are maps (``resources.containers``, the slots).
        Remembered for this builder: rules never replace a container or a
        container list whole.
        """
        position = index if list_name == "containers" else -1 - index  # (the two lists of resources.CONTAINER_LISTS)
        owned = self._containers
        if owned is None:
            owned = self._containers = {}
        else:
            found = owned.get(position)
            if found is not None:
                return found
        found = owned[position] = (self.builder.own_item(self.spec, list_name, index), _item_at(self.spec_at, list_name, index))
        return found

    def gpu_containers(self) -> list[resources.ContainerRef]:
        """Containers of this pod spec that mention a GPU resource (as they are now)."""
        spec, refs = self.spec, []
        for list_name, index in self.slots:  # in the pod's order: init containers first
            refs.append(resources.ContainerRef(list_name, index, spec[list_name][index]))
        return refs

    def pod_gpus(self) -> dict[str, Decimal]:
        """GPUs the pod needs per resource name: extended resources plus its DRA claims' devices."""
        total = dict(self.extended_gpus())
        if self.claims is not None:
            for name, count in self.claims.total().items():
                if self.is_gpu(name):
                    total[name] = total.get(name, Decimal(0)) + count
        return total

    def extended_gpus(self) -> Mapping[str, Decimal]:
        """GPUs the pod needs per extended resource name, as the scheduler counts them (read-only).

        Worked out once per matcher: rules never change resources.
        """
        known = self._extended_gpus
        if known is None or known[0] is not self.is_gpu:
            # the slots name every container with an extended GPU resource, unless claims added theirs
            slots = self.slots if self.claims is None else None
            known = self._extended_gpus = (self.is_gpu, resources.pod_gpus(self.spec, self.is_gpu, slots))
        return known[1]

    def extended_slots(self) -> resources.Slots:
        """The slots of extended resources only (what node labels and allocatable speak of), without DRA claims."""
        return self.slots if self.claims is None else resources.gpu_slots(self.spec, self.is_gpu)

    def gpu_names(self, ref: resources.ContainerRef) -> frozenset[str]:
        """GPU resource names a container mentions (empty for non-GPU containers)."""
        return self.slots.get((ref.list_name, ref.index), frozenset())

    def where(self, ref: resources.ContainerRef | None = None, field_path: str = "") -> str:
        """A human location: "Pod ml/x container "c" (resources.limits)"."""
        text = self.request.subject
        if self.target.where():
            text += f" {self.target.where()}"
        if ref is not None:
            text += f" {ref.label()}"
        if field_path:
            text += f" ({field_path})"
        return text

    def report(self, message: str, field_path: str = "", mode: schema.Mode | None = None) -> None:
        """Record a violation; the rule's mode decides whether it denies, warns or is audit-only."""
        self.sink.findings.append(
            Finding(self.policy.metadata.name, self.rule, mode or self.mode, message, field_path)
        )

    def note(self, message: str, field_path: str = "", *, result: Literal["pass", "skip"]) -> None:
        """Record an informational note: reported as ``result``, never a denial, warning or audit finding."""
        self.sink.findings.append(Finding(self.policy.metadata.name, self.rule, "audit", message, field_path, result))

    def changed(self, what: str) -> None:
        """Record that this rule changed ``what`` (for provenance and dry-run findings)."""
        # (the policy's name from the step: settings and policies are pydantic models, slower to read)
        step = self.step
        self.sink.changes.append((step[2], step[0], what))
