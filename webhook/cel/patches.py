"""The changes of compiled mutation rules, in CEL: JSONPatch operations that leave a pod spec as
the engine's rule does.

Each function returns, for one pod spec ``t`` (a target record of webhook.cel.podspecs), a CEL
list of ``JSONPatch`` operations: nothing when the rule would change nothing, so a second pass
(``reinvocationPolicy: IfNeeded``) adds nothing. Lists a rule adds to are appended to with
JSONPatch (``/-``), never replaced: pod ``tolerations`` is an atomic list for server-side apply,
which an ApplyConfiguration would replace whole. The rule modules of webhook/policy/rules are
the reference.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from webhook.cel import affinity, podspecs
from webhook.cel import syntax as cel
from webhook.policy.rules.node_affinity import expression
from webhook.policy.rules import tolerations as toleration_rule
from webhook.policy.schema import TolerationsRule
from webhook.policy.settings.mutation import (
    GpuVisibilityRule,
    NodeAffinityRule,
    NotebookLifetimeRule,
    PriorityClassRule,
    RuntimeClassRule,
    SecurityContextRule,
    ShmRule,
    SpreadReplicasRule,
    TrainingLocalityRule,
)

MIB = 2**20
#: how many ``gpu-admission-shm-<n>`` names the compiled policy tries when the volume name is taken
SHM_NAMES = 9


def value(data: Any) -> str:
    """A JSON value as a CEL expression a JSONPatch can carry (maps and lists of ``dyn``)."""
    if isinstance(data, dict):
        return "{" + ", ".join(f"{cel.quote(str(k))}: dyn({value(v)})" for k, v in data.items()) + "}"
    if isinstance(data, (list, tuple)):
        return "[" + ", ".join(f"dyn({value(v)})" for v in data) + "]"
    return cel.literal(data)


def add(path: str, item: str) -> str:
    return f"JSONPatch{{op: 'add', path: {path}, value: {item}}}"


def remove(path: str) -> str:
    return f"JSONPatch{{op: 'remove', path: {path}}}"


def token(key: str) -> str:
    return cel.quote("/" + cel.json_pointer_token(key))


def append(parent: str, at: str, key: str, items: str) -> str:
    """Operations appending the CEL list ``items`` to the list ``parent[key]`` (a JSON pointer
    ``at``), or adding the list whole where there is none (``PatchBuilder.append_to``)."""
    path = f"{at} + {token(key)}"
    return (f"({cel.has(parent, key)} && type({cel.field(parent, key)}) == list ? "
            f"{items}.map(x, {add(path + ' + ' + cel.quote('/-'), 'x')}) : [{add(path, items)}])")


def _string(expr: str, key: str) -> str:
    """A map's string field, '' when absent, null or not a string."""
    return f"({cel.has(expr, key)} && type({cel.field(expr, key)}) == string ? {cel.field(expr, key)} : '')"


# -- tolerations

def tolerations(cfg: TolerationsRule) -> str:
    """``tolerations.run``: the wanted tolerations no existing one covers, appended."""
    wanted = list(cfg.wanted)
    existing = cel.sub_list("t.spec", "tolerations")
    added: list[str] = []
    for i, toleration in enumerate(wanted):
        covered = f"{existing}.exists(h, type(h) == map && {_covers('h', toleration)})"
        # one added before it covers it too (the rule appends to what it compares with)
        earlier = [added[j] for j in range(i) if toleration_rule.covers(wanted[j], toleration)]
        added.append(cel.every(cel.negate(covered), *(cel.negate(e) for e in earlier)))
    items = " + ".join(cel.when(condition, f"[{value(t)}]", "[]") for condition, t in zip(added, wanted))
    return f"[{items}].map(a, size(a) > 0 ? {append('t.spec', 't.at', 'tolerations', 'a')} : [])[0]"


