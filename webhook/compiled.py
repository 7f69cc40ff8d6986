"""Which modules of the policy core the image compiles (mypyc), and whether this process runs them compiled.

Every admission runs through these modules: compiled, an evaluation costs
about half of its interpreted time (docs/performance.md). The rest (the
pydantic settings, the cluster index, the server and CLI shells) stays
interpreted, but for what every admission runs past the engine:
``webhook/review.py`` (the review read and answered), ``webhook/log_line.py``
(the line per admission), ``webhook/server/metrics.py`` (the requests
counted), and the server's path of an admission from its body to its
answer: ``server/handlers.py``, ``server/evaluation.py`` (the turns),
``server/body.py`` and ``server/limits.py``: interpreted, their ~15 Python
frames per admission cost ~20,000 instructions more (docs/performance.md).
setup.py reads ``MODULES`` without importing the package, so this file
imports nothing of it.

A module joins the list with every module holding a class that inherits
from one of its classes (mypyc refuses an interpreted subclass of a
compiled class: ``view/usage.py`` subclasses ``gpu/resources.py``'s
matcher). Out of it: the modules that build pydantic models (the settings,
the loader), and those whose classes the cluster index and the tests build
on or look into: ``view/protocol.py``, ``view/snapshot.py`` and
``view/aggregates.py`` (``ClusterIndex`` is an ``AggregateAnswers``; tests
subclass ``SnapshotView``) and ``policy/request.py``.
"""

from __future__ import annotations

import importlib
import importlib.util

MODULES = (
    "webhook.policy.engine",
    "webhook.policy.context",
    "webhook.kube.patch",
    "webhook.policy.match",
    "webhook.kube.workload",
    "webhook.kube.affinity",
    "webhook.gpu.resources",
    "webhook.view.usage",
    "webhook.gpu.cuda",
    "webhook.view.nodegroups",
    "webhook.view.scheduling",
    "webhook.kube.quantity",
    "webhook.kube.value_text",
    "webhook.gpu.images",
    "webhook.gpu.image_table",
    "webhook.gpu.forward_compat",
    "webhook.kube.resourcequota",
    "webhook.gpu.mig",
    "webhook.gpu.products",
    "webhook.policy.severity",
    "webhook.policy.decision",
    "webhook.policy.finding",
    "webhook.policy.caps",
    "webhook.policy.charges",
    "webhook.kube.dra",
    "webhook.view.claim_gpus",
    "webhook.view.device_classes",
    "webhook.view.devices",
    "webhook.gpu.device_classes",
    "webhook.view.node_devices",
    "webhook.kube.resource_slices",
    "webhook.policy.rules.cuda_driver",
    "webhook.policy.rules.dra_claims",
    "webhook.policy.rules.gpu_access",
    "webhook.policy.rules.gpu_visibility",
    "webhook.policy.rules.node_affinity",
    "webhook.policy.rules.notebook_lifetime",
    "webhook.policy.rules.priority_class",
    "webhook.policy.rules.quota",
    "webhook.policy.rules.resource_shape",
    "webhook.policy.rules.runtime_class",
    "webhook.policy.rules.security_context",
    "webhook.policy.rules.shm",
    "webhook.policy.rules.spread_replicas",
    "webhook.policy.rules.tolerations",
    "webhook.policy.rules.training_locality",
    "webhook.review",
    "webhook.log_line",
    "webhook.server.metrics",
    "webhook.server.handlers",
    "webhook.server.evaluation",
    "webhook.server.body",
    "webhook.server.limits",
)

#: modules written in C, built with the compiled core (setup.py) and absent from the interpreted one, whose
#: callers then do without them: webhook/_envelope.c (the review's body read once before its parse)
NATIVE = ("webhook._envelope",)


def compiled_modules() -> list[str]:
    """The modules of ``MODULES`` this process loaded from compiled extensions, and those of ``NATIVE`` it can load."""
    found = [name for name in MODULES if not str(getattr(importlib.import_module(name), "__file__", "")).endswith(".py")]
    return found + [name for name in NATIVE if importlib.util.find_spec(name) is not None]


def policy_core() -> str:
    """How this process runs the policy core: "compiled", "interpreted", or "partly compiled" (a broken build)."""
    done = len(compiled_modules())
    return "compiled" if done == len(MODULES) + len(NATIVE) else "interpreted" if done == 0 else "partly compiled"
