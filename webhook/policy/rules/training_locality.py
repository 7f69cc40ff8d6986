"""Distributed training on one fabric: affinity between the pods of one job.

The pods of a job are selected by the job-identity label its operator sets
(Kubeflow's training.kubeflow.org/job-name, JobSet's jobset-name, a Job's
batch.kubernetes.io/job-name). A pod carries the label already; a template
in the job object does not yet, so its value is the object's name, which is
what the operator will set. A pod matches its own term, so the first pod of
a job can schedule even when the term is required.
"""

from __future__ import annotations

from webhook.kube import affinity
from webhook.kube.patch import submap
from webhook.kube.value_text import text
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import TrainingLocalityRule

PHASES = ("mutate",)


def run(ctx: RuleContext, cfg: TrainingLocalityRule) -> None:
    selector = job_selector(ctx, cfg)
    if selector is None:
        return
    if affinity.add_pod_term(
        ctx.builder, ctx.spec, ctx.spec_at, affinity.POD_AFFINITY,
        required=cfg.type == "required", weight=cfg.weight, selector=selector, topology_key=cfg.topologyKey,
    ):
        ctx.changed("trainingLocality")


def job_selector(ctx: RuleContext, cfg: TrainingLocalityRule) -> dict[str, str] | None:
    labels = submap(ctx.meta, "labels")
    for identity in cfg.jobIdentities:
        if identity.label in labels:
            return {identity.label: text(labels[identity.label])}
    if ctx.target.is_pod or not ctx.request.name:
        return None
    for identity in cfg.jobIdentities:
        if ctx.request.kind in identity.kinds:
            return {identity.label: ctx.request.name}
    return None