def _covers(have: str, wanted: dict[str, Any]) -> str:
    """``tolerations.covers`` of an existing toleration ``have`` over a wanted (known) one."""
    key, effect = _string(have, "key"), _string(have, "effect")
    operator = f"({_string(have, 'operator')} != '' ? {_string(have, 'operator')} : 'Equal')"
    seconds = f"{have}.tolerationSeconds"
    bounded = f"{effect} == 'NoExecute' && has({seconds}) && type({seconds}) != null_type"
    wanted_seconds = wanted.get("tolerationSeconds")
    number = f"(type({seconds}) == int || type({seconds}) == double)"
    too_short = "true" if wanted_seconds is None else f"!{number} || {seconds} < {wanted_seconds}"
    equal = ("false" if wanted.get("operator") != "Equal" else
             f"{_string(have, 'value')} == {cel.quote(str(wanted.get('value') or ''))}")
    return cel.every(
        f"{key} == '' || {key} == {cel.quote(str(wanted.get('key') or ''))}",
        f"{key} != '' || {operator} == 'Exists'",
        f"{effect} == '' || {effect} == {cel.quote(str(wanted.get('effect') or ''))}",
        f"!({bounded} && ({too_short}))",
        f"{operator} == 'Exists' || {equal}",
    )


# -- runtimeClass

def runtime_class(cfg: RuntimeClassRule) -> str:
    """``runtime_class.run`` but for the class's existence: set when absent (or overridden), the
    overhead of another class dropped; never on Windows pods."""
    current = _string("t.spec", "runtimeClassName")
    name = cel.quote(cfg.name)
    wanted = cel.every(f"{current} != {name}", "true" if cfg.override else f"{current} == ''",
                       cel.negate(podspecs.is_windows("t.spec")))
    ops = f"[{add('t.at + ' + cel.quote('/runtimeClassName'), name)}]"
    ops += f" + ('overhead' in t.spec ? [{remove('t.at + ' + cel.quote('/overhead'))}] : [])"
    return cel.when(wanted, f"({ops})", "[]")


# -- priorityClass

def class_choice(cfg: PriorityClassRule) -> str:
    """``PriorityClassRule.own`` for the pod spec ``t`` ('' for none): ``cfg.classes`` of its workload
    class (where its namespace may choose the class, with ``userChoice.ownClass: allowed-namespaces``),
    or the default."""
    choice = "''" if cfg.default is None else cel.quote(cfg.default)
    gate = cfg.userChoice if cfg.userChoice is not None and cfg.userChoice.ownClass == "allowed-namespaces" else None
    fallback = None if gate is None else next((cfg.classes[w] for w in gate.everywhere if w in cfg.classes), cfg.default)
    otherwise = "''" if fallback is None else cel.quote(fallback)
    for workload_class, priority in reversed(list(cfg.classes.items())):
        given = cel.quote(priority)
        if gate is not None and workload_class not in gate.everywhere:
            key = cel.quote(gate.namespaceLabelPrefix + workload_class)
            given = cel.when(f"{key} in variables.nsLabels && variables.nsLabels[{key}] == 'true'", given, otherwise)
        choice = cel.when(f"t.class == {cel.quote(workload_class)}", given, choice)
    return choice


def priority_class(cfg: PriorityClassRule) -> str:
    """``priority_class.run`` for a pod spec naming no class (or any, with override): the class of
    its workload class, and spec.priority and preemptionPolicy dropped for kube-apiserver's
    Priority plugin to fill from it (it runs again after a MutatingAdmissionPolicy's change). A
    class already there is kept: the webhook replaces the cluster's globalDefault class."""
    choice = class_choice(cfg)
    current = _string("t.spec", "priorityClassName")
    ops = f"[{add('t.at + ' + cel.quote('/priorityClassName'), 'n')}]"
    for field in ("priority", "preemptionPolicy"):
        ops += f" + ({cel.quote(field)} in t.spec ? [{remove('t.at + ' + cel.quote('/' + field))}] : [])"
    wanted = cel.every("n != ''", f"{current} != n", "true" if cfg.override else f"{current} == ''")
    return f"[{choice}].map(n, {wanted} ? ({ops}) : [])[0]"


