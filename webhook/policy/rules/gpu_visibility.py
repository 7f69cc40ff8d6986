"""GPU-access hygiene: containers that requested no GPU must not see the node's GPUs.

CUDA base images set NVIDIA_VISIBLE_DEVICES=all, so a sidecar built on one
sees every GPU of the node unless the variable is overridden.
"""

from __future__ import annotations

from webhook.gpu import resources
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import GpuVisibilityRule

PHASES = ("mutate",)
VARIABLE = "NVIDIA_VISIBLE_DEVICES"
HIDDEN = ("void", "none", "")


def run(ctx: RuleContext, cfg: GpuVisibilityRule) -> None:
    slots, spec = ctx.slots, ctx.spec
    pod_has_gpu = bool(slots)
    if pod_has_gpu:
        init, main = spec.get("initContainers"), spec.get("containers")
        if len(slots) == (len(init) if type(init) is list else 0) + (len(main) if type(main) is list else 0):
            return  # every container requested a GPU
    for ref in resources.containers(spec):
        if ctx.gpu_names(ref):
            continue
        env = ref.container.get("env")
        entries = [e for e in env if isinstance(e, dict)] if isinstance(env, list) else []
        entry = next((e for e in entries if e.get("name") == VARIABLE), None)
        if entry is None:
            if cfg.setVoid and pod_has_gpu:
                container, at = ctx.container_at(ref.list_name, ref.index)
                void = {"name": VARIABLE, "value": "void"}
                ctx.builder.append_to(container, at, "env", void)
                ctx.changed("gpuVisibility")
        elif cfg.denyUnrequestedVisibleDevices and (entry.get("valueFrom") or entry.get("value") not in HIDDEN):
            ctx.report(
                f"{ctx.where(ref, 'env')}: sets {VARIABLE} without requesting a GPU, which bypasses GPU "
                "scheduling; request nvidia.com/gpu in resources.limits instead",
                f"{ref.list_name}[{ref.index}].env",
            )
