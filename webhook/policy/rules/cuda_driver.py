"""CUDA versus driver: an image whose CUDA is newer than the driver of every node the pod
could land on fails at start ("CUDA driver version is insufficient", or the container
toolkit's "unsatisfied condition: cuda>=X.Y") after it waited for, and held, a GPU.

validate: infer each GPU container's CUDA (webhook.gpu.images), find the
nodes the pod could land on (webhook.view.scheduling), read their drivers
from GFD labels (webhook.gpu.cuda) and report when none, or only some,
can run it. mutate (``partial: steer``, Pods only): when only some can, AND
a required node affinity into the pod that admits exactly the capable nodes
(by driver, and by GPU product where only forward compatibility runs it), so
it lands only where it runs; where no label can say that, the validating
webhook refuses it (``unsteerable``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from webhook.gpu import cuda, images, products, resources
from webhook.gpu.forward_compat import Branch
from webhook.kube import affinity, dra, workload
from webhook.kube.patch import pointer
from webhook.kube.value_text import text
from webhook.kube.workload import field_path
from webhook.policy import match, severity
from webhook.policy.context import RuleContext
from webhook.policy.settings.validation import CudaDriverRule
from webhook.view import scheduling

PHASES = ("mutate", "validate")

Node = Mapping[str, Any]


class _Need(NamedTuple):
    """One GPU container's CUDA and the oldest driver that runs it (a named tuple: one or more per GPU admission)."""

    ref: resources.ContainerRef
    version: cuda.CudaVersion
    source: str
    driver: cuda.DriverVersion
    #: branches its cuda-compat runs it on (data-center GPUs): documented, plus the policy's
    branches: tuple[Branch, ...]


class _Nodes:
    """The kinds of node the pod could land on, sorted by whether their driver runs it.

    Each list holds one node per kind (a node group's shape, or a node);
    ``size`` says how many nodes a list stands for.
    """

    __slots__ = ("eligible", "capable", "incapable", "unlabelled", "counts", "drivers")

    def __init__(self) -> None:
        self.eligible: list[Node] = []
        self.capable: list[Node] = []
        self.incapable: list[Node] = []
        self.unlabelled: list[Node] = []
        self.counts: dict[int, int] = {}  # id(node) → how many nodes it stands for
        self.drivers: dict[int, cuda.DriverVersion] = {}  # id(node) → its driver

    def size(self, nodes: Sequence[Node]) -> int:
        return sum(self.counts[id(n)] for n in nodes)

    def driver(self, node: Node) -> cuda.DriverVersion:
        return self.drivers[id(node)]  # only asked of nodes sorted by their driver

    def newest(self, nodes: Sequence[Node]) -> cuda.DriverVersion:
        return max(self.driver(n) for n in nodes)

    def listed(self, nodes: Sequence[Node]) -> str:
        return ", ".join(str(d) for d in sorted({self.driver(n) for n in nodes}, reverse=True))


def run(ctx: RuleContext, cfg: CudaDriverRule) -> None:
    if ctx.phase == "mutate":
        if cfg.partial == "steer" and ctx.target.is_pod:
            _steer(ctx, cfg)
        return
    needs = _needs(ctx, cfg, report=True)
    if not needs:
        return
    availability = ctx.view.availability("nodes")
    if not availability.known:
        severity.unavailable(ctx, cfg, availability.reason, "CUDA against node drivers")
        return
    _judge(ctx, cfg, needs, _sort_nodes(ctx, cfg, needs))


def _needs(ctx: RuleContext, cfg: CudaDriverRule, *, report: bool) -> list[_Need]:
    annotations = _annotations(ctx)
    # whether the pod states its CUDA (then nothing is shared with other pods of its images)
    stated = any(key.startswith(images.ANNOTATION) for key in annotations)
    rules = [(entry.image, entry.cuda) for entry in cfg.images]
    needs = []
    for ref in ctx.gpu_containers():
        found = _need(ctx, cfg, ref, annotations if stated else None, rules)
        if isinstance(found, _Need):
            needs.append(found)
        elif found and report:
            severity.report(ctx, cfg.unknownCuda, f"{ctx.where(ref)}: {found}", _field(ctx, ref))
    return needs


#: how many images one policy remembers the needs of (images are few; bound them anyway)
IMAGE_MEMO_SIZE = 4096

_Inference = tuple[images.Inferred | str, cuda.DriverVersion | None, tuple[Branch, ...]]


