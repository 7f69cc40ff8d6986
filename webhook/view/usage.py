"""GPUs held by the pods of a cluster, summed per namespace and per team, kept current pod by pod.

A quota cap asks "how many GPUs of this resource do the pods of this
namespace (or team) hold, at these priority classes, on this GPU model".
Each pod's share is worked out once, when it changes, and added to the sums
of its namespace and, for every team label a policy uses, of its team; a cap
then reads one small table (priority class × models × resource) instead of
every pod of the cluster.

What a pod holds follows the quota rule (``rules/quota.py``): Pending and
Running pods, those being deleted included until their grace period has
passed, as ResourceQuota counts them (``webhook.kube.termination``; past
it only where the owner of the sums has a clock: the live index); as many of each extended resource as the
scheduler counts (``resources.pod_gpus``); on the GPU model of the node it is
bound to, else the models its node selector and required affinity allow
(``None``: any). Which resources are GPUs and which caps count them is the
reader's business: the tables hold every extended resource.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhook.gpu import resources
from webhook.kube import termination
from webhook.view import scheduling
from webhook.view.nodegroups import is_extended

#: (priority class name, GPU models the pod can be on (None: any), resource name)
UsageKey = tuple[str, frozenset[str] | None, str]
Amounts = Mapping[UsageKey, Decimal]
PodKey = tuple[str, str]  # (namespace, name)
_NONE: Amounts = {}


class _Extended(resources.ResourceMatcher):
    """Every extended resource: the tables hold them all, readers pick theirs."""

    def __call__(self, name: str) -> bool:
        return is_extended(name)


EXTENDED = _Extended(frozenset(), ())


@dataclass(frozen=True, slots=True)
class Share:
    """What the pods of one (namespace, name) hold."""

    namespace: str
    amounts: tuple[tuple[UsageKey, Decimal], ...]


def share_of(pods: Iterable[Mapping[str, Any]], model_of: Callable[[str], str | None], model_label: str,
             now: float | None = None) -> Share | None:
    """The share of these pods (more than one only when a snapshot repeats a name) at ``now`` (unix seconds;
    None: a pod being deleted holds until it is gone); None: nothing held."""
    held: dict[UsageKey, Decimal] = {}
    namespace = ""
    for pod in pods:
        meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
        namespace = str(meta.get("namespace") or "")
        if not termination.holds(pod, now):
            continue
        model = model_of(str(spec.get("nodeName") or ""))
        models = frozenset({model}) if model else scheduling.label_values(spec, model_label)
        priority = str(spec.get("priorityClassName") or "")
        for resource, count in resources.pod_gpus(spec, EXTENDED).items():
            key = (priority, models, resource)
            held[key] = held.get(key, Decimal(0)) + count
    amounts = tuple((k, n) for k, n in held.items() if n)
    return Share(namespace, amounts) if amounts else None


@dataclass(frozen=True, slots=True)
class UsageView:
    """One consistent state of the sums, for readers; never changed once published."""

    namespaces: Mapping[str, Amounts]
    teams: Mapping[str, Mapping[str, Amounts]]  # team label → team → amounts
    #: the writer's live map, read only with ``.get`` (atomic in CPython)
    shares: Mapping[PodKey, Share]

    def in_namespace(self, namespace: str) -> Amounts:
        return self.namespaces.get(namespace, _NONE)

    def in_team(self, label: str, team: str) -> Amounts:
        return self.teams.get(label, {}).get(team, _NONE)

    def share(self, namespace: str, name: str) -> Share | None:
        return self.shares.get((namespace, name))


class GpuUsage:
    """The sums for one model label. One thread writes at a time (the caller serialises)."""

    def __init__(self, model_label: str, labels_of: Callable[[str], Mapping[str, str]]) -> None:
        self.model_label = model_label
        self._labels_of = labels_of  # namespace → its labels, as the caller knows them now
        self._shares: dict[PodKey, Share] = {}
        self.view = UsageView({}, {}, self._shares)

    def rebuild(self, shares: Iterable[tuple[PodKey, Share | None]]) -> None:
        """Start again from every pod's share (a relist, a new node set), published in one step."""
        fresh: dict[PodKey, Share] = {}
        namespaces: dict[str, dict[UsageKey, Decimal]] = {}
        for key, share in shares:
            if share is not None:
                fresh[key] = share
                _add_into(namespaces.setdefault(share.namespace, {}), share.amounts, 1)
        teams = {label: self._team_sums(namespaces, label) for label in self.view.teams}
        self._shares = fresh
        self.view = UsageView(namespaces, teams, fresh)

    def set(self, key: PodKey, share: Share | None) -> None:
        """The pods of ``key`` now hold ``share``: move the sums in one published step."""
        old = self._shares.pop(key, None) if share is None else self._shares.get(key)
        if share is not None:
            self._shares[key] = share
        if old == share:
            return
        changes = [(s, sign) for s, sign in ((old, -1), (share, 1)) if s is not None]
        namespaces, teams = dict(self.view.namespaces), dict(self.view.teams)
        for s, sign in changes:
            namespaces[s.namespace] = _added(namespaces.get(s.namespace, _NONE), s.amounts, sign)
            for label in teams:
                team = self._labels_of(s.namespace).get(label)
                if team:
                    by_team = teams[label] = dict(teams[label])
                    by_team[team] = _added(by_team.get(team, _NONE), s.amounts, sign)
        self.view = UsageView(namespaces, teams, self._shares)

    def add_team_label(self, label: str) -> None:
        """Sum per value of this namespace label from now on."""
        teams = {**self.view.teams, label: self._team_sums(self.view.namespaces, label)}
        self.view = UsageView(self.view.namespaces, teams, self._shares)

    def _team_sums(self, namespaces: Mapping[str, Amounts], label: str) -> dict[str, Amounts]:
        by_team: dict[str, dict[UsageKey, Decimal]] = {}
        for namespace, amounts in namespaces.items():
            team = self._labels_of(namespace).get(label)
            if team:
                _add_into(by_team.setdefault(team, {}), amounts.items(), 1)
        return dict(by_team)

    def relabel(self, namespace: str, old: Mapping[str, str], new: Mapping[str, str]) -> None:
        """A namespace's labels changed: move its sums to its new teams."""
        amounts = tuple(self.view.in_namespace(namespace).items())
        teams = dict(self.view.teams)
        for label in teams:
            before, after = old.get(label), new.get(label)
            if before == after or not amounts:
                continue
            by_team = teams[label] = dict(teams[label])
            for team, sign in ((before, -1), (after, 1)):
                if team:
                    by_team[team] = _added(by_team.get(team, _NONE), amounts, sign)
        self.view = UsageView(self.view.namespaces, teams, self._shares)


def _added(amounts: Amounts, items: Iterable[tuple[UsageKey, Decimal]], sign: int) -> dict[UsageKey, Decimal]:
    result = dict(amounts)
    _add_into(result, items, sign)
    return result


def _add_into(into: dict[UsageKey, Decimal], items: Iterable[tuple[UsageKey, Decimal]], sign: int) -> None:
    for key, count in items:
        total = into.get(key, Decimal(0)) + (count if sign > 0 else -count)
        if total:
            into[key] = total
        else:
            into.pop(key, None)  # nothing held: the table stays as small as what is in use


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
