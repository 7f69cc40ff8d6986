"""GPU access: a pod reaches a node's GPUs only by requesting them (issue #42).

A container sees GPUs when the NVIDIA container toolkit hands them over,
which it does for the runtime class that runs its hook when the container's
environment asks (NVIDIA_VISIBLE_DEVICES), and a container sees the device
nodes themselves when it is privileged or mounts /dev from the host. None
of these goes through the scheduler's GPU accounting or the GPU quotas: a
pod that requests no GPU and uses one steals it from the pod it was
allocated to. This rule refuses them in what it is sent; what no admission
can see (an image's own ``ENV``, keys of an unprefixed ``envFrom``) is the
node's to refuse (docs/validations.md, "GPU access").

It judges init, app and ephemeral containers: kube-apiserver sends a debug
container (``pods/ephemeralcontainers``) to the validating webhook, and the
engine runs only this rule on that subresource (``SUBRESOURCES``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from webhook.gpu import resources
from webhook.kube.value_text import shown
from webhook.policy.context import RuleContext
from webhook.policy.settings.validation import GpuAccessRule

PHASES = ("validate",)
#: the subresources this rule judges (the engine runs no other rule on them)
SUBRESOURCES = ("ephemeralcontainers",)
#: values that give a container no GPU (the toolkit's "void" and "none"; empty is none)
HIDDEN = ("void", "none", "")
_LISTS = ("initContainers", "containers", "ephemeralContainers")
_SLASHES = re.compile(r"/+")


def run(ctx: RuleContext, cfg: GpuAccessRule) -> None:
    spec = ctx.spec
    pod_has_gpu = bool(ctx.slots) or bool(ctx.pod_gpus())
    _judge_runtime_class(ctx, cfg, spec, pod_has_gpu)
    _judge_host_paths(ctx, cfg, spec)
    for ref in _containers(spec):
        has_gpu = bool(ctx.gpu_names(ref))
        _judge_env(ctx, cfg, ref, has_gpu)
        _judge_env_from(ctx, cfg, ref, has_gpu)
        if cfg.privileged and pod_has_gpu and _privileged(ref.container):
            ctx.report(
                f"{ctx.where(ref, 'securityContext.privileged')}: a privileged container sees every GPU of its node, "
                "not only the ones the pod requested; remove privileged: true (add only the capabilities it needs)",
                f"{ref.list_name}[{ref.index}].securityContext.privileged",
            )


def _containers(spec: Mapping[str, Any]) -> Iterator[resources.ContainerRef]:
    for list_name in _LISTS:
        items = spec.get(list_name)
        if type(items) is list:
            for index, container in enumerate(items):
                if type(container) is dict:
                    yield resources.ContainerRef(list_name, index, container)


def _judge_runtime_class(ctx: RuleContext, cfg: GpuAccessRule, spec: Mapping[str, Any], pod_has_gpu: bool) -> None:
    name = spec.get("runtimeClassName")
    if not pod_has_gpu and isinstance(name, str) and name in cfg.runtimeClasses:
        ctx.report(
            f"{ctx.where(field_path='runtimeClassName')}: runtime class {name!r} hands GPUs to a pod that requests "
            "none, outside GPU scheduling and quotas; request nvidia.com/gpu in resources.limits (the class is then "
            "set for you), or remove runtimeClassName",
            "runtimeClassName",
        )


def _judge_host_paths(ctx: RuleContext, cfg: GpuAccessRule, spec: Mapping[str, Any]) -> None:
    volumes = spec.get("volumes")
    if type(volumes) is not list:
        return
    for index, volume in enumerate(volumes):
        source = volume.get("hostPath") if type(volume) is dict else None
        path = source.get("path") if type(source) is dict else None
        if not isinstance(path, str):
            continue
        normal = host_path(path)
        if any(fnmatchcase(normal, pattern) for pattern in cfg.hostPaths):
            name = volume.get("name")
            ctx.report(
                f"{ctx.where(field_path=f'volumes[{index}].hostPath')}: volume {shown(name)} mounts {path!r} from the node, "
                "which reaches its GPU devices outside GPU scheduling and quotas; request nvidia.com/gpu in "
                "resources.limits instead of mounting device files",
                f"volumes[{index}].hostPath.path",
            )


def host_path(path: str) -> str:
    """A hostPath as the node resolves it, without symbolic links: ``//dev/./nvidia0/`` → ``/dev/nvidia0``."""
    normal = posixpath.normpath(_SLASHES.sub("/", path))
    return "/" if normal in ("/", "//", ".") else normal


def _judge_env(ctx: RuleContext, cfg: GpuAccessRule, ref: resources.ContainerRef, has_gpu: bool) -> None:
    env = ref.container.get("env")
    if type(env) is not list:
        return
    for index, entry in enumerate(env):
        if type(entry) is not dict:
            continue
        name = entry.get("name")
        if name not in cfg.variables or (has_gpu and name in cfg.allowedWithGpu):
            continue
        value = entry.get("value")
        if "valueFrom" not in entry and (value is None or value in HIDDEN):
            continue
        written = "a value from valueFrom" if "valueFrom" in entry else shown(value)
        field = f"env[{index}]"
        if has_gpu:
            why = ("overrides the GPUs the device plugin allocated to it (all: every GPU of the node); "
                   "remove it, the device plugin sets it")
        else:
            why = ("hands it the node's GPUs without requesting one, outside GPU scheduling and quotas; remove it, or "
                   "request nvidia.com/gpu in resources.limits (set it to void to hide GPUs an image exposes)")
        ctx.report(f"{ctx.where(ref, field)}: {name}={written} {why}", f"{ref.list_name}[{ref.index}].{field}")


def _judge_env_from(ctx: RuleContext, cfg: GpuAccessRule, ref: resources.ContainerRef, has_gpu: bool) -> None:
    if not cfg.envFromPrefixes:
        return
    sources = ref.container.get("envFrom")
    if type(sources) is not list:
        return
    for index, source in enumerate(sources):
        prefix = source.get("prefix") if type(source) is dict else None
        if not isinstance(prefix, str) or not prefix:
            continue
        reached = [name for name in cfg.variables
                   if name.startswith(prefix) and not (has_gpu and name in cfg.allowedWithGpu)]
        if reached:
            field = f"envFrom[{index}].prefix"
            why = ("override the GPUs the device plugin allocated to it; use another prefix" if has_gpu else
                   "hand a container without a GPU the node's GPUs; use another prefix, or request nvidia.com/gpu "
                   "in resources.limits")
            ctx.report(
                f"{ctx.where(ref, field)}: prefix {prefix!r} makes variables such as {reached[0]} from a ConfigMap or "
                f"Secret, which {why}",
                f"{ref.list_name}[{ref.index}].{field}",
            )


def _privileged(container: Mapping[str, Any]) -> bool:
    context = container.get("securityContext")
    return type(context) is dict and context.get("privileged") is True
