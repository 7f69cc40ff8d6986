"""The checks of compiled rule parts, in CEL: each finds, for one pod spec, the engine's findings
word for word.

A finding is a string ``<phase><mode>[policy/rule] message``: the phase (``M``
for the checks the mutating webhook makes, ``V`` for the validating one's)
and mode (``E`` enforce, ``W`` warn, ``A`` audit) the engine would record it
with, then ``Finding.text()``. Each function here returns a CEL list of such
strings (several joined by ``SEP`` in one item where nested lists would need
flattening). The rule modules of webhook/policy/rules are the reference: every
message below is theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.cel import podspecs
from webhook.cel import syntax as cel
from webhook.gpu import mig
from webhook.gpu.resources import CONTAINER_LISTS, ResourceMatcher
from webhook.policy import severity
from webhook.policy.settings.base import Mode
from webhook.policy.settings.mutation import (
    GpuVisibilityRule, NodeAffinityRule, NotebookLifetimeRule, PriorityClassRule, SecurityContextRule,
)
from webhook.policy.settings.validation import ResourceShapeRule, Severity

_MODE_LETTER = {"enforce": "E", "warn": "W", "audit": "A"}


class Checks:
    """The CEL of one policy's rule on the pod spec ``t`` (a target record of webhook.cel.podspecs)."""

    def __init__(self, policy: str, rule: str, mode: Mode, phase: str, gpu: list[str]) -> None:
        self.policy, self.rule, self.mode, self.phase = policy, rule, mode, phase
        #: what this policy counts as a GPU
        self.gpu = gpu
        #: the tags of the findings built so far ("ME", "VW", ...): which validation actions they can reach
        self.tags: set[str] = set()

    def finding(self, message: str, mode: Mode | None = None) -> str:
        """A CEL string: the tagged finding of ``message`` (a CEL string expression)."""
        tag = self.phase + _MODE_LETTER[mode or self.mode]
        self.tags.add(tag)
        if self.phase == "M":  # the object as the mutating webhook saw it: before kube-apiserver generated its name
            message = (f"[{message}].map(m, m.startsWith(variables.subject) ? "
                       "variables.subjectBefore + m.substring(variables.subject.size()) : m)[0]")
        return f"{cel.quote(f'{tag}[{self.policy}/{self.rule}] ')} + {message}"

    def by_severity(self, level: Severity, message: str) -> str:
        """``severity.report``: a list of the finding at the mode the severity leaves, or []."""
        mode = severity.mode_of(self.mode, level)
        return "[]" if mode is None else f"[{self.finding(message, mode)}]"

    def is_gpu(self, name: str) -> str:
        return cel.matcher(name, self.gpu)


def where(container: str | None = None, field: str = "") -> str:
    """``RuleContext.where``: ``Pod ml/x spec.template container "c" (resources.limits)``."""
    text = "variables.subject + t.where"
    if container is not None:
        text += f" + ' ' + {podspecs.container_label(container)}"
    if field:
        text += f" + {cel.quote(f' ({field})')}"
    return text


def sorted_strings(items: str, var: str = "s") -> str:
    """A list of distinct strings in order (no ``sort()`` in Kubernetes 1.33: each takes the place
    its rank gives it)."""
    a, b, i = f"{var}1", f"{var}2", f"{var}i"
    return f"{items}.transformList({i}, {a}, {items}.filter({a}, {items}.filter({b}, {b} < {a}).size() == {i})[0])"


def distinct(items: str, var: str = "d") -> str:
    return f"{items}.transformList({var}i, {var}, {items}.indexOf({var}) == {var}i ? {var} : '').filter({var}, {var} != '')"


# -- quantities as resourceShape reads them (webhook.kube.quantity)

def _valid(value: str) -> str:
    return cel.some(f"type({value}) == string && isQuantity({value})", f"type({value}) == int",
                    f"type({value}) == uint", f"type({value}) == double")


def _text(value: str) -> str:
    """``f"{value}"`` of a valid quantity."""
    return f"(type({value}) == string ? {value} : string({value}))"


def _negative(value: str) -> str:
    return (f"(type({value}) == string ? quantity({value}).compareTo(quantity('0')) < 0 : "
            f"(type({value}) == double ? {value} < 0.0 : (type({value}) == int ? {value} < 0 : false)))")


