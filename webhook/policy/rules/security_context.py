"""Non-root security context meeting PodSecurity "restricted" (FACTS.md §5).

Level ``default`` fills only what the user left unset, and never in a way
that breaks the pod: a pod where something explicitly runs as root gets no
pod identity (runAsNonRoot, runAsUser, runAsGroup, fsGroup), a container
that runs as root keeps its capabilities (root without CHOWN, SETUID or
DAC_OVERRIDE breaks apt-get and most root images), and a privileged
container gets no allowPrivilegeEscalation=false (the API rejects that
pair). Level ``enforce`` also reports explicit violations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.gpu import resources
from webhook.kube.patch import sublist, submap
from webhook.kube.value_text import text
from webhook.kube.workload import is_windows
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import SecurityContextRule

PHASES = ("mutate",)


class Settings:
    """What ``run`` reads of the rule's settings on every pod, made with the plans of a policy set."""

    def __init__(self, cfg: SecurityContextRule) -> None:
        self.cfg = cfg
        self.unset_pod_defaults: dict[str, Any] = cfg.unset_pod_defaults
        self.seccomp: str | None = cfg.seccompProfile


def run(ctx: RuleContext, settings: Settings) -> None:
    spec = ctx.spec
    if is_windows(spec):
        return  # the API rejects these Linux fields on Windows pods
    if not spec.get("securityContext") and _without_contexts(spec):
        # absent, null or empty everywhere (a falsy non-map counts as empty, as _sc reads
        # it): nothing to report at either level, every default holds
        _write_whole(ctx, settings)
        ctx.changed("securityContext")
        return
    cfg = settings.cfg
    refs = resources.containers(spec)
    if cfg.level == "enforce":
        _report_violations(ctx, cfg, refs)
    pod_sc, container_scs = _sc(spec), [_sc(ref.container) for ref in refs]
    changed = _pod_defaults(ctx, cfg, pod_sc, container_scs)
    pod_root = _asks_for_root(pod_sc)
    for ref, sc in zip(refs, container_scs):
        changed |= _container_defaults(ctx, ref, sc, pod_root)
    if changed:
        ctx.changed("securityContext")


def _without_contexts(spec: dict[str, Any]) -> bool:
    """Does no container of the pod spec (as ``resources.containers`` has them) set a securityContext?"""
    for list_name in resources.CONTAINER_LISTS:
        items = spec.get(list_name)
        if type(items) is list:
            for container in items:
                if type(container) is dict and container.get("securityContext"):
                    return False
    return True


def _write_whole(ctx: RuleContext, settings: Settings) -> None:
    """The common case, nothing set anywhere: each context is written as one operation.

    (What _pod_defaults and _container_defaults decide when every context is empty.)
    """
    builder, spec = ctx.builder, ctx.spec
    wanted, seccomp = dict(settings.unset_pod_defaults), settings.seccomp
    if seccomp:  # no container has one
        wanted["seccompProfile"] = {"type": seccomp}
    builder.put(spec, ctx.spec_at, "securityContext", wanted)
    # one value for every container (the builder copies a value before any write into it, and
    # the patch is JSON text to kube-apiserver): one map per pod, not per container
    value = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    for list_name in resources.CONTAINER_LISTS:  # every container that is a map (as resources.containers)
        items = spec.get(list_name)
        if type(items) is list:
            for index in range(len(items)):
                if type(items[index]) is dict:
                    container, at = ctx.container_at(list_name, index)
                    builder.put(container, at, "securityContext", value)


def _sc(obj: Mapping[str, Any]) -> dict[str, Any]:
    return submap(obj, "securityContext")


def _asks_for_root(sc: Mapping[str, Any]) -> bool:
    return sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False


def _runs_as_root(sc: Mapping[str, Any], pod_root: bool) -> bool:
    """Does the container ask for root itself, or through the pod's context without overriding it?"""
    if _asks_for_root(sc):
        return True
    return pod_root and sc.get("runAsUser") is None and sc.get("runAsNonRoot") is not True


def _needs_escalation(sc: Mapping[str, Any]) -> bool:
    """privileged, or CAP_SYS_ADMIN: the API rejects allowPrivilegeEscalation: false with either."""
    if sc.get("privileged") is True:
        return True
    added = sublist(submap(sc, "capabilities"), "add")
    return "CAP_SYS_ADMIN" in added or "SYS_ADMIN" in added


