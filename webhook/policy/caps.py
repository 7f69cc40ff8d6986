"""What a GPU cap counts, and how a message names it: shared by the quota rule's check against the
cluster view and by the charge ledger's check (``webhook.policy.charges``), so the two count alike.

A cap (``QuotaLimit``) counts, in its group (a namespace, or a team's
namespaces), the GPUs of the resources it names (a name or ``prefix*``) that
pods of its priority classes hold on its model: ``*`` every pod, ``any`` pods
that target no model, else a glob over the model label's values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from fnmatch import fnmatchcase

from webhook.gpu import resources
from webhook.policy import match
from webhook.policy.settings.validation import QuotaLimit
from webhook.view.usage import UsageKey

#: the models of a pod that names more of them than a charge keeps, or a value no node label can hold
#: (``webhook.policy.charge_bounds``): it may land on any model, so every cap counts it ("*" is no
#: label value, so no pod's real models are ever this)
MANY: frozenset[str] = frozenset({"*"})

#: every finding ends with what to do; a data scientist can do one of these two
WHAT_TO_DO = " (stop GPU pods you no longer need, or ask for a larger cap)"


def counted(cap: QuotaLimit) -> resources.ResourceMatcher:
    """The resources the cap counts."""
    return resources.ResourceMatcher.of([cap.resource])


def amount(matcher: resources.ResourceMatcher, gpus: Iterable[tuple[str, Decimal]]) -> Decimal:
    """GPUs of the resources ``matcher`` accepts in ``gpus`` (resource, count)."""
    return sum((n for name, n in gpus if matcher(name)), Decimal(0))


def counts(model: str, priority_classes: Iterable[str], priority: str, models: frozenset[str] | None) -> bool:
    """A cap on ``model`` and ``priority_classes`` counts pods of this priority class on these models
    (None: a pod that may land on any model; :data:`MANY`: on too many to name, counted by every cap)."""
    classes = tuple(priority_classes)
    if classes and priority not in classes:
        return False
    if models == MANY:
        return True
    if model == "any":
        return models is None
    return model == "*" or any(fnmatchcase(m, model) for m in models or ())


def covers(cap: QuotaLimit, priority: str, models: frozenset[str] | None, namespace: str,
           ns_labels: Mapping[str, str]) -> str | None:
    """The group (namespace or team) the cap counts such a pod in; None when it does not count it."""
    if not counts(cap.model, cap.priorityClasses, priority, models):
        return None
    if cap.scope == "namespace":
        return namespace if match.name_matches(cap.namespaces, namespace) else None
    team = ns_labels.get(cap.teamLabel)
    return team if team and (not cap.teams or team in cap.teams) else None


def held(cap: QuotaLimit, matcher: resources.ResourceMatcher, is_gpu: resources.ResourceMatcher,
         amounts: Iterable[tuple[UsageKey, Decimal]]) -> Decimal:
    """GPUs the cap counts in usage sums keyed (priority class, models, resource)."""
    total = Decimal(0)
    for (priority, models, resource), count in amounts:
        if matcher(resource) and is_gpu(resource) and counts(cap.model, cap.priorityClasses, priority, models):
            total += count
    return total


def subject(scope: str, group: str, team_label: str) -> str:
    """"namespace ml-a", or "team a (team=a)"."""
    return f"namespace {group}" if scope == "namespace" else f"team {group} ({team_label}={group})"


def qualifier(model: str, priority_classes: Iterable[str]) -> str:
    """What of the group the cap counts: " on NVIDIA-A100*", " at priority high"..."""
    classes = tuple(priority_classes)
    text = "" if model == "*" else " with no GPU model selected" if model == "any" else f" on {model}"
    return text + (f" at priority {', '.join(classes)}" if classes else "")


def number(value: Decimal) -> str:
    """A count as people write it: 4, not 4.000 nor 4E+0."""
    return f"{value.normalize():f}"


#: how many of a team's namespaces a denial names
HOLDERS_NAMED = 5


def held_in(by_namespace: Mapping[str, Decimal]) -> str:
    """"; held in ml-a 6, ml-b 1": where a team's GPUs are, most first, five at most."""
    held_list = sorted(((n, ns) for ns, n in by_namespace.items() if n > 0), key=lambda item: (-item[0], item[1]))
    if not held_list:
        return ""
    named = ", ".join(f"{namespace} {number(count)}" for count, namespace in held_list[:HOLDERS_NAMED])
    more = len(held_list) - HOLDERS_NAMED
    return f"; held in {named}" + (f" and {more} more namespace{'s' if more > 1 else ''}" if more > 0 else "")


def over(where: str, scope: str, group: str, team_label: str, model: str, priority_classes: Iterable[str],
         resource: str, used: Decimal, maximum: int, ask: Decimal, holders: str) -> str:
    """The denial: "<pod>: team a (team=a) uses 7 of 10 nvidia.com/gpu; this pod asks for 4; held in …"."""
    return (f"{where}: {subject(scope, group, team_label)} uses {number(used)} of {maximum} {resource}"
            f"{qualifier(model, priority_classes)}; this pod asks for {number(ask)}{holders}{WHAT_TO_DO}")
