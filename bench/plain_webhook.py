"""A plain-Python GPU webhook: the core mutations and shape checks hand-written, standard json.

What a team would write in an afternoon instead of running gpu-admission:
for a pod that asks for ``nvidia.com/gpu``, the GPU toleration,
``runtimeClassName: nvidia``, a non-root pod security context and a
memory-backed ``/dev/shm`` (half the first GPU container's memory limit, at
most 32Gi), as one JSON Patch; a fractional, requests-only or request ≠
limit GPU refused, in pods and in the pod templates of Deployments, Jobs
and the like. No policies, no workload classes, no exceptions, no cluster
view, no logs, no metrics. `make bench-server` measures gpu-admission
against it in the same rounds (bench/server.py): gpu-admission must stay
ahead of it on every payload.

    python bench/plain_webhook.py PORT CERT KEY EVENT_LOOP
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GPU = "nvidia.com/gpu"
TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"}}
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SHM_CAP = 32 * 2**30


def admit(body: bytes) -> dict[str, Any]:
    """The AdmissionReview answer to ``body``."""
    request = json.loads(body)["request"]
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    obj = request.get("object") or {}
    spec = _pod_spec(obj)
    if spec is not None:
        problem = _shape(spec)
        if problem:
            response.update(allowed=False, status={"code": 403, "message": problem})
        elif obj.get("kind") == "Pod" and _gpus(spec):
            patch = _mutations(spec)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")
    return (template or {}).get("spec")


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("containers") or []) + list(spec.get("initContainers") or [])


def _gpus(spec: dict[str, Any]) -> bool:
    return any(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in _containers(spec))


def _shape(spec: dict[str, Any]) -> str:
    for container in _containers(spec):
        resources = container.get("resources") or {}
        limit, request = (resources.get("limits") or {}).get(GPU), (resources.get("requests") or {}).get(GPU)
        if limit is None and request is None:
            continue
        if limit is None:
            return f"container {container.get('name')}: {GPU} requested without a limit"
        if not str(limit).isdigit():
            return f"container {container.get('name')}: {GPU} must be a whole number, not {limit}"
        if request is not None and str(request) != str(limit):
            return f"container {container.get('name')}: {GPU} request {request} differs from its limit {limit}"
    return ""


def _mutations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    tolerations = spec.get("tolerations")
    if not tolerations:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [TOLERATION]})
    elif not any(t.get("key") == GPU for t in tolerations):
        ops.append({"op": "add", "path": "/spec/tolerations/-", "value": TOLERATION})
    if not spec.get("runtimeClassName"):
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"})
    if not spec.get("securityContext"):
        ops.append({"op": "add", "path": "/spec/securityContext", "value": SECURITY})
    volumes = spec.get("volumes")
    if not any(v.get("name") == "dshm" for v in volumes or []):
        shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _shm_size(spec)}}
        ops.append({"op": "add", "path": "/spec/volumes", "value": [shm]} if not volumes else
                   {"op": "add", "path": "/spec/volumes/-", "value": shm})
        for index, container in enumerate(spec.get("containers") or []):
            mount = {"name": "dshm", "mountPath": "/dev/shm"}
            if container.get("volumeMounts"):
                ops.append({"op": "add", "path": f"/spec/containers/{index}/volumeMounts/-", "value": mount})
            else:
                ops.append({"op": "add", "path": f"/spec/containers/{index}/volumeMounts", "value": [mount]})
    return ops


def _shm_size(spec: dict[str, Any]) -> str:
    for container in spec.get("containers") or []:
        memory = str(((container.get("resources") or {}).get("limits") or {}).get("memory") or "")
        unit = next((u for u in _UNITS if memory.endswith(u)), "")
        number = memory[: len(memory) - len(unit)] if unit else memory
        if number.isdigit():
            return f"{min(int(number) * _UNITS.get(unit, 1) // 2, _SHM_CAP) // 2**20}Mi"
    return "8Gi"


def serve(port: int, cert: str, key: str, event_loop: str) -> None:
    """POST /mutate answered by :func:`admit`, over TLS (a child process of the benchmark)."""
    from aiohttp import web

    from bench.floor_app import serve as serve_app

    async def review(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(admit(await request.read())).encode(), content_type="application/json")

    serve_app(port, cert, key, event_loop, review)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