def _whole(value: str) -> str:
    """Whole: ``isInteger`` (it fits int64 with a scale from 0 up), beyond int64 (a ``quantity.PLAIN``
    string there has a positive scale), or equal to an integer (the pod specs with other strings
    are left to the webhook)."""
    beyond = "q.compareTo(quantity('9223372036854775807')) > 0 || q.compareTo(quantity('-9223372036854775807')) < 0"
    # isInteger() is false for a negative scale ("2000m"); such a PLAIN value is below 10^9, where a
    # double holds every integer: whole when it equals the integer its double truncates to
    small = "q.compareTo(quantity(string(int(q.asApproximateFloat())))) == 0"
    # a double: whole when it is beyond int64 (every double from 2^53 up is) or equals its int (told by its
    # value: its text can be "1.5e+06")
    double = (f"{value} <= -9223372036854775808.0 || {value} >= 9223372036854775808.0 || "
              f"double(int({value})) == {value}")
    return (f"(type({value}) == string ? [quantity({value})].map(q, q.isInteger() || {beyond} || {small})[0] : "
            f"(type({value}) == double ? ({double}) : true))")


def _shown(value: str) -> str:
    """How an invalid quantity is shown: ``str(v).lower()`` for a boolean, else ``repr(v)``."""
    return (f"(type({value}) == bool ? ({value} ? 'true' : 'false') : "
            f"(type({value}) == string ? \"'\" + {value} + \"'\" : string({value})))")


def _quantity(value: str) -> str:
    return f"quantity(type({value}) == string ? {value} : string({value}))"


def _given(c: str, m: str, n: str) -> str:
    return f"({n} in {c}.{m} && type({c}.{m}[{n}]) != null_type)"


# -- resourceShape

def resource_shape(checks: Checks, cfg: ResourceShapeRule) -> str:
    """``rules.resource_shape.run`` but for the node-capacity check: a CEL list of findings."""
    schemes = cfg.sharingSchemes
    sharing = cel.matcher("n", schemes.resources)
    names = f"c.names.filter(n, ({checks.is_gpu('n')} || {sharing}) && {_held()})"
    per_name = f"{sorted_strings(names)}.map(n, ({_name_checks(checks, cfg)}).join({cel.SEP_LITERAL}))"
    per_container = f"t.cs.map(c, {per_name}.filter(s, s != '').join({cel.SEP_LITERAL}))"
    found = [per_container]
    annotations = cel.sub_map("t.meta", "annotations")
    for key in schemes.annotations:
        found.append(cel.when(f"{cel.quote(key)} in {annotations}",
                              _scheme(checks, cfg, cel.quote(key), where(field="metadata.annotations")), "[]"))
    found.append(_init_only(checks, cfg))
    if cfg.maxPerPod is not None:
        found.append(_max_per_pod(checks, cfg))
    return " + ".join(found)


def resource_shape_warns(mode: Mode, cfg: ResourceShapeRule, spec: str, meta: str) -> str:
    """A condition that holds wherever ``resource_shape`` finds a warning on the pod spec ``spec``
    (metadata ``meta``), and more often: its warnings come from a few of its checks only (a sharing
    scheme not allowed, a MIG profile of unknown form, GPUs in init containers only, as the settings
    make them warn), which need a resource name, an annotation or an init container that few pods
    have. Read from the raw pod spec, it costs a fraction of the findings: the Warn policy looks at it
    before computing them (docs/compiled-policies.md, "Cost")."""
    if severity.mode_of(mode, "deny") == "warn":  # a rule in warn mode: every finding warns
        return "true"
    schemes = cfg.sharingSchemes
    scheme_warns = severity.mode_of(mode, schemes.otherwise) == "warn"
    names = [cel.matcher("n", schemes.resources)] if scheme_warns else []
    if severity.mode_of(mode, "warn") == "warn":  # (_mig: a profile of unknown form)
        names.append(f"n.startsWith({cel.quote(mig.MIG_PREFIX)})")
    named = " || ".join(n for n in names if n != "false")
    found = []
    if named:
        held = " || ".join(f"{podspecs.resource_map('c', field)}.exists(n, type(n) == string && ({named}))"
                           for field in ("limits", "requests"))
        found += [f"{cel.sub_list(spec, name)}.exists(c, type(c) == map && ({held}))" for name in CONTAINER_LISTS]
    if scheme_warns and schemes.annotations:
        annotations = cel.sub_map(meta, "annotations")
        found.append(cel.some(*(f"{cel.quote(key)} in {annotations}" for key in schemes.annotations)))
    if severity.mode_of(mode, cfg.initOnly) == "warn":
        found.append(f"{cel.sub_list(spec, 'initContainers')}.size() > 0")
    return cel.some(*found) if found else "false"