# -- securityContext

_ASKS_ROOT = "((has({sc}.runAsUser) && {sc}.runAsUser == 0) || (has({sc}.runAsNonRoot) && {sc}.runAsNonRoot == false))"


def _sc(parent: str) -> str:
    return cel.sub_map(parent, "securityContext")


def _unset(sc: str, key: str) -> str:
    return f"(!has({sc}.{key}) || type({sc}.{key}) == null_type)"


def security_context(cfg: SecurityContextRule) -> str:
    """``security_context.run``'s defaults: the pod's (less what its own settings rule out) and each
    container's, root left to what it asks for; never on Windows pods. The pod's securityContext is
    read once (``p``), and each container's (``S``, in ``t.cs`` order: a map, ``{}`` when it has none)."""
    asks_root = _ASKS_ROOT.format(sc="s")
    explicit_root = f"({_ASKS_ROOT.format(sc='p')} || S.exists(s, {asks_root}))"
    every_seccomp = f"(size(S) > 0 && S.all(s, size(s) > 0 && {_truthy('s', 'seccompProfile')}))"
    keys: list[tuple[str, str, str]] = []  # (key, condition, value)
    # the pod's defaults, as _pod_defaults leaves them
    keys.append(("runAsNonRoot", f"!R && !('runAsNonRoot' in p)", "true"))
    if cfg.runAsUser is not None:
        keys.append(("runAsUser", "!R", str(cfg.runAsUser)))
    if cfg.runAsGroup is not None:
        keys.append(("runAsGroup", "!R", str(cfg.runAsGroup)))
    if cfg.fsGroup is not None:
        keeps = f"!R && {_unset('p', 'fsGroup')}"
        keys.append(("fsGroup", keeps, str(cfg.fsGroup)))
        keys.append(("fsGroupChangePolicy", keeps, "'OnRootMismatch'"))
    if cfg.seccompProfile:
        keys.append(("seccompProfile", f"!{every_seccomp}", value({"type": cfg.seccompProfile})))
    whole = "{" + ", ".join(f"{cel.quote(k)}: dyn({v})" for k, _, v in keys) + "}"
    kept = f"{whole}.transformMap(k, v, {_key_kept(keys)}, v)"
    at = "t.at + '/securityContext'"
    # (the defaults kept, worked out once: bound to K, not again for every key added)
    pod_ops = (f"[{kept}].map(K, size(p) == 0 ? (size(K) > 0 ? [{add(at, 'K')}] : []) : "
               f"K.transformList(k, v, k).filter(k, !(k in p) || type(p[k]) == null_type)"
               f".map(k, {add(at + ' + ' + cel.quote('/') + ' + k', 'K[k]')}))[0]")
    ops = f"[{explicit_root}].map(R, {pod_ops})[0] + {_container_defaults()}"
    read = f"[{_sc('t.spec')}].map(p, [t.cs.map(c, {_sc('c.c')})].map(S, {ops})[0])[0]"
    return cel.when(podspecs.is_windows("t.spec"), "[]", f"({read})")


def _key_kept(keys: list[tuple[str, str, str]]) -> str:
    return cel.some(*(f"(k == {cel.quote(k)} && ({condition}))" for k, condition, _ in keys))


def _truthy(parent: str, key: str) -> str:
    item = cel.field(parent, key)
    return (f"({cel.has(parent, key)} && type({item}) != null_type && "
            f"(type({item}) == map || type({item}) == list || type({item}) == string ? size({item}) > 0 : "
            f"(type({item}) == bool ? {item} : true)))")