def _need(
    ctx: RuleContext, cfg: CudaDriverRule, ref: resources.ContainerRef, annotations: Mapping[str, str] | None,
    rules: Sequence[tuple[str, str]],
) -> _Need | str:
    """What one container needs, or why that is unknown ("" for an image without CUDA).

    ``annotations``: the pod's, when it states a CUDA version in them (None otherwise).
    """
    image = text(ref.container.get("image") or "")
    config = ctx.view.image_config(image)
    if annotations is not None:
        # the pod states its CUDA: nothing to share with other pods of the image
        found, driver, branches = _infer(cfg, ref.name, image, annotations, rules, config)
    else:
        # every pod of an image needs the same: worked out once per image (and resolver answer)
        memo = cfg.image_memo
        hit = memo.get(image)
        if hit is None or hit[0] is not config:
            if len(memo) >= IMAGE_MEMO_SIZE:
                memo.clear()
            hit = memo[image] = (config, _infer(cfg, ref.name, image, {}, rules, config))
        found, driver, branches = hit[1]
    if isinstance(found, str):
        # what to do goes last and the image before it: a warning over 256 characters loses
        # its middle, so a long image (a digest) is what gets cut, not the remedy
        meta = ctx.target.meta_path
        where = f" in {field_path(meta)}.annotations" if meta is not None else ""
        return f"{found} (image {image or 'none'}); set annotation {images.ANNOTATION}[.{ref.name}]{where}"
    if found.version is None:
        return ""  # no CUDA in the image: no driver is too old for it
    if driver is None:
        return f"CUDA {found.version} ({found.source}) is not in the driver table; add it to minDrivers"
    return _Need(ref, found.version, found.source, driver, branches)


def _infer(
    cfg: CudaDriverRule, name: str, image: str, annotations: Mapping[str, str], rules: Sequence[tuple[str, str]],
    config: images.ImageConfig | None,
) -> _Inference:
    """The image's CUDA (or why it is unknown), the oldest driver for it and its forward-compatible branches."""
    found = images.infer(name, image, annotations, rules, config)
    if isinstance(found, str) or found.version is None:
        return found, None, ()
    return found, cuda.min_driver(found.version, cfg.compatibility, cfg.driver_index), _branches(cfg, image, found)


def _branches(cfg: CudaDriverRule, image: str, found: images.Inferred) -> tuple[Branch, ...]:
    """The driver branches forward compatibility runs this image on, documented or the policy's."""
    compat = cfg.forwardCompat
    if compat.mode == "off":
        return ()
    listed = compat.driverBranches if any(fnmatchcase(image, g) for g in compat.images) else []
    extra = tuple(Branch(major, cuda.DriverVersion((major, 0, 0), str(major))) for major in listed)
    return found.branches + extra


def _sort_nodes(ctx: RuleContext, cfg: CudaDriverRule, needs: Sequence[_Need]) -> _Nodes:
    asks = {n: c for n, c in ctx.extended_gpus().items() if c > 0}
    node_filter = scheduling.NodeFilter(ctx.spec, asks, _implied_tolerations(ctx, cfg), _claimed_devices(ctx))
    result = _Nodes()
    # one check per kind of node (webhook.view.nodegroups), however many nodes are alike;
    # nodes without GFD's driver labels answer with the driver their DRA devices report
    for node, count, driver, device_product in node_filter.placements(ctx.view.node_groups()):
        result.counts[id(node)] = count
        result.eligible.append(node)
        if driver is None:
            result.unlabelled.append(node)
            continue
        result.drivers[id(node)] = driver
        for need in needs:
            if not _runs(cfg, need, node, driver, device_product):
                result.incapable.append(node)
                break
        else:
            result.capable.append(node)
    return result


def _claimed_devices(ctx: RuleContext) -> dra.Alternatives[tuple[str, str]] | None:
    """The devices the pod's GPU claims may take on its node, per request its alternatives as
    ((driver, type), devices), when ResourceSlices are known."""
    claims = ctx.claims
    if claims is None or not claims.alternatives or not ctx.view.availability("resourceslices").known:
        return None
    wanted: list[list[tuple[tuple[str, str], int]]] = []
    for request in claims.alternatives:
        kinds = [((info.driver, info.device_type), count) for name, count in request
                 if (info := ctx.device_classes.get(name)) is not None]
        if kinds:
            wanted.append(kinds)
    return wanted


def _runs(cfg: CudaDriverRule, need: _Need, node: Node, driver: cuda.DriverVersion, device_product: str) -> bool:
    if need.driver <= driver:
        return True
    return any(b.admits(driver) for b in need.branches) and _data_center(cfg, node, device_product)