def _held() -> str:
    from webhook.cel.podspecs import held

    return held("n", "c.lim", "c.req")


def _name_checks(checks: Checks, cfg: ResourceShapeRule) -> str:
    """What ``_check_container`` finds for the resource ``n`` of container ``c``."""
    found = [_quantity_checks(checks, "lim", "limits"), _quantity_checks(checks, "req", "requests"), _request_checks(checks)]
    sharing = cel.matcher("n", cfg.sharingSchemes.resources)
    container_where = where("c", "resources")
    found.append(cel.when(sharing, _scheme(checks, cfg, "n", container_where),
                          cel.when(f"n.startsWith({cel.quote(mig.MIG_PREFIX)})", _mig(checks, cfg), "[]")))
    return " + ".join(found)


def _quantity_checks(checks: Checks, m: str, field: str) -> str:
    value = f"c.{m}[n]"
    at = where("c", f"resources.{field}")
    negative = checks.finding(f"{at} + ': ' + n + ' is ' + {_text(value)} + ', below zero; ask for a whole number of devices'")
    invalid = checks.finding(f"{at} + ': ' + n + ': ' + {_shown(value)} + ' is not a valid quantity; ask for a whole number of devices'")
    fraction = checks.finding(
        f"{at} + ': ' + n + ' is ' + {_text(value)} + ', a fraction; GPUs are whole devices: ask for an integer "
        "(share GPUs through MIG or time-slicing)'"
    )
    judged = cel.when(_valid(value), cel.when(_negative(value), f"[{negative}]", cel.when(_whole(value), "[]", f"[{fraction}]")),
                      f"[{invalid}]")
    return cel.when(_given("c", m, "n"), judged, "[]")


def _request_checks(checks: Checks) -> str:
    request, limit = "c.req[n]", "c.lim[n]"
    only = checks.finding(
        f"{where('c', 'resources.requests')} + ': ' + n + ' is requested (' + {_text(request)} + ') without a limit; "
        f"set limits.' + n + ': ' + {_text(request)} + ' (GPUs are allocated by limit)'"
    )
    differs = checks.finding(
        f"{where('c', 'resources')} + ': ' + n + ' request ' + {_text(request)} + ' differs from limit ' + {_text(limit)}"
        " + '; GPUs cannot be overcommitted: make them equal'"
    )
    unequal = cel.some(f"{_valid(request)} != {_valid(limit)}",
                       cel.every(_valid(request), _valid(limit), f"{_quantity(request)}.compareTo({_quantity(limit)}) != 0"))
    given_request, given_limit = _given("c", "req", "n"), _given("c", "lim", "n")
    return cel.when(given_request, cel.when(f"!{given_limit}", f"[{only}]", cel.when(unequal, f"[{differs}]", "[]")), "[]")


def _scheme(checks: Checks, cfg: ResourceShapeRule, name: str, at: str) -> str:
    schemes = cfg.sharingSchemes
    allowed = ", ".join(schemes.allowed) or "none"
    message = (f"{at} + ': ' + {name} + {cel.quote(f' asks for a GPU share through a scheme this cluster does not run (allowed: {allowed}), so the pod would stay Pending: ask for whole GPUs or a MIG device')}")
    return cel.when(cel.matcher(name, schemes.allowed) if schemes.allowed else "false", "[]", checks.by_severity(schemes.otherwise, message))