def _pod_defaults(
    ctx: RuleContext, cfg: SecurityContextRule, pod_sc: Mapping[str, Any], container_scs: list[dict[str, Any]]
) -> bool:
    # a pod or container that asks for root keeps it: forcing a UID onto it
    # would only trade a policy violation for a container that cannot start
    explicit_root = _asks_for_root(pod_sc)
    every_container_has_seccomp = bool(container_scs)
    for sc in container_scs:
        if sc:
            explicit_root = explicit_root or _asks_for_root(sc)
            every_container_has_seccomp = every_container_has_seccomp and bool(sc.get("seccompProfile"))
        else:
            every_container_has_seccomp = False
    # the defaults of a pod with nothing set, less what this pod's settings rule out
    wanted = dict(cfg.unset_pod_defaults)
    if explicit_root:
        # the pod's identity is the user's: no group 1000 for a root process, and no
        # fsGroup either (it is there so UID 1000 can write volumes; here it would only
        # chown them to a group nothing asked for)
        for key in _IDENTITY:
            wanted.pop(key, None)
    elif "runAsNonRoot" in pod_sc:
        del wanted["runAsNonRoot"]
    if pod_sc.get("fsGroup") is not None:
        wanted.pop("fsGroup", None)
        wanted.pop("fsGroupChangePolicy", None)
    if cfg.seccompProfile and not every_container_has_seccomp:
        wanted["seccompProfile"] = {"type": cfg.seccompProfile}
    if not pod_sc:  # nothing set yet: one operation writes it whole
        return ctx.builder.put(ctx.spec, ctx.spec_at, "securityContext", wanted) if wanted else False
    return ctx.builder.fill((*ctx.target.spec_path, "securityContext"), wanted)


def _container_defaults(ctx: RuleContext, ref: resources.ContainerRef, sc: Mapping[str, Any], pod_root: bool) -> bool:
    if not sc:  # the common case: nothing set, so everything is written as one operation
        container, at = ctx.container_at(ref.list_name, ref.index)
        return ctx.builder.put(
            container, at, "securityContext",
            {"allowPrivilegeEscalation": False} if pod_root else
            {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        )
    path = ctx.spec_path(ref.list_name, ref.index, "securityContext")
    if _needs_escalation(sc):
        return False
    if _runs_as_root(sc, pod_root):
        # root keeps its capabilities: without CHOWN, SETUID or DAC_OVERRIDE it cannot do what it is root for
        return ctx.builder.fill(path, {"allowPrivilegeEscalation": False})
    caps = submap(sc, "capabilities")
    has_caps = isinstance(sc.get("capabilities"), dict)  # an empty map too: fill does not look inside it
    drop = caps.get("drop")
    wanted: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if not has_caps:
        wanted["capabilities"] = {"drop": ["ALL"]}
    changed = ctx.builder.fill(path, wanted)
    if has_caps and not isinstance(drop, list):
        changed |= ctx.builder.set((*path, "capabilities", "drop"), ["ALL"])
    elif has_caps and isinstance(drop, list) and "ALL" not in drop:
        ctx.builder.append((*path, "capabilities", "drop"), "ALL")
        changed = True
    return changed


#: the pod-level fields that choose who the pod's processes are
_IDENTITY = ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy")


def _report_violations(ctx: RuleContext, cfg: SecurityContextRule, refs: list[resources.ContainerRef]) -> None:
    pod_sc = _sc(ctx.spec)
    if pod_sc.get("runAsUser") == 0:
        ctx.report(f"{ctx.where()}: runs as root (spec.securityContext.runAsUser: 0); use a non-zero UID", "spec.securityContext.runAsUser")
    if pod_sc.get("runAsNonRoot") is False:
        ctx.report(f"{ctx.where()}: sets spec.securityContext.runAsNonRoot: false; remove it", "spec.securityContext.runAsNonRoot")
    for ref in refs:
        for field, problem in _container_problems(_sc(ref.container), cfg):
            ctx.report(f"{ctx.where(ref, 'securityContext.' + field)}: {problem}", f"{ref.list_name}[{ref.index}].securityContext.{field}")


def _container_problems(sc: Mapping[str, Any], cfg: SecurityContextRule) -> list[tuple[str, str]]:
    problems = []
    if sc.get("privileged") is True:
        problems.append(("privileged", "is privileged; GPU access needs only the GPU resource, not privileged: true"))
    if sc.get("runAsUser") == 0:
        problems.append(("runAsUser", "runs as root (runAsUser: 0); use a non-zero UID"))
    if sc.get("runAsNonRoot") is False:
        problems.append(("runAsNonRoot", "sets runAsNonRoot: false; remove it"))
    if sc.get("allowPrivilegeEscalation") is True:
        problems.append(("allowPrivilegeEscalation", "allows privilege escalation; set it to false"))
    caps = submap(sc, "capabilities")
    added = [c for c in sublist(caps, "add") if c not in cfg.allowedCapabilities]
    if added:
        allowed = ", ".join(cfg.allowedCapabilities) or "none"
        problems.append(("capabilities.add", f"adds capabilities {', '.join(map(text, added))}; allowed: {allowed}"))
    return problems