def _container_defaults() -> str:
    """``_container_defaults`` of every container (``pod_root``: the pod asks for root), its securityContext
    ``S[i]``, the pod's ``p``."""
    at = "t.at + '/' + c.list + '/' + string(c.i) + '/securityContext'"
    root = _ASKS_ROOT.format(sc="p")
    fresh = f"P_root ? {value({'allowPrivilegeEscalation': False})} : {value({'allowPrivilegeEscalation': False, 'capabilities': {'drop': ['ALL']}})}"
    escalates = ("((has(s.privileged) && s.privileged == true) || "
                 f"{cel.sub_list(cel.sub_map('s', 'capabilities'), 'add')}.exists(a, a == 'CAP_SYS_ADMIN' || a == 'SYS_ADMIN'))")
    runs_root = f"({_ASKS_ROOT.format(sc='s')} || (P_root && {_unset('s', 'runAsUser')} && !(has(s.runAsNonRoot) && s.runAsNonRoot == true)))"
    escalation = f"({_unset('s', 'allowPrivilegeEscalation')} ? [{add(at + ' + ' + cel.quote('/allowPrivilegeEscalation'), 'false')}] : [])"
    caps = "s.capabilities"
    has_caps = f"(has(s.capabilities) && type({caps}) == map)"
    drop_at = at + " + " + cel.quote("/capabilities/drop")
    drop = (f"({has_caps} ? (!has({caps}.drop) || type({caps}.drop) != list ? [{add(drop_at, value(['ALL']))}] : "
            f"(!('ALL' in {caps}.drop) ? [{add(drop_at + ' + ' + cel.quote('/-'), cel.quote('ALL'))}] : [])) : "
            f"({_unset('s', 'capabilities')} ? [{add(at + ' + ' + cel.quote('/capabilities'), value({'drop': ['ALL']}))}] : []))")
    judged = f"{escalates} ? [] : ({runs_root} ? {escalation} : {escalation} + {drop})"
    per = f"[S[i]].map(s, size(s) == 0 ? [{add(at, f'({fresh})')}] : ({judged}))[0]"
    return f"[{root}].map(P_root, t.cs.transformList(i, c, {per}).flatten())[0]"


# -- shm

def shm(cfg: ShmRule, is_gpu: str) -> str:
    """``shm.run`` for memory limits the CEL quantity library can size exactly (whole bytes, no
    multiplication overflow): a memory-backed volume sized from the smallest limit, mounted at
    /dev/shm in GPU containers that mount nothing there. A pod it cannot size is left alone (the
    webhook, which keeps the rule, sizes it)."""
    mount_path = "'/dev/shm'"
    mounts = "c.c.volumeMounts"
    mounted = (f"(has(c.c.volumeMounts) && type({mounts}) == list && {mounts}.exists(m, type(m) == map && has(m.mountPath) && "
               f"type(m.mountPath) == string && (m.mountPath == {mount_path} || m.mountPath.matches('^/dev/shm/+$'))))")
    # (a native sidecar, restartPolicy: Always, runs beside the app containers: one of them here)
    lists = f"(c.list == 'containers' || {podspecs.is_sidecar('c')})" if not cfg.initContainers else "true"
    targets = f"t.cs.filter(c, c.gpus.exists(n, {is_gpu}) && {lists} && !{mounted})"
    volumes = f"{cel.sub_list('t.spec', 'volumes')}.filter(v, type(v) == map)"
    names = f"{volumes}.map(v, has(v.name) ? string(v.name) : 'None')"
    ours = (f"{volumes}.filter(v, has(v.name) && string(v.name) == x).map(v, has(v.emptyDir) && type(v.emptyDir) == map && "
            "has(v.emptyDir.medium) && v.emptyDir.medium == 'Memory')")
    candidates = cel.strings([cfg.volumeName, *(f"{cfg.volumeName}-{n}" for n in range(2, SHM_NAMES + 1))])
    # _volume_name: the base name when free; else the first that is free or is a memory emptyDir
    name = (f"!({cel.quote(cfg.volumeName)} in {names}) ? [{cel.quote(cfg.volumeName)}, 'new'] : "
            f"[{candidates}.filter(x, !(x in {names}) || {ours}[size({ours}) - 1])].map(f, size(f) == 0 ? ['', ''] : "
            f"[f[0], f[0] in {names} ? 'ours' : 'new'])[0]")
    size = _size(cfg)
    volume = "{'medium': dyn('Memory'), 'sizeLimit': dyn(z)}"
    new_volume = f"{{'name': dyn(N[0]), 'emptyDir': dyn({volume})}}"
    mount = f"{{'name': N[0], 'mountPath': {mount_path}}}"
    volume_ops = append("t.spec", "t.at", "volumes", f"[{new_volume}]")
    container_at = "t.at + '/' + c.list + '/' + string(c.i)"
    mount_ops = f"T.map(c, {append('c.c', container_at, 'volumeMounts', f'[{mount}]')}).flatten()"
    sized = f"[{size}].map(z, z == '' ? [] : {volume_ops} + {mount_ops})[0]"
    body = f"N[0] == '' ? [] : (N[1] == 'ours' ? {mount_ops} : {sized})"
    skip = cel.some("has(t.spec.hostIPC) && t.spec.hostIPC == true", podspecs.is_windows("t.spec"))
    return cel.when(skip, "[]", f"[{targets}].map(T, size(T) == 0 ? [] : [{name}].map(N, {body})[0])[0]")