def _mig(checks: Checks, cfg: ResourceShapeRule) -> str:
    """``_check_mig``; no node's advertised resources are known here (a profile outside the table is judged on its form)."""
    profile = f"n.substring({len(mig.MIG_PREFIX)})"
    allowed = [mig.resource_profile(p) for p in cfg.migProfiles]
    known = cel.strings(sorted(mig.valid_profiles()))
    at = where("c", "resources")
    unknown_form = checks.by_severity("warn", f"{at} + ': ' + n + ' is not a MIG profile of the GPUs gpu-admission knows, and no node advertises it; check the profile name'")
    malformed_text = at + " + ': ' + n + ' is not a MIG profile (e.g. nvidia.com/mig-1g.10gb; +me is spelt .me)'"
    malformed = f"[{checks.finding(malformed_text)}]"
    outside = cel.every(f"!({profile} in {known})", f"!({profile} in {cel.strings(allowed)})" if allowed else "true")
    well_formed = cel.quote(r"^[1-8]g\.[0-9]+gb(\.me)?$")
    judged = cel.when(f"{profile}.matches({well_formed})", unknown_form, malformed)
    if not allowed:
        return cel.when(outside, judged, "[]")
    listed = ", ".join(allowed)
    refused = checks.finding(f"{at} + ': ' + n + " + cel.quote(f" is not an allowed MIG profile; the policy allows {listed}"))
    return cel.when(outside, judged, cel.when(f"!({profile} in {cel.strings(allowed)})", f"[{refused}]", "[]"))


def _init_only(checks: Checks, cfg: ResourceShapeRule) -> str:
    holders = f"t.cs.filter(c, c.gpus.exists(n, {checks.is_gpu('n')}))"
    message = (f"{where()} + ': only init containers request GPUs (' + {holders}.map(c, {podspecs.container_label('c')}).join(', ') + "
               "'); the pod holds them while its app containers run without any: request GPUs in the app containers that use them'")
    found = checks.by_severity(cfg.initOnly, message)
    # (a native sidecar, restartPolicy: Always, runs beside the app containers: its GPUs are in use)
    plain = f"c.list == 'initContainers' && !{podspecs.is_sidecar('c')}"
    return cel.when(f"{holders}.size() > 0 && {holders}.all(c, {plain})", found, "[]")


def _max_per_pod(checks: Checks, cfg: ResourceShapeRule) -> str:
    """``_check_max`` over the pod's effective GPU count (sidecars included), for counts written as
    whole numbers (``"4"``, ``4``): the engine prints the decimal sum, which CEL cannot for others."""
    caps: dict[str, int] = cfg.maxPerPod if isinstance(cfg.maxPerPod, dict) else {"*": int(cfg.maxPerPod or 0)}
    sharing = cel.matcher("n", cfg.sharingSchemes.resources)
    names = (f"t.cs.map(c, c.gpus.filter(n, {checks.is_gpu('n')} && !({sharing})).join({cel.SEP_LITERAL}))"
             f".filter(s, s != '').join({cel.SEP_LITERAL}).split({cel.SEP_LITERAL})")
    names = sorted_strings(distinct(f"({names}).filter(n, n != '')"))
    cap = _cap(caps)
    total = _effective_count()
    message = (f"{where()} + ': asks for ' + string({total}) + ' ' + n + ' in one pod; the policy allows at most ' + "
               f"string({cap}) + ' per pod: spread the work over more pods with fewer GPUs each (more replicas or workers)'")
    plain = "t.cs.all(c, !(n in c.gpus) || " + _plain_count() + ")"
    return f"{names}.map(n, {cap} >= 0 && {plain} && {total} > {cap} ? {checks.finding(message)} : '')"


def _cap(caps: dict[str, int]) -> str:
    """``_cap_for``: the exact name's cap, else the longest matching prefix's; -1 for none."""
    expr = "-1"
    prefixes = sorted((p for p in caps if p.endswith("*")), key=len, reverse=True)
    for pattern in reversed(prefixes):
        expr = cel.when(f"n.startsWith({cel.quote(pattern[:-1])})" if pattern[:-1] else "true", str(caps[pattern]), expr)
    for name in reversed([p for p in caps if not p.endswith("*")]):
        expr = cel.when(f"n == {cel.quote(name)}", str(caps[name]), expr)
    return expr