def _data_center(cfg: CudaDriverRule, node: Node, device_product: str) -> bool:
    """Whether the node's GPUs run forward compatibility: the policy's selector, else the GPU
    product (GFD's label, else the productName its DRA devices publish)."""
    compat, labels = cfg.forwardCompat, scheduling.node_labels(node)
    if compat.nodes is not None:
        return match.selector_matches(compat.nodes, labels)
    product = str(labels.get(compat.productLabel) or device_product)
    return products.is_data_center(product, tuple(compat.dataCenterProducts))


def _implied_tolerations(ctx: RuleContext, cfg: CudaDriverRule) -> list[Mapping[str, Any]]:
    """Tolerations the pod will have that its spec may not show yet."""
    implied: list[Mapping[str, Any]] = []
    if not ctx.target.is_pod and not _daemon_set(ctx):
        # a template's pods get the GPU tolerations when they are created
        # (this webhook's mutation, or the ExtendedResourceToleration plugin); not a
        # DaemonSet's: its controller picks their nodes by the template's own tolerations
        implied.extend({"key": key, "operator": "Exists"} for key in cfg.templateTolerates)
    return implied


def _daemon_set(ctx: RuleContext) -> bool:
    return workload.binds_to_nodes(ctx.request.group, ctx.request.kind, ctx.target)


def _judge(ctx: RuleContext, cfg: CudaDriverRule, needs: Sequence[_Need], nodes: _Nodes) -> None:
    if nodes.capable and not nodes.incapable:
        return  # the common case: every node it could land on runs it
    known = [*nodes.capable, *nodes.incapable]
    top = max(needs, key=lambda n: n.driver)
    where, path = ctx.where(top.ref), _field(ctx, top.ref)
    wants = f"CUDA {top.version} ({top.source}) needs driver >= {top.driver}"
    if not nodes.eligible:
        ctx.note(f"{where}: {wants}; no known node matches this pod's selectors, tolerations and GPU "
                 "requests, so no driver was checked", path, result="skip")
    elif not known:
        ctx.note(f"{where}: {wants}; none of the {nodes.size(nodes.eligible)} nodes it could land on has a "
                 "driver-version label (GPU Feature Discovery), so none was checked", path, result="skip")
    elif not nodes.capable:
        newest = nodes.newest(nodes.incapable)
        message = (f"{where}: {wants}; the newest driver on the {nodes.size(known)} node(s) it could land on is "
                   f"{newest}{_runs_up_to(newest, cfg)}{_forward_hint(top)}")
        severity.report(ctx, "warn" if nodes.unlabelled else "deny", message, path)
    elif nodes.incapable:
        _partial(ctx, cfg, nodes, needs, f"{where}: {wants}; only {nodes.size(nodes.capable)} of {nodes.size(known)} node(s) it could "
                 f"land on have it ({nodes.listed(nodes.incapable)} on the others)", path)


def _partial(ctx: RuleContext, cfg: CudaDriverRule, nodes: _Nodes, needs: Sequence[_Need], message: str,
             path: str) -> None:
    if cfg.partial != "steer":
        severity.report(ctx, cfg.partial, f"{message}; pin it with node affinity on {cuda.DRIVER_FULL}", path)
    elif _daemon_set(ctx):
        # (short: as a warning, kube-apiserver keeps 256 characters; the message before it is long already)
        severity.report(ctx, cfg.unsteerable, f"{message}; a DaemonSet puts a pod on each: select only the capable "
                        f"ones in its template (by {cuda.DRIVER_FULL}) or use an image they all run", path)
    elif not ctx.target.is_pod:
        ctx.note(f"{message}; its pods will be steered onto them", path, result="pass")
    elif _steering(cfg, nodes, needs):
        # steering would have removed the other nodes: the mutating webhook did not run for it
        severity.report(ctx, cfg.unsteerable, f"{message}, and it was not steered onto them", path)
    else:
        # no label tells the capable nodes apart (no full driver-version label; a forward-compatible
        # GPU known only by its DRA devices): admitted, it may land where CUDA cannot start
        severity.report(ctx, cfg.unsteerable, f"{message}, and no node affinity could steer it onto them "
                        f"(label the capable nodes with {cuda.DRIVER_FULL} and their GPU product, or pin it)", path)