def _size(cfg: ShmRule) -> str:
    """The volume's size for the containers ``T`` (``_size_for``, the smallest): a quantity string,
    or '' when a limit is not whole bytes (left to the webhook)."""
    sizes = cfg.bytes
    fraction = sizes.fraction.as_integer_ratio()
    p, q = fraction
    most = (2**63 - 1) // max(p, q * MIB)

    def mib(amount: Decimal) -> int:
        return int(amount / MIB)

    pod = _memory_limit("t.spec")
    limit = f"[{_memory_limit('c.c')}].map(l, l == '' ? P : (P == '' || !isQuantity(P) ? l : (!isQuantity(l) ? P : (quantity(l).compareTo(quantity(P)) <= 0 ? l : P))))[0]"
    whole = f"isQuantity(l) && quantity(l).isInteger() && quantity(l).compareTo(quantity('{most}')) <= 0"
    if sizes.fixed is not None:
        fixed = mib(sizes.fixed)
        unsized, zero, per_limit = str(max(fixed, 1)), str(max(fixed, 1)), f"[L / {MIB}, {fixed}].min()"
    else:
        unsized = str(max(mib(sizes.without_limit), 1))
        # a limit of zero caps nothing: the minimum (within the maximum)
        zero = str(max(mib(min(sizes.minimum, sizes.maximum)), 1))
        per_limit = f"[[L * {p} / ({q} * {MIB}), {mib(sizes.minimum)}].max(), {mib(sizes.maximum)}, L / {MIB}].min()"
    mebibytes = (f"!isQuantity(l) ? {unsized} : (!({whole}) ? -1 : "
                 f"[quantity(l).asInteger()].map(L, L <= 0 ? {zero} : [{per_limit}, 1].max())[0])")
    each = f"[{pod}].map(P, T.map(c, [{limit}].map(l, {mebibytes})[0]))[0]"
    return f"[{each}].map(k, k.exists(x, x < 0) ? '' : [k.min()].map(m, {_format('m')})[0])[0]"


def _memory_limit(obj: str) -> str:
    """``shm._memory_limit``: ``resources.limits.memory`` as a string, '' when there is none."""
    condition, limits = cel.map_at(obj, ["resources", "limits"])
    memory = f"{limits}.memory"
    return (f"({condition} && has({limits}.memory) && type({memory}) != null_type ? "
            f"(type({memory}) == string ? {memory} : string({memory})) : '')")


def _format(mebibytes: str) -> str:
    """``quantity.format_bytes`` of a whole number of MiB: the largest binary unit that keeps it whole."""
    units = [(2**40, "Ei"), (2**30, "Pi"), (2**20, "Ti"), (2**10, "Gi")]
    expr = f"string({mebibytes}) + 'Mi'"
    for per, unit in reversed(units):
        expr = cel.when(f"{mebibytes} % {per} == 0", f"string({mebibytes} / {per}) + '{unit}'", expr)
    return expr