def _count(c: str) -> str:
    """``resources.gpu_count`` of ``n`` (the limit, else the request, else 0) as an int."""
    limit, request = f"{c}.lim[n]", f"{c}.req[n]"

    def as_int(value: str) -> str:
        return f"(type({value}) == string ? quantity({value}).asInteger() : int({value}))"

    return (f"({_given(c, 'lim', 'n')} && {_valid(limit)} ? {as_int(limit)} : "
            f"({_given(c, 'req', 'n')} && {_valid(request)} ? {as_int(request)} : 0))")


def _plain_count() -> str:
    """The count ``_count`` reads is written as a whole number."""
    def plain(value: str) -> str:
        return f"(type({value}) == int || (type({value}) == string && {value}.matches('^[0-9]+$')))"

    limit, request = "c.lim[n]", "c.req[n]"
    return (f"({_given('c', 'lim', 'n')} && {_valid(limit)} ? {plain(limit)} : "
            f"({_given('c', 'req', 'n')} && {_valid(request)} ? {plain(request)} : true))")


def _effective_count() -> str:
    """``resources.pod_gpus`` of ``n``: app containers plus sidecars, or the largest plain init
    container plus the sidecars started before it."""
    app = f"t.cs.filter(c, c.list == 'containers' && n in c.gpus).map(c, {_count('c')}).sum()"
    sidecars = f"t.cs.filter(c, c.list == 'initContainers' && {podspecs.is_sidecar('c')} && n in c.gpus).map(c, {_count('c')}).sum()"
    before = (f"t.cs.filter(d, d.list == 'initContainers' && d.i < c.i && {podspecs.is_sidecar('d')} && n in d.gpus)"
              f".map(d, {_count('d')}).sum()")
    peak = f"([0] + t.cs.filter(c, c.list == 'initContainers' && !{podspecs.is_sidecar('c')} && n in c.gpus).map(c, {_count('c')} + {before})).max()"
    return f"[{app} + {sidecars}, {peak}].max()"


# -- the checks of mutation rules (the mutating webhook's findings)

def security_context(checks: Checks, cfg: SecurityContextRule, windows: str) -> str:
    """``security_context._report_violations`` (level enforce); Windows pods are left alone."""
    if cfg.level != "enforce":
        return "[]"
    pod = cel.sub_map("t.spec", "securityContext")
    found = [
        cel.when(f"has({pod}.runAsUser) && {pod}.runAsUser == 0",
                 f"[{checks.finding(where() + ' + ' + cel.quote(': runs as root (spec.securityContext.runAsUser: 0); use a non-zero UID'))}]", "[]"),
        cel.when(f"has({pod}.runAsNonRoot) && {pod}.runAsNonRoot == false",
                 f"[{checks.finding(where() + ' + ' + cel.quote(': sets spec.securityContext.runAsNonRoot: false; remove it'))}]", "[]"),
    ]
    sc = cel.sub_map("c.c", "securityContext")
    allowed = ", ".join(cfg.allowedCapabilities) or "none"
    added = f"{cel.sub_list(cel.sub_map(sc, 'capabilities'), 'add')}.filter(a, !(a in {cel.strings(cfg.allowedCapabilities)}))"

    def problem(field: str, condition: str, text: str) -> str:
        return cel.when(condition, f"[{checks.finding(where('c', 'securityContext.' + field) + ' + ' + text)}]", "[]")

    problems = " + ".join([
        problem("privileged", f"has({sc}.privileged) && {sc}.privileged == true",
                cel.quote(": is privileged; GPU access needs only the GPU resource, not privileged: true")),
        problem("runAsUser", f"has({sc}.runAsUser) && {sc}.runAsUser == 0", cel.quote(": runs as root (runAsUser: 0); use a non-zero UID")),
        problem("runAsNonRoot", f"has({sc}.runAsNonRoot) && {sc}.runAsNonRoot == false", cel.quote(": sets runAsNonRoot: false; remove it")),
        problem("allowPrivilegeEscalation", f"has({sc}.allowPrivilegeEscalation) && {sc}.allowPrivilegeEscalation == true",
                cel.quote(": allows privilege escalation; set it to false")),
        problem("capabilities.add", f"{added}.size() > 0",
                f"': adds capabilities ' + {added}.map(a, string(a)).join(', ') + {cel.quote(f'; allowed: {allowed}')}"),
    ])
    found.append(f"t.cs.map(c, ({problems}).join({cel.SEP_LITERAL}))")
    return cel.when(windows, "[]", " + ".join(found))


