"""Which parts of each rule can run inside kube-apiserver, and what the webhook then keeps.

kube-apiserver runs CEL policies in-process: ValidatingAdmissionPolicy (v1
since Kubernetes 1.30) and MutatingAdmissionPolicy (v1 from 1.36; alpha and
off by default before 1.34, beta and off by default in 1.34 and 1.35). A
rule part that reads only the object, its old object, the request and its
namespace's labels can be one; a part that needs cluster state (nodes,
quotas, priority and runtime classes, DRA objects) or an image's config
cannot. ``gpu-admission policies compile`` (webhook/cel) compiles the parts
this module marks compiled; ``gpu-admission serve --compiled DIR`` makes the
engine skip them (``Offload``), so that nothing is done twice.

The split is per policy and rule, for the kinds whose pod-spec paths compile
(one ``*`` at most) and for pod specs that name no DRA claims (whether a
claim hands out GPUs is cluster state): the webhook keeps everything else.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from webhook.gpu import resources
from webhook.gpu.resources import ResourceMatcher
from webhook.kube import quantity
from webhook.kube.workload import KindPaths
from webhook.policy.schema import GPUPolicy, GPUPolicyException, GPUWorkloadClass


class PolicySet(Protocol):
    """What this module reads of a loaded policy set (the loader's PolicySet, which holds an Offload)."""

    @property
    def policies(self) -> Sequence[GPUPolicy]: ...
    @property
    def classes(self) -> Sequence[GPUWorkloadClass]: ...
    @property
    def exceptions(self) -> Sequence[GPUPolicyException]: ...
    @property
    def kinds(self) -> Mapping[tuple[str, str], KindPaths]: ...
    @property
    def any_gpu(self) -> ResourceMatcher: ...

#: what the slimmed webhook runs of a rule: nothing, the parts left to it (the rule module's
#: ``run_rest``), or all of it (its compiled parts then find nothing left to do)
WebhookPart = Literal["none", "rest", "all"]
Status = Literal["compiled", "partly", "webhook", "off"]

#: the first Kubernetes version serving MutatingAdmissionPolicy as v1, on by default
MUTATING_POLICIES_GA = (1, 36)
#: the oldest version gpu-admission supports (webhook matchConditions, ValidatingAdmissionPolicy v1)
OLDEST = (1, 30)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(\.\d+)?$")

_MUTATIONS_LATER = "MutatingAdmissionPolicy is v1 (on by default) from Kubernetes 1.36"
_DRY_RUN = "a mutation in warn or audit mode only reports what it would change: a MutatingAdmissionPolicy cannot warn"


def kube_version(text: str) -> tuple[int, int]:
    """"1.36" (or "v1.36.2") → (1, 36); ValueError for anything else or a version older than 1.30."""
    found = _VERSION.match(text.strip())
    if not found:
        raise ValueError(f"{text!r} is not a Kubernetes version such as 1.36")
    version = (int(found.group(1)), int(found.group(2)))
    if version < OLDEST:
        raise ValueError(f"Kubernetes {text} is older than 1.30, which ValidatingAdmissionPolicy v1 needs")
    return version


@dataclass(frozen=True)
class Part:
    """One check or change of a rule, and where it runs."""

    what: str
    compiled: bool
    why: str = ""  # why it stays on the webhook


@dataclass(frozen=True)
class RuleCoverage:
    """One rule of one policy: its parts, and what the slimmed webhook still runs of it."""

    policy: str
    rule: str
    mode: str
    parts: tuple[Part, ...]
    webhook: WebhookPart

    @property
    def status(self) -> Status:
        if self.mode == "off":
            return "off"
        compiled = [p.compiled for p in self.parts]
        if all(compiled):
            return "compiled"
        return "partly" if any(compiled) else "webhook"

    def compiled_parts(self) -> tuple[str, ...]:
        return tuple(p.what for p in self.parts if p.compiled)

    def left_parts(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if not p.compiled)


def coverage(policies: PolicySet, version: tuple[int, int]) -> tuple[RuleCoverage, ...]:
    """Every rule of every policy, in policy and rule order, with what compiles for ``version``."""
    rows = []
    reporting: dict[str, str] = {}  # mutation rule → an earlier policy running it in warn or audit mode
    for policy in policies.policies:
        for rule in _PARTS:  # (in the engine's order)
            cfg = getattr(policy.spec.rules, rule)
            if cfg is not None:
                rows.append(_rule_coverage(policy, rule, cfg, version, reporting.get(rule, "")))
                if rule in _MUTATIONS and cfg.mode in ("warn", "audit"):
                    reporting.setdefault(rule, f"{policy.metadata.name} ({cfg.mode})")
    return tuple(rows)


def share(rows: tuple[RuleCoverage, ...]) -> tuple[int, int]:
    """(compiled parts, parts) over the rules that run (not off)."""
    parts = [p for row in rows if row.mode != "off" for p in row.parts]
    return sum(p.compiled for p in parts), len(parts)


def _rule_coverage(policy: GPUPolicy, rule: str, cfg: Any, version: tuple[int, int], reported_by: str) -> RuleCoverage:
    """``reported_by``: an earlier policy whose rule of the same family only reports what it would
    change: it must see the object before this one changes it, and the webhook runs after the
    compiled policies, so this one stays on the webhook too."""
    name, mode = policy.metadata.name, str(cfg.mode)
    parts, webhook = _PARTS[rule](cfg)
    if rule in _MUTATIONS and mode != "off":
        why = _DRY_RUN if mode != "enforce" else (_MUTATIONS_LATER if version < MUTATING_POLICIES_GA else "")
        if not why and reported_by:
            why = f"policy {reported_by} reports what its {rule} would change, before this one changes it"
        if why:  # the rule's checks stay with its changes
            parts, webhook = tuple(Part(p.what, False, p.why or why) for p in parts), "all"
    if mode == "off":
        webhook = "all"
    return RuleCoverage(name, rule, mode, parts, webhook)


def _needs(what: str) -> str:
    return f"needs {what} of the cluster"


def _resource_shape(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    parts = [
        Part("whole, limited GPU quantities (fractions, requests without or unlike limits)", True),
        Part("MIG profile names (by their form and gpu-admission's table; profiles nodes advertise are not known)", True),
        Part("GPU-sharing schemes (resources and annotations)", True),
        Part("GPUs held by init containers only", True),
    ]
    if cfg.maxPerPod is not None:
        parts.append(Part("maxPerPod (pods whose GPU counts are whole numbers)", True))
    if cfg.nodeCapacity:
        parts.append(Part("more GPUs than the largest node, or than the node spec.nodeName names", False, _needs("the nodes")))
        return tuple(parts), "rest"
    return tuple(parts), "none"


def _node_affinity(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    keys = [r.key for r in cfg.required] + [r.key for extra in cfg.byResource for r in extra.required]
    what = "required node affinity ANDed into every term (preferred terms added), contradictions refused"
    if len(keys) != len(set(keys)):
        return (Part(what, False, "requirements on one key see each other's merge: not compiled"),), "all"
    return (Part(what, True),), "none"


def _runtime_class(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    return (Part("runtimeClassName set (spec.overhead dropped)", True),
            Part("refuse a RuntimeClass the cluster lacks", False, _needs("the RuntimeClasses"))), "rest"


def _priority_class(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    parts = [Part("priorityClassName by workload class (spec.priority left for the Priority plugin)", True)]
    if cfg.refusedClasses or cfg.userChoice is not None:
        parts.append(Part("refuse reserved classes, and GPU classes the namespace may not choose", True))
    parts += [
        Part("replace the cluster's globalDefault class", False, _needs("the PriorityClasses")),
        Part("refuse a PriorityClass the cluster lacks", False, _needs("the PriorityClasses")),
    ]
    return tuple(parts), "rest"


def _security_context(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    parts = [Part("non-root pod and container defaults", True)]
    if cfg.level == "enforce":
        parts.append(Part("refuse explicit root, privileged or added capabilities", True))
    return tuple(parts), "none"


def _shm(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    return (
        Part("memory-backed /dev/shm sized from whole-byte memory limits", True),
        Part("a limit with a fraction of a byte, or more than nine volume-name clashes",
             False, "needs division of quantities the CEL quantity library does not offer"),
    ), "all"


def _gpu_visibility(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    parts = []
    if cfg.setVoid:
        parts.append(Part("NVIDIA_VISIBLE_DEVICES=void in containers without GPUs", True))
    if cfg.denyUnrequestedVisibleDevices:
        parts.append(Part("refuse NVIDIA_VISIBLE_DEVICES without a GPU request", True))
    return tuple(parts) or (Part("nothing (setVoid and denyUnrequestedVisibleDevices off)", True),), "none"


def _notebook_lifetime(cfg: Any) -> tuple[tuple[Part, ...], WebhookPart]:
    parts = [Part("default activeDeadlineSeconds", True)]
    if cfg.maxActiveDeadlineSeconds is not None:
        parts.append(Part("refuse a longer deadline", True))
    return tuple(parts), "none"


_Parts = Callable[[Any], tuple[tuple[Part, ...], WebhookPart]]


def _left(what: str, why: str) -> _Parts:
    return lambda cfg: ((Part(what, False, why),), "all")


_PARTS: dict[str, _Parts] = {
    "tolerations": lambda cfg: ((Part("GPU tolerations (JSONPatch: tolerations are an atomic list)", True),), "none"),
    "nodeAffinity": lambda cfg: _node_affinity(cfg),
    "runtimeClass": _runtime_class,
    "priorityClass": _priority_class,
    "securityContext": _security_context,
    "shm": _shm,
    "gpuVisibility": _gpu_visibility,
    "spreadReplicas": lambda cfg: ((Part("pod anti-affinity between replicas", True),), "none"),
    "trainingLocality": lambda cfg: ((Part("pod affinity within one training job", True),), "none"),
    "notebookLifetime": _notebook_lifetime,
    "resourceShape": _resource_shape,
    "draClaims": _left("DRA claims and the claims pods name", _needs("ResourceClaims, DeviceClasses and ResourceSlices")),
    "quota": _left("GPU quotas and native ResourceQuotas", _needs("the GPU usage and the quotas")),
    "gpuAccess": _left("GPU access without a GPU request: NVIDIA variables, GPU runtime class, device hostPaths, "
                       "privileged GPU pods", "it also judges pods/ephemeralcontainers, a subresource only the "
                       "validating webhook is sent"),
    "cudaDriver": _left("image CUDA against node drivers, steering", "needs the node drivers, and image configs"),
}

#: rules whose changes a MutatingAdmissionPolicy makes (their checks go with them)
_MUTATIONS = frozenset({"tolerations", "nodeAffinity", "runtimeClass", "priorityClass", "securityContext", "shm", "gpuVisibility",
                        "spreadReplicas", "trainingLocality", "notebookLifetime"})


def compilable_kinds(policies: PolicySet) -> frozenset[tuple[str, str]]:
    """The kinds whose pod specs the compiled policies find: paths of map keys with one ``*`` at
    most, not first (CEL in Kubernetes 1.33 cannot flatten the lists two wildcards make)."""
    return frozenset(key for key, paths in policies.kinds.items() if compiles(paths))


def built_in(group: str) -> bool:
    """A kind kube-apiserver serves itself (its API group has no dot: core, apps, batch): one it
    knows the schema of from the start. A MutatingAdmissionPolicy refuses an object of any other
    kind ("Resource kind … not found", HTTP 503, whatever its failurePolicy) until kube-apiserver's
    poll of its own OpenAPI (every 5 s, once the CRD's schema is published) finds the kind: so
    custom resources' pod templates are mutated by the webhook (their checks stay compiled)."""
    return "." not in group


def compiles(paths: KindPaths) -> bool:
    """Whether the compiled policies find this kind's pod specs."""
    return all(
        p.count("*") <= 1 and p[:1] != ("*",) and not any(step.isdigit() or "/" in step for step in p)
        for p in (*paths.template_patterns, *paths.pod_spec_patterns)
    )


def digest(policies: PolicySet, name: str) -> str:
    """What a policy's compiled form depends on: the policy, the workload classes and kinds, and the
    exceptions naming it. A compiled output made from another digest is stale for that policy."""
    policy = next(p for p in policies.policies if p.metadata.name == name)
    content = {
        "policy": policy.model_dump(mode="json"),
        "classes": [c.model_dump(mode="json") for c in policies.classes],
        "kinds": sorted([k.group, k.kind, list(k.templates), list(k.pod_specs)] for k in policies.kinds.values()),
        "exceptions": [e.model_dump(mode="json") for e in policies.exceptions
                       if any(x.policy == name for x in e.spec.exceptions)],
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


#: a rule's run function (context, settings)
Run = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Offload:
    """What the slimmed webhook leaves to compiled policies: per (policy, rule), "none" or "rest",
    for the ``kinds`` the compiled policies reach (rules not named run whole)."""

    kinds: frozenset[tuple[str, str]]
    webhook: Mapping[tuple[str, str], WebhookPart]
    #: what any policy counts as a GPU (the compiled policies' GPU test of their pod specs)
    any_gpu: ResourceMatcher | None = None

    def run_for(self, whole: Run, rest: Run | None, policy: str, rule: str, kind: tuple[str, str]) -> Run:
        """What the engine runs of one rule of a policy on a kind (once per policy set: plans are kept):
        a mutation rule (and its checks) whole on a kind that is not ``built_in``."""
        reached = kind in self.kinds and (rule not in _MUTATIONS or built_in(kind[0]))
        part = self.webhook.get((policy, rule), "all") if reached else "all"
        return whole if part == "all" else OffloadedRule(whole, rest if part == "rest" else None, self.any_gpu)


def left_to_webhook(spec: Mapping[str, Any], any_gpu: ResourceMatcher | None) -> bool:
    """A pod spec the compiled policies leave alone (webhook.cel.podspecs.targets): one that names
    DRA claims (whether a claim hands out GPUs is cluster state), or gives a GPU a quantity outside
    ``quantity.PLAIN`` (CEL's quantity library cannot tell whether such a one is whole)."""
    if "resourceClaims" in spec:
        return True
    if any_gpu is None:
        return False
    for (list_name, index), names in resources.gpu_slots(spec, any_gpu).items():
        container = spec[list_name][index]
        for field in ("limits", "requests"):
            given = resources.resource_map(container, field)
            if any(quantity.is_edge(given.get(name)) for name in names):
                return True
    return False


class OffloadedRule:
    """A rule whose compiled parts kube-apiserver runs: on a pod spec the compiled policies leave
    alone (``left_to_webhook``), the whole rule; on the others, the parts left to the webhook
    (``rest``), or nothing."""

    __slots__ = ("whole", "rest", "any_gpu")

    def __init__(self, whole: Run, rest: Run | None, any_gpu: ResourceMatcher | None = None) -> None:
        self.whole, self.rest, self.any_gpu = whole, rest, any_gpu

    def __call__(self, ctx: Any, cfg: Any) -> None:
        if left_to_webhook(ctx.spec, self.any_gpu):
            self.whole(ctx, cfg)
        elif self.rest is not None:
            self.rest(ctx, cfg)


def record(policies: PolicySet, version: tuple[int, int]) -> dict[str, object]:
    """What a compiled output states about itself, for ``offload``: its Kubernetes version and the
    digest of every policy it compiled (written beside the manifests as offload.json)."""
    return {
        "kubeVersion": f"{version[0]}.{version[1]}",
        "policies": {p.metadata.name: digest(policies, p.metadata.name) for p in policies.policies},
    }


def offload(policies: PolicySet, stated: Mapping[str, object]) -> tuple[Offload, list[str]]:
    """The Offload for these policies, given a compiled output's record; and the policies it
    leaves whole because they changed since it was compiled (or it never compiled them)."""
    version = kube_version(str(stated.get("kubeVersion", "")))
    digests = stated.get("policies")
    digests = digests if isinstance(digests, dict) else {}
    stale = [p.metadata.name for p in policies.policies if digests.get(p.metadata.name) != digest(policies, p.metadata.name)]
    webhook = {
        (row.policy, row.rule): row.webhook
        for row in coverage(policies, version)
        if row.policy not in stale and row.webhook != "all"
    }
    return Offload(compilable_kinds(policies), webhook, policies.any_gpu), stale