# -- gpuVisibility

def gpu_visibility(cfg: GpuVisibilityRule, is_gpu: str) -> str:
    """``gpu_visibility.run``'s change: NVIDIA_VISIBLE_DEVICES=void in the containers of a GPU pod
    that ask for no GPU and do not set it."""
    if not cfg.setVoid:
        return "[]"
    holders = f"t.cs.filter(c, c.gpus.exists(n, {is_gpu}))"
    every = f"size({holders}) == {cel.sub_list('t.spec', 'initContainers')}.size() + {cel.sub_list('t.spec', 'containers')}.size()"
    env = cel.sub_list("c.c", "env")
    unset = f"!{env}.exists(e, type(e) == map && has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES')"
    at = "t.at + '/' + c.list + '/' + string(c.i)"
    void = value({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    ops = f"t.cs.filter(c, !c.gpus.exists(n, {is_gpu}) && {unset}).map(c, {append('c.c', at, 'env', '[' + void + ']')}).flatten()"
    return f"(size({holders}) == 0 || {every} ? [] : {ops})"


# -- notebookLifetime

def notebook_lifetime(cfg: NotebookLifetimeRule) -> str:
    """``notebook_lifetime.run``'s default: a deadline where none is set, but for a pod a controller recreates."""
    unset = "(!has(t.spec.activeDeadlineSeconds) || type(t.spec.activeDeadlineSeconds) == null_type)"
    owned = f"{cel.sub_list('t.meta', 'ownerReferences')}.exists(r, type(r) == map && has(r.controller) && r.controller == true)"
    conditions = [unset] + ([cel.negate(owned)] if cfg.skipControllerOwned else [])
    return cel.when(cel.every(*conditions), f"[{add('t.at + ' + cel.quote('/activeDeadlineSeconds'), str(cfg.activeDeadlineSeconds))}]", "[]")


# -- nodeAffinity

def _requirements(cfg: NodeAffinityRule, is_gpu: str) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    """``node_affinity._requirements``: (condition, expression) of each required requirement and
    each preferred term, in order; a ``byResource`` entry's when the pod asks for its resources
    as extended resources."""
    required = [("true", expression(r)) for r in cfg.required]
    preferred = [("true", _preferred(p)) for p in cfg.preferred]
    for extra in cfg.byResource:
        asks = f"t.cs.exists(c, c.gpus.exists(n, {is_gpu} && {cel.matcher('n', extra.resources)}))"
        required += [(asks, expression(r)) for r in extra.required]
        preferred += [(asks, _preferred(p)) for p in extra.preferred]
    return required, preferred


def _preferred(term: Any) -> dict[str, Any]:
    return {"weight": term.weight, "preference": {"matchExpressions": [expression(e) for e in term.matchExpressions]}}


def node_affinity(cfg: NodeAffinityRule, is_gpu: str) -> str:
    """``node_affinity.run``'s changes (``affinity.require`` and ``prefer``): each required
    expression ANDed into every term that does not imply it (or into a first term), unless the
    nodeSelector settles it or every term contradicts it (the ValidatingAdmissionPolicy refuses
    that); preferred terms added once. Compiled for requirements of distinct keys only
    (``offload``), whose merges then do not see each other."""
    required, preferred = _requirements(cfg, is_gpu)
    if not required and not preferred:
        return "[]"
    node = cel.sub_map(cel.sub_map("t.spec", "affinity"), "nodeAffinity")
    required_key, terms_key = affinity.REQUIRED[2], affinity.REQUIRED[3]
    terms = cel.sub_list(cel.sub_map(node, required_key), terms_key)
    # the requirements the nodeSelector leaves to the terms (S: the nodeSelector)
    reaching = [cel.every(condition, f"[{affinity.pinned('S', w)}].map(p, p == '' || p == 'independent')[0]")
                for condition, w in required]
    # no terms yet (T empty): one, of every requirement that reaches it (F)
    first = "[" + ", ".join(cel.when(r, f"[{value(w)}]", "[]") for r, (_, w) in zip(reaching, required)) + "].flatten()"
    # terms (T): per requirement, the terms to append it to, unless every term contradicts it
    to_terms = [f"[T.map(term, {affinity.term_relation('term', w)})].map(R, {r} && !R.all(x, x == 'conflicts') ? "
                "R.map(x, x != 'implies') : R.map(x, false))[0]" for r, (_, w) in zip(reaching, required)]
    at = "t.at + '/affinity/nodeAffinity'"
    term_at = f"{at} + {cel.quote(f'/{required_key}/{terms_key}/')} + string(k)"
    appends = "[]"
    if required:
        items = "[" + ", ".join(f"A[{i}][k] ? [{value(w)}] : []" for i, (_, w) in enumerate(required)) + "].flatten()"
        appends = (f"[[{', '.join(to_terms)}]].map(A, T.transformList(k, term, type(term) == map, {items}))[0]"
                   f".transformList(k, W, size(W) > 0, {append('T[k]', term_at, 'matchExpressions', 'W')}).flatten()")
    # preferred terms not there yet, nor added by an identical one before them (Q)
    current = cel.sub_list(node, affinity.PREFERRED[2])
    kept: list[dict[str, Any]] = []
    pick = []
    for condition, term in preferred:
        if term not in kept:
            kept.append(term)
            pick.append(cel.when(cel.every(condition, f"!{current}.exists(x, x == {value(term)})"), f"[{value(term)}]", "[]"))
    prefs = f"[{', '.join(pick)}].flatten()" if pick else "[]"
    first_term = "[{'matchExpressions': F}]"
    fresh = (f"{{{cel.quote(required_key)}: dyn({{{cel.quote(terms_key)}: {first_term}}}), {cel.quote(affinity.PREFERRED[2])}: dyn(Q)}}"
             f".transformMap(key, v, key == {cel.quote(required_key)} ? size(F) > 0 : size(Q) > 0, v)")
    has_affinity = "has(t.spec.affinity) && type(t.spec.affinity) == map"
    has_node = f"{has_affinity} && has(t.spec.affinity.nodeAffinity) && type(t.spec.affinity.nodeAffinity) == map"
    has_required = f"{has_node} && {cel.has('t.spec.affinity.nodeAffinity', required_key)} && type({cel.field('t.spec.affinity.nodeAffinity', required_key)}) == map"
    into_required = (f"size(T) > 0 ? {appends} : (size(F) == 0 ? [] : ({has_required} ? "
                     f"[{add(at + ' + ' + cel.quote(f'/{required_key}/{terms_key}'), first_term)}] : "
                     f"[{add(at + ' + ' + cel.quote(f'/{required_key}'), '{' + cel.quote(terms_key) + ': ' + first_term + '}')}]))")
    into_preferred = f"size(Q) == 0 ? [] : {append('t.spec.affinity.nodeAffinity', at, affinity.PREFERRED[2], 'Q')}"
    nothing = "size(F) == 0 && size(Q) == 0"
    ops = (f"!({has_affinity}) ? ({nothing} ? [] : [{add('t.at + ' + cel.quote('/affinity'), '{' + cel.quote('nodeAffinity') + ': ' + fresh + '}')}]) : "
           f"(!({has_node}) ? ({nothing} ? [] : [{add(at, fresh)}]) : ({into_required}) + ({into_preferred}))")
    selector = cel.sub_map("t.spec", "nodeSelector")
    return f"[{selector}].map(S, [{terms}].map(T, [{first}].map(F, [{prefs}].map(Q, {ops})[0])[0])[0])[0]"


# -- spreadReplicas, trainingLocality

def _pod_term(kind: tuple[str, str], required: bool, weight: int, topology_key: str, selector: str) -> str:
    """``affinity.add_pod_term`` with the CEL map ``selector`` (none when it is empty): the term,
    unless one of the same selector (matchLabels only) and topology key is there, required or
    preferred."""
    section, lists = kind[1], ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution")
    base = cel.sub_map(cel.sub_map("t.spec", "affinity"), section)
    existing = (f"({cel.sub_list(base, lists[0])}.filter(x, type(x) == map) + "
                f"{cel.sub_list(base, lists[1])}.filter(x, type(x) == map && has(x.podAffinityTerm) && type(x.podAffinityTerm) == map)"
                ".map(x, x.podAffinityTerm))")
    same = (f"{existing}.exists(x, has(x.topologyKey) && x.topologyKey == {cel.quote(topology_key)} && "
            "has(x.labelSelector) && type(x.labelSelector) == map && "
            f"{cel.sub_map('x.labelSelector', 'matchLabels')} == L && {cel.sub_list('x.labelSelector', 'matchExpressions')}.size() == 0)")
    term = f"{{'labelSelector': dyn({{'matchLabels': L}}), 'topologyKey': dyn({cel.quote(topology_key)})}}"
    item = term if required else f"{{'weight': dyn({weight}), 'podAffinityTerm': dyn({term})}}"
    key = lists[0] if required else lists[1]
    has_affinity = "has(t.spec.affinity) && type(t.spec.affinity) == map"
    node = f"t.spec.affinity.{section}"
    at = f"t.at + '/affinity/{section}'"
    ops = (f"!({has_affinity}) ? [{add('t.at + ' + cel.quote('/affinity'), '{' + cel.quote(section) + ': {' + cel.quote(key) + ': [' + item + ']}}')}] : "
           f"(!(has({node}) && type({node}) == map) ? [{add(at, '{' + cel.quote(key) + ': [' + item + ']}')}] : "
           f"{append(node, at, key, '[' + item + ']')})")
    return f"[{selector}].map(L, size(L) == 0 || {same} ? [] : {ops})[0]"


def spread_replicas(cfg: SpreadReplicasRule) -> str:
    """``spread_replicas.run``: anti-affinity on the workload's own selector (a template at
    /spec/template: the object's ``spec.selector`` of matchLabels only), else on the pod's labels
    but those that differ between replicas."""
    own = cel.sub_map(cel.sub_map("object", "spec"), "selector")
    by_selector = f"{cel.sub_map(own, 'matchLabels')}.transformMap(k, v, string(v))"
    by_labels = f"{cel.sub_map('t.meta', 'labels')}.transformMap(k, v, !(k in {cel.strings(cfg.ignoreLabels)}), string(v))"
    use_own = f"t.at == '/spec/template/spec' && size({own}) > 0 && {cel.sub_list(own, 'matchExpressions')}.size() == 0"
    selector = f"({use_own} ? {by_selector} : {by_labels})"
    return _pod_term(("affinity", "podAntiAffinity"), cfg.type == "required", cfg.weight, cfg.topologyKey, selector)


def training_locality(cfg: TrainingLocalityRule) -> str:
    """``training_locality.run``: affinity on the job-identity label of the pod (or, in a template,
    the object's name for the kinds whose operator sets it)."""
    labels = cel.sub_map("t.meta", "labels")
    selector = "{}"
    for identity in reversed(cfg.jobIdentities):  # named by the request's kind (not a pod, the object named)
        selector = cel.when(f"request.kind.kind in {cel.strings(identity.kinds)}",
                            f"{{{cel.quote(identity.label)}: request.name}}", selector)
    selector = cel.when("t.at == '/spec' || request.name == ''", "{}", selector)
    for identity in reversed(cfg.jobIdentities):  # the pod's own label first
        label = cel.quote(identity.label)
        selector = cel.when(f"{label} in {labels}", f"{{{label}: string({labels}[{label}])}}", selector)
    return _pod_term(("affinity", "podAffinity"), cfg.type == "required", cfg.weight, cfg.topologyKey, selector)
