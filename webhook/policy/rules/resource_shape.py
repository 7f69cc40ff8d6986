"""GPU resource shape: GPU requests that cannot work, found in pods and in every pod template.

kube-apiserver refuses a fractional, requests-only or overcommitted extended
resource on a Pod, but never looks inside a Deployment's or a custom
resource's template: there the failure shows up later, as pods that never
appear. This rule says so at apply time, with where and what to write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from webhook.gpu import mig, resources
from webhook.kube import quantity, value_text, workload
from webhook.kube.patch import pointer
from webhook.policy import severity
from webhook.policy.context import RuleContext
from webhook.policy.settings.validation import ResourceShapeRule
from webhook.view import nodegroups, scheduling

PHASES = ("validate",)


def run(ctx: RuleContext, cfg: ResourceShapeRule) -> None:
    sharing = cfg.sharingSchemes.matcher
    refs = list(resources.containers(ctx.spec))
    for ref in refs:
        _check_container(ctx, cfg, ref, sharing)
    annotations = ctx.meta.get("annotations")
    for key in cfg.sharingSchemes.annotations:
        if isinstance(annotations, Mapping) and key in annotations:
            path = pointer((*(ctx.target.meta_path or ()), "annotations", key))
            _check_scheme(ctx, cfg, key, ctx.where(field_path="metadata.annotations"), path)
    _check_init_only(ctx, cfg, refs)
    if cfg.maxPerPod is not None:
        # maxPerPod counts DRA claims' devices too; node allocatable only ever shows extended resources
        _check_max(ctx, cfg, {n: c for n, c in ctx.pod_gpus().items() if not sharing(n)})
    run_rest(ctx, cfg)


def run_rest(ctx: RuleContext, cfg: ResourceShapeRule) -> None:
    """The part a compiled policy leaves to the webhook (webhook.policy.offload): GPUs against the
    largest node, which needs the nodes."""
    if cfg.nodeCapacity and ctx.view.availability("nodes").known:
        sharing = cfg.sharingSchemes.matcher
        counts = {n: c for n, c in ctx.extended_gpus().items() if not sharing(n)}
        if counts:
            pinned = ctx.spec.get("nodeName")
            if not (type(pinned) is str and pinned and _check_pinned_node(ctx, pinned, counts)):
                _check_node_capacity(ctx, counts)
            if workload.binds_to_nodes(ctx.request.group, ctx.request.kind, ctx.target):
                _check_daemon_set_nodes(ctx, counts)


def _check_container(
    ctx: RuleContext, cfg: ResourceShapeRule, ref: resources.ContainerRef, sharing: resources.ResourceMatcher
) -> None:
    limits, requests = resources.resource_map(ref.container, "limits"), resources.resource_map(ref.container, "requests")
    named = {n for n in {*limits, *requests} if type(n) is str and (ctx.is_gpu(n) or sharing(n))}
    # a GPU given as zero (a chart's CPU mode: "nvidia.com/gpu: 0") is no request: nothing to check
    for name in sorted(resources.held(named, limits, requests) if named else ()):
        _check_quantities(ctx, ref, name)
        if sharing(name):
            _check_scheme(ctx, cfg, name, ctx.where(ref, "resources"), _pointer(ctx, ref.list_name, ref.index, "resources"))
        elif mig.profile_of(name) is not None:
            _check_mig(ctx, cfg, ref, name)


def _pointer(ctx: RuleContext, *rest: str | int) -> str:
    return pointer(ctx.spec_path(*rest))


def _check_quantities(ctx: RuleContext, ref: resources.ContainerRef, name: str) -> None:
    raw = {f: resources.resource_map(ref.container, f).get(name) for f in ("limits", "requests")}
    values: dict[str, Decimal | None] = {}
    for field, text in raw.items():
        if text is None:
            continue
        value = values[field] = quantity.parse_quantity(text)
        if value is not None and value >= 0 and quantity.is_whole(value):
            continue  # the common case: where and path are worked out only for a finding
        where, path = ctx.where(ref, f"resources.{field}"), _pointer(ctx, ref.list_name, ref.index, "resources", field, name)
        if value is not None and value < 0:
            ctx.report(f"{where}: {name} is {text}, below zero; ask for a whole number of devices", path)
        elif value is None:
            shown = str(text).lower() if isinstance(text, bool) else value_text.shown(text)  # YAML's yes/no are booleans
            ctx.report(f"{where}: {name}: {shown} is not a valid quantity; ask for a whole number of devices", path)
        else:
            ctx.report(f"{where}: {name} is {text}, a fraction; GPUs are whole devices: ask for an integer "
                       "(share GPUs through MIG or time-slicing)", path)
    if "requests" in values and "limits" not in values:
        asked = value_text.text(raw["requests"])
        ctx.report(f"{ctx.where(ref, 'resources.requests')}: {name} is requested ({asked}) without a "
                   f"limit; set limits.{name}: {asked} (GPUs are allocated by limit)",
                   _pointer(ctx, ref.list_name, ref.index, "resources", "limits"))
    elif "requests" in values and values["requests"] != values["limits"]:
        ctx.report(f"{ctx.where(ref, 'resources')}: {name} request {value_text.text(raw['requests'])} differs from limit "
                   f"{value_text.text(raw['limits'])}; GPUs cannot be overcommitted: make them equal",
                   _pointer(ctx, ref.list_name, ref.index, "resources", "requests", name))


def _check_mig(ctx: RuleContext, cfg: ResourceShapeRule, ref: resources.ContainerRef, name: str) -> None:
    profile = mig.profile_of(name) or ""
    allowed = [mig.resource_profile(p) for p in cfg.migProfiles]
    where, path = ctx.where(ref, "resources"), _pointer(ctx, ref.list_name, ref.index, "resources")
    if profile not in mig.valid_profiles() and profile not in allowed and not _advertised(ctx, name):
        if mig.well_formed(profile):
            # a GPU newer than our table brings profiles we cannot know: warn, never deny
            severity.report(ctx, "warn", f"{where}: {name} is not a MIG profile of the GPUs gpu-admission knows, "
                            "and no node advertises it; check the profile name", path)
        else:
            ctx.report(f"{where}: {name} is not a MIG profile (e.g. nvidia.com/mig-1g.10gb; "
                       "+me is spelt .me)", path)
    elif allowed and profile not in allowed:
        ctx.report(f"{where}: {name} is not an allowed MIG profile; the policy allows {', '.join(allowed)}", path)


def _advertised(ctx: RuleContext, resource: str) -> bool:
    """Does a node of the cluster offer this resource (when the view knows the nodes)?"""
    if not ctx.view.availability("nodes").known:
        return False
    return any(group.offers(resource) for group in ctx.view.node_groups())


def _check_scheme(ctx: RuleContext, cfg: ResourceShapeRule, name: str, where: str, path: str) -> None:
    schemes = cfg.sharingSchemes
    if resources.ResourceMatcher.of(schemes.allowed)(name):
        return
    allowed = ", ".join(schemes.allowed) or "none"
    severity.report(ctx, schemes.otherwise,
                    f"{where}: {name} asks for a GPU share through a scheme this cluster does not run "
                    f"(allowed: {allowed}), so the pod would stay Pending: ask for whole GPUs or a MIG device", path)


def _check_init_only(ctx: RuleContext, cfg: ResourceShapeRule, refs: list[resources.ContainerRef]) -> None:
    holders = [r for r in refs if ctx.gpu_names(r)]
    # a native sidecar (an init container with restartPolicy: Always) runs beside the app containers
    # for the pod's whole life: its GPUs are in use, as an app container's are
    if not holders or any(not r.is_init or resources.is_sidecar(r.container) for r in holders):
        return
    names = ", ".join(r.label() for r in holders)
    severity.report(ctx, cfg.initOnly,
                    f"{ctx.where()}: only init containers request GPUs ({names}); the pod holds them "
                    "while its app containers run without any: request GPUs in the app containers that use them",
                    _pointer(ctx, "initContainers"))


def _check_max(ctx: RuleContext, cfg: ResourceShapeRule, counts: Mapping[str, Decimal]) -> None:
    if cfg.maxPerPod is None:
        return
    caps = cfg.maxPerPod if isinstance(cfg.maxPerPod, dict) else {"*": cfg.maxPerPod}
    for name, count in sorted(counts.items()):
        cap = _cap_for(caps, name)
        if cap is not None and count > cap:
            ctx.report(f"{ctx.where()}: asks for {count} {name} in one pod; the policy allows at most {cap} per pod: "
                       "spread the work over more pods with fewer GPUs each (more replicas or workers)",
                       _pointer(ctx, "containers"))


def _cap_for(caps: Mapping[str, int], name: str) -> int | None:
    if name in caps:
        return caps[name]
    prefixes = sorted((p for p in caps if p.endswith("*") and name.startswith(p[:-1])), key=len, reverse=True)
    return caps[prefixes[0]] if prefixes else None


def _check_node_capacity(ctx: RuleContext, counts: Mapping[str, Decimal]) -> None:
    groups = ctx.view.node_groups()
    for name, count in sorted(counts.items()):
        largest, node = max((group.largest(name) for group in groups), default=(Decimal(0), ""))
        # no node offers it at all: an autoscaler may add one, so say nothing
        if largest > 0 and count > largest:
            ctx.report(f"{ctx.where()}: asks for {count} {name} in one pod, more than any node offers "
                       f"(largest: {largest} on {node}); split the work across pods", _pointer(ctx, "containers"))


#: GPU Feature Discovery's label of a node with NVIDIA GPUs (FACTS.md §2)
GPU_PRESENT = "nvidia.com/gpu.present"
#: the kubelet's annotation of a static pod's mirror (the pod runs whatever the API answers)
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _check_pinned_node(ctx: RuleContext, name: str, counts: Mapping[str, Decimal]) -> bool:
    """A pod pinned by ``spec.nodeName`` skips the scheduler: the kubelet of that node admits it or
    fails it at once (``OutOf<resource>``), and a template's controller makes another, and another.
    Refuse what the named node cannot give; False when the view does not know the node (a node
    still joining, a typo: the kubelet's answer is as clear as ours could be), which leaves the
    largest node's check to run instead.

    A node GPU Feature Discovery labels as having GPUs but that offers no GPU resource at all yet
    (its device plugin not registered: a node just booted, a driver upgrade) is only warned of. A
    static pod's mirror, which the kubelet runs whatever the API answers, is left alone (nor is it
    held to the largest node); a template saying it is one is judged as any. The warning leaves the
    largest node's check to run too. Messages start with where and end with the node and the fix: a
    warning past 256 characters loses its middle (review.limit_warnings)."""
    annotations = ctx.meta.get("annotations")
    if ctx.target.is_pod and isinstance(annotations, Mapping) and MIRROR_ANNOTATION in annotations:
        return True
    pinned = nodegroups.member(ctx.view.node_groups(), name)
    if pinned is None:
        return False
    node = pinned[1]
    for res, count in sorted(counts.items()):
        has = nodegroups.amount(node, res)
        if has < count:
            break
    else:
        return True
    if scheduling.node_labels(node).get(GPU_PRESENT) == "true" and not _offers_gpus(ctx, node):
        severity.report(ctx, "warn", f"{ctx.where()}: its kubelet fails it (OutOf{res}) until the device plugin of "
                        f"its spec.nodeName registers GPUs: {name}", _pointer(ctx, "nodeName"))
        return False
    severity.report(ctx, "deny", f"{ctx.where()}: its kubelet fails it (OutOf{res}): its node offers {has} of the {count} "
                    f"{res} it asks for; remove spec.nodeName, or name a node with them instead of {name}",
                    _pointer(ctx, "nodeName"))
    return True


def _offers_gpus(ctx: RuleContext, node: Mapping[str, Any]) -> bool:
    """Does ``node`` offer any GPU resource (whole GPUs, MIG profiles, shares) in its allocatable?"""
    return any(type(res) is str and ctx.is_gpu(res) and nodegroups.amount(node, res) > 0
               for res in nodegroups.allocatable(node))


def _check_daemon_set_nodes(ctx: RuleContext, counts: Mapping[str, Decimal]) -> None:
    """A DaemonSet's pods go to every node its template selects and tolerates, whatever they ask for
    (webhook.kube.workload.binds_to_nodes): warn of the nodes it reaches that cannot run its pods (they
    stay Pending there), and of a template that reaches none of the nodes that offer its GPUs. One
    warning, its fix at the end (kube-apiserver keeps 256 characters of a warning, cutting the middle)."""
    groups = ctx.view.node_groups()
    own = scheduling.NodeFilter(ctx.spec, {})
    reaching = own.placements(groups)
    reached = sum(p.nodes for p in reaching)
    fits = scheduling.NodeFilter(ctx.spec, counts)
    fitting_placements = fits.placements(groups)
    fitting = sum(p.nodes for p in fitting_placements)
    asks = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    taints: list[str] = []
    offering: list[scheduling.Placement] = []
    if not fitting:
        # the nodes that offer its GPUs, whatever their taints: the taints the template does not tolerate
        offering = scheduling.NodeFilter({**ctx.spec, "tolerations": [{"operator": "Exists"}]}, counts).placements(groups)
        taints = sorted({f"{value_text.text(t.get('key'))}:{value_text.text(t.get('effect'))}"
                         for p in offering for t in nodegroups.blocking_taints(p.node) if not own.tolerates(t)})
    if reached == fitting and not taints:
        return
    found, fixes = [], []
    if reached > fitting:
        lacking = [p.node for p in reaching if not fits.admits(p.node)]
        found.append(f"{reached - fitting} of {reached} node(s) without {asks} ({_name(groups, lacking[0])}: Pending)")
        with_gpus = [p.node for p in (fitting_placements if fitting else offering)]
        fixes.append(_selection(ctx.spec, lacking, with_gpus, asks))
    if taints:
        offered = sum(p.nodes for p in offering)
        found.append(f"none of the {offered} with it" if found else f"none of the {offered} node(s) with {asks}")
        fixes.insert(0, f"tolerate {', '.join(taints[:2])}")
    severity.report(ctx, "warn", f"{ctx.where()}: its pods reach {' and '.join(found)}: {', '.join(fixes)}",
                    _pointer(ctx, "containers"))


def _selection(spec: Mapping[str, Any], lacking: list[Any], with_gpus: list[Any], asks: str) -> str:
    """How the template should select the nodes with its GPUs: by GFD's label where the template does not
    select it yet, every node with them carries it and none it reaches without them does; else in general
    terms."""
    selector = spec.get("nodeSelector")
    if (not (isinstance(selector, Mapping) and GPU_PRESENT in selector) and with_gpus
            and all(scheduling.node_labels(n).get(GPU_PRESENT) == "true" for n in with_gpus)
            and not any(scheduling.node_labels(n).get(GPU_PRESENT) == "true" for n in lacking)):
        return f"select {GPU_PRESENT}=true"
    return f"select only nodes with {asks}"


def _name(groups: Sequence[nodegroups.NodeGroup], node: Mapping[str, Any]) -> str:
    """A node's name; for a group's shape (a placement of the whole group), its last member's."""
    return scheduling.node_name(node) or next((g.last for g in groups if g.shape is node), "")