def _steer(ctx: RuleContext, cfg: CudaDriverRule) -> None:
    if not ctx.view.availability("nodes").known:  # nothing to steer by
        return
    needs = _needs(ctx, cfg, report=False)
    if not needs:
        return
    nodes = _sort_nodes(ctx, cfg, needs)
    if not nodes.incapable:
        return
    alternatives = _steering(cfg, nodes, needs)
    # none: no label tells the capable nodes apart; the validating webhook refuses (``unsteerable``)
    if alternatives and affinity.require_any(ctx.builder, ctx.target.spec_path, alternatives).added:
        ctx.changed("nodeAffinity")


def _steering(cfg: CudaDriverRule, nodes: _Nodes, needs: Sequence[_Need]) -> list[list[dict[str, Any]]]:
    """Where the pod may go, as alternatives (ORed): exactly the capable nodes known now, or any
    newer branch or newer release of the oldest branch that runs every container natively.

    A node that runs it natively does so by its driver alone: every node of that driver does.
    One that runs it through forward compatibility does so by its driver *and* its GPU (data-center
    GPUs only; a GeForce of the same driver fails with error 804), so that alternative names both:
    the forward-compatible drivers and the GPU products (or the policy's node selector) of the
    capable nodes. Any of those drivers runs it on any of those products, so the cross product
    admits no node the engine judged incapable.

    A driver newer than the native minimum always runs the image (drivers are backward compatible),
    so a rolling driver upgrade keeps a still-Pending pod schedulable. No alternative when no label
    tells the capable nodes apart (no driver label, or a forward-compatible GPU named only by its
    DRA devices)."""
    native: set[str] = set()
    forward: set[str] = set()
    products_seen: set[str] = set()
    compat = cfg.forwardCompat
    for node in nodes.capable:
        labels = scheduling.node_labels(node)
        full = str(labels.get(cuda.DRIVER_FULL) or "")
        if not full:
            continue
        driver = nodes.driver(node)
        if all(need.driver <= driver for need in needs):
            native.add(full)
        elif compat.nodes is not None:
            forward.add(full)
        elif product := str(labels.get(compat.productLabel) or ""):
            forward.add(full)
            products_seen.add(product)
    alternatives: list[list[dict[str, Any]]] = []
    if native:
        alternatives.append([{"key": cuda.DRIVER_FULL, "operator": "In", "values": sorted(native)}])
    if forward:
        alternatives.append([{"key": cuda.DRIVER_FULL, "operator": "In", "values": sorted(forward)},
                             *_data_center_expressions(cfg, sorted(products_seen))])
    if not alternatives:
        return []
    major, minor, _ = max(need.driver for need in needs).parts
    return [
        *alternatives,
        [{"key": cuda.DRIVER_MAJOR, "operator": "Gt", "values": [str(major)]}],
        [{"key": cuda.DRIVER_MAJOR, "operator": "In", "values": [str(major)]},
         {"key": cuda.DRIVER_MINOR, "operator": "Gt", "values": [str(minor)]}],
    ]


def _data_center_expressions(cfg: CudaDriverRule, products_seen: Sequence[str]) -> list[dict[str, Any]]:
    """Node selector expressions for the nodes whose GPUs run forward compatibility: the policy's
    selector where it sets one, else the data-center products of the capable nodes."""
    compat = cfg.forwardCompat
    if compat.nodes is None:
        return [{"key": compat.productLabel, "operator": "In", "values": list(products_seen)}]
    pinned = [{"key": key, "operator": "In", "values": [value]} for key, value in sorted(compat.nodes.matchLabels.items())]
    listed = [{"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
              for r in compat.nodes.matchExpressions]
    return [*pinned, *listed]


def _runs_up_to(driver: cuda.DriverVersion, cfg: CudaDriverRule) -> str:
    newest = cuda.newest_supported(driver, cfg.driver_index)
    return f", which runs CUDA <= {newest}: use an image built for it or target newer nodes" if newest else ""


def _forward_hint(need: _Need) -> str:
    if not need.branches:
        return ""
    names = "/".join(sorted({str(b) for b in need.branches}))
    return f"; forward compatibility would run it on data-center GPUs with {names}"


def _annotations(ctx: RuleContext) -> dict[str, str]:
    meta = ctx.meta if ctx.target.meta_path is not None else (ctx.request.object or {}).get("metadata")
    raw = meta.get("annotations") if isinstance(meta, Mapping) else None
    return {text(k): text(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _field(ctx: RuleContext, ref: resources.ContainerRef) -> str:
    return pointer(ctx.spec_path(ref.list_name, ref.index, "image"))
