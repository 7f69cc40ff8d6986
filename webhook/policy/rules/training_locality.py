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


class Settings:
    """What ``run`` reads of the rule's settings on every pod, made with the plans of a policy set
    (compiled, a native object's attribute is a load, a pydantic model's a generic lookup)."""

    def __init__(self, cfg: TrainingLocalityRule) -> None:
        self.required = cfg.type == "required"
        self.weight, self.topology_key = cfg.weight, cfg.topologyKey
        #: the job-identity labels, in the policy's order, each with the kinds whose templates get it
        self.identities: tuple[tuple[str, frozenset[str]], ...] = tuple(
            (identity.label, frozenset(identity.kinds)) for identity in cfg.jobIdentities)


def run(ctx: RuleContext, settings: Settings) -> None:
    selector = job_selector(ctx, settings)
    if selector is None:
        return
    if affinity.add_pod_term(
        ctx.builder, ctx.spec, ctx.spec_at, affinity.POD_AFFINITY,
        required=settings.required, weight=settings.weight, selector=selector, topology_key=settings.topology_key,
    ):
        ctx.changed("trainingLocality")


def job_selector(ctx: RuleContext, settings: Settings) -> dict[str, str] | None:
    labels = submap(ctx.meta, "labels")
    identities = settings.identities
    for label, _ in identities:
        if label in labels:
            return {label: text(labels[label])}
    if ctx.target.is_pod or not ctx.request.name:
        return None
    kind = ctx.request.kind
    for label, kinds in identities:
        if kind in kinds:
            return {label: ctx.request.name}
    return None