def gpu_visibility(checks: Checks, cfg: GpuVisibilityRule) -> str:
    """``gpu_visibility.run``'s check: containers without GPUs that set NVIDIA_VISIBLE_DEVICES."""
    if not cfg.denyUnrequestedVisibleDevices:
        return "[]"
    env = f"{cel.sub_list('c.c', 'env')}.filter(e, type(e) == map && has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES')"
    entry = f"{env}[0]"
    visible = f"(has({entry}.valueFrom) && {_truthy(entry + '.valueFrom')}) || !has({entry}.value) || !({entry}.value in ['void', 'none', ''])"
    message = checks.finding(
        f"{where('c', 'env')} + ': sets NVIDIA_VISIBLE_DEVICES without requesting a GPU, which bypasses GPU scheduling; "
        "request nvidia.com/gpu in resources.limits instead'"
    )
    mine = f"t.cs.filter(c, c.gpus.exists(n, {checks.is_gpu('n')}))"
    every_gpu = f"{mine}.size() > 0 && {mine}.size() == {_container_count('t.spec')}"
    per_container = f"t.cs.map(c, !c.gpus.exists(n, {checks.is_gpu('n')}) && {env}.size() > 0 && ({visible}) ? {message} : '')"
    return cel.when(every_gpu, "[]", per_container)


def _container_count(spec: str) -> str:
    return f"{cel.sub_list(spec, 'initContainers')}.size() + {cel.sub_list(spec, 'containers')}.size()"


def _truthy(value: str) -> str:
    """Python's truth of a JSON value."""
    return (f"(type({value}) == map ? size({value}) > 0 : (type({value}) == list ? size({value}) > 0 : "
            f"(type({value}) == string ? {value} != '' : (type({value}) == bool ? {value} : type({value}) != null_type))))")


def node_affinity(checks: Checks, cfg: NodeAffinityRule, is_gpu: str) -> str:
    """``node_affinity.run``'s check (onConflict: deny): a required expression the nodeSelector
    contradicts, or every required term does."""
    from webhook.cel import affinity
    from webhook.cel.patches import _requirements

    if cfg.onConflict != "deny":
        return "[]"
    required, _ = _requirements(cfg, is_gpu)
    selector = cel.sub_map("t.spec", "nodeSelector")
    terms = cel.sub_list(cel.sub_map(cel.sub_map(cel.sub_map("t.spec", "affinity"), "nodeAffinity"), affinity.REQUIRED[2]),
                         affinity.REQUIRED[3])
    found = []
    for condition, wanted in required:
        described = affinity.describe(wanted)
        tail = cel.quote(f"; the policy requires {described}, so no allowed node could run it")
        key = cel.quote(str(wanted.get("key")))
        pinned = checks.finding(f"{where()} + ': nodeSelector pins ' + {key} + '=' + string(S[{key}]) + "
                                f"{cel.quote(f', which is not {described}')} + {tail}")
        every = checks.finding(f"{where()} + {cel.quote(f': every required node-affinity term contradicts {described}')} + {tail}")
        all_conflict = f"size(T) > 0 && T.all(term, {affinity.term_relation('term', wanted)} == 'conflicts')"
        judged = (f"[{affinity.pinned('S', wanted)}].map(p, p == 'conflicts' ? [{pinned}] : "
                  f"(p == 'implies' ? [] : ({all_conflict} ? [{every}] : [])))[0]")
        found.append(cel.when(condition, judged, "[]"))
    return f"[{selector}].map(S, [{terms}].map(T, {' + '.join(found) or '[]'})[0])[0]"


