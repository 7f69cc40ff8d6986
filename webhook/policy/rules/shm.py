"""/dev/shm: a memory-backed emptyDir for GPU containers (NCCL and data loaders need
far more than the runtime's 64 MiB default).

tmpfs counts against the container's memory limit, so the size comes from
that limit (a fraction, clamped) and never exceeds it. A pod can set a limit
of its own (pod-level resources, ``spec.resources.limits.memory``): it binds
every container too, so the smaller of the two sizes a container, and it
alone sizes a container without a limit. One volume serves every container
that needs it, sized for the smallest of their limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from webhook.gpu import resources
from webhook.kube import quantity
from webhook.kube.patch import as_dict
from webhook.kube.value_text import text
from webhook.kube.workload import is_windows
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import ShmRule

PHASES = ("mutate",)
MOUNT_PATH: Final = "/dev/shm"
MIB: Final = Decimal(2**20)
MIB_BYTES: Final = 2**20


class Settings:
    """What ``run`` reads of the rule's settings, made with the plans of a policy set."""

    def __init__(self, cfg: ShmRule) -> None:
        self.cfg = cfg
        self.init_containers = cfg.initContainers
        self.volume_name = cfg.volumeName
        self.size_memo: dict[str, tuple[int, str]] = cfg.size_memo


def run(ctx: RuleContext, settings: Settings) -> None:
    spec = ctx.spec
    if spec.get("hostIPC") is True or is_windows(spec):
        # with hostIPC the runtime mounts the host's /dev/shm, which the pod shares on purpose;
        # Windows has no /dev/shm
        return
    # GPU containers (init ones only if asked) with nothing at /dev/shm yet
    with_init = settings.init_containers
    targets = []  # their slots' keys: (container list, index)
    for slot in ctx.slots:
        list_name, index = slot
        container: dict[str, Any] = spec[list_name][index]  # (slots name maps: read as a dict, no method lookup)
        mounts = container.get("volumeMounts")
        # a native sidecar (restartPolicy: Always) runs beside the app containers: one of them here
        if ((with_init or list_name != "initContainers" or resources.is_sidecar(container))
                and not (type(mounts) is list and _mounts_shm(mounts))):
            targets.append(slot)
    if not targets:
        return
    volumes = spec.get("volumes")
    name, exists = _volume_name(volumes if type(volumes) is list else [], settings.volume_name)
    builder = ctx.builder
    if not exists:
        pod_limit = _memory_limit(spec)  # (pod-level resources: for containers without their own)
        cfg, memo = settings.cfg, settings.size_memo
        smallest = _size_for(spec[targets[0][0]][targets[0][1]], cfg, pod_limit, memo)
        for list_name, index in targets[1:]:  # (a loop: most pods have one target)
            size_for = _size_for(spec[list_name][index], cfg, pod_limit, memo)
            if size_for[0] < smallest[0]:  # (the bytes: compiled, no tuple comparison)
                smallest = size_for
        size = smallest[1]
        builder.append_to(spec, ctx.spec_at, "volumes", {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": size}})
    mount = {"name": name, "mountPath": MOUNT_PATH}  # one for every container (as securityContext's value)
    for list_name, index in targets:
        container, at = ctx.container_at(list_name, index)
        builder.append_to(container, at, "volumeMounts", mount)
    ctx.changed("shm")


def _mounts_shm(mounts: list[Any]) -> bool:
    """Does one of a container's volumeMounts mount at /dev/shm?"""
    for mount in mounts:
        if type(mount) is dict:
            path = mount.get("mountPath", "")
            if type(path) is str:  # (compiled: a str comparison, not a generic one)
                if path == MOUNT_PATH or path.rstrip("/") == MOUNT_PATH:
                    return True
            elif text(path).rstrip("/") == MOUNT_PATH:
                return True
    return False


def _is_ours(volume: Mapping[str, Any]) -> bool:
    empty_dir = volume.get("emptyDir")
    return isinstance(empty_dir, dict) and empty_dir.get("medium") == "Memory"


def _volume_name(volumes: list[Any], base: str) -> tuple[str, bool]:
    """Our volume's name, and whether the pod has it: a memory emptyDir of that name, else the first free variant."""
    for volume in volumes:
        if type(volume) is dict and text(volume.get("name")) == base:
            break
    else:
        return base, False
    taken = {text(v.get("name")): v for v in volumes if type(v) is dict}
    candidate, n = base, 1
    while candidate in taken and not _is_ours(taken[candidate]):
        n += 1
        candidate = f"{base}-{n}"
    return candidate, candidate in taken


def _memory_limit(obj: Mapping[str, Any]) -> Any:
    """``resources.limits.memory`` of a container or a pod spec (pod-level resources), or None."""
    resources = as_dict(obj).get("resources")
    limits = resources.get("limits") if type(resources) is dict else None
    return limits.get("memory") if type(limits) is dict else None


def _size_for(container: Mapping[str, Any], cfg: ShmRule, pod_limit: Any, memo: dict[str, tuple[int, str]]) -> tuple[int, str]:
    """The volume size this container needs: bytes (whole MiB, rounded down, at least 1Mi) and as a
    quantity. ``pod_limit``: the pod's own memory limit (or None), which binds a container without one;
    ``memo``: ``cfg.size_memo``."""
    limit = _memory_limit(container)
    if pod_limit is not None:
        limit = pod_limit if limit is None else _smaller(limit, pod_limit)
    if limit is None:
        limit = ""  # no limit sizes as an empty (invalid) one does, and is as common as any
    elif type(limit) is not str:  # only strings are remembered: True and 1 are one key to a dict
        return _compute_size(limit, cfg)
    size = memo.get(limit)
    if size is None:
        if len(memo) >= 1024:  # limits are few; bound them anyway
            memo.clear()
        size = memo[limit] = _compute_size(limit, cfg)
    return size


def _smaller(limit: Any, pod_limit: Any) -> Any:
    """The smaller of a container's memory limit and its pod's (one that is no quantity: the other)."""
    mine, pods = quantity.parse_quantity(limit), quantity.parse_quantity(pod_limit)
    if mine is None:
        return pod_limit
    return limit if pods is None or mine <= pods else pod_limit


def _compute_size(raw_limit: Any, cfg: ShmRule) -> tuple[int, str]:
    sizes = cfg.bytes
    limit = quantity.parse_quantity(raw_limit)
    if sizes.fixed is not None:
        wanted = sizes.fixed
    elif limit is None:
        wanted = sizes.without_limit
    else:
        wanted = min(max(limit * sizes.fraction, sizes.minimum), sizes.maximum)
    if limit is not None and limit > 0:
        wanted = min(wanted, limit)
    # whole MiB rounded down, so never above the limit
    size = max(int(wanted / MIB), 1) * MIB_BYTES
    return size, quantity.format_bytes(size)