def notebook_lifetime(checks: Checks, cfg: NotebookLifetimeRule) -> str:
    """``notebook_lifetime.run``'s check: a deadline longer than notebooks may hold GPUs."""
    limit = cfg.maxActiveDeadlineSeconds
    if limit is None:
        return "[]"
    current = "t.spec.activeDeadlineSeconds"
    message = checks.finding(
        f"{where(field='spec.activeDeadlineSeconds')} + ': ' + string({current}) + 's (' + {hours(current)} + "
        f"{cel.quote(f') is longer than the {_hours(limit)} notebooks may hold GPUs; set at most {limit} or leave it out for the default {_hours(cfg.activeDeadlineSeconds)}')}"
    )
    return cel.when(f"has(t.spec.activeDeadlineSeconds) && type({current}) == int && {current} > {limit}", f"[{message}]", "[]")


def priority_class(checks: Checks, cfg: PriorityClassRule, own: str) -> str:
    """``priority_class._judge`` on the class the pod spec keeps: the one it carries once mutated (the
    compiled mutation sets its own class only where it named none, and the webhook replaces the
    cluster's globalDefault before this runs). ``own`` is the class the policy gives it, in CEL."""
    current = "t.spec.priorityClassName"
    named = f"has({current}) && type({current}) == string && {current} != ''"
    instead = (f"(o != '' ? {cel.quote('remove priorityClassName and this pod gets ' + chr(39))} + o + {cel.quote(chr(39))}"
               f" : {cel.quote('remove priorityClassName')})")
    at = where(field="spec.priorityClassName")
    reserved = cel.some(*(cel.glob(current, p) for p in cfg.refusedClasses)) if cfg.refusedClasses else "false"
    exempt = cel.globs("request.namespace", cfg.refusedClassesExemptNamespaces) if cfg.refusedClassesExemptNamespaces else "false"
    refused = checks.finding(
        f"{at} + {cel.quote(': PriorityClass ' + chr(39))} + {current} + "
        f"{cel.quote(chr(39) + ' is for the cluster' + chr(39) + 's own components, not workloads: it would let this pod preempt them and every other GPU pod; ')}"
        f" + {instead}"
    )
    found = "[]"
    choice = cfg.userChoice
    if choice is not None:
        for name, classes in reversed(list(cfg.workload_classes.items())):
            keys = [choice.namespaceLabelPrefix + w for w in classes if w not in choice.everywhere]
            if len(keys) < len(classes):
                continue
            allowed = cel.some(*(f"{cel.quote(k)} in variables.nsLabels && variables.nsLabels[{cel.quote(k)}] == 'true'" for k in keys))
            labels = " or ".join(k + "=true" for k in keys)
            message = checks.finding(
                f"{at} + {cel.quote(f': PriorityClass {name!r} is for ' + ' or '.join(classes) + ' pods, which namespace ')} + "
                f"request.namespace + {cel.quote(f' may not choose (the platform team allows it with the namespace label {labels}); ')}"
                f" + {instead}"
            )
            found = cel.when(f"{current} == {cel.quote(name)} && !({allowed})", f"[{message}]", found)
    judged = cel.when(cel.every(reserved, cel.negate(exempt)), f"[{refused}]", found)
    return f"[{own}].map(o, {cel.every(named, current + ' != o')} ? {judged} : [])[0]"


def _hours(seconds: int) -> str:
    return f"{seconds / 3600:g}h"


def hours(seconds: str) -> str:
    """``f"{seconds / 3600:g}h"`` of a positive int: six significant digits, no trailing zeros
    (CEL has no ``%g``: ``%.<n>f`` with n for six significant digits, then the zeros cut)."""
    value = f"(double({seconds}) / 3600.0)"
    whole = f"({seconds} / 3600)"

    def fixed(decimals: int) -> str:
        text = f"'%.{decimals}f'.format([{value}])"
        last = f"{text}.find('^[0-9]*[.][0-9]*[1-9]')"
        return f"({last} != '' ? {last} : {text}.split('.')[0])"

    large = fixed(0)
    for digits in range(5, 0, -1):
        large = cel.when(f"{whole} < {10 ** digits}", fixed(6 - digits), large)
    small = fixed(9)
    for zeros in range(2, -1, -1):
        small = cel.when(f"{value} >= {10.0 ** -(zeros + 1)!r}", fixed(6 + zeros), small)
    return f"({whole} >= 1 ? {large} : {small}) + 'h'"


RuleChecks = Callable[[Checks, Any], str]
