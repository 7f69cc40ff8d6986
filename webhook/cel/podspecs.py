"""The pod specs of an admitted object, in CEL: where they are, their containers and the GPUs
those ask for, their workload class, and how messages name them.

What ``webhook.kube.workload.pod_targets``, ``webhook.gpu.resources`` and
``webhook.policy.match.Classifier`` work out in Python, as CEL records the
compiled rules read (variables of the compiled policies):

- a **target** is ``{'spec', 'meta', 'where', 'at', 'cs', 'gpu', 'class'}``: the pod spec, its
  metadata (``{}`` for a bare pod spec), how messages place it (``' spec.template'``, ``''`` for
  a Pod), its JSON pointer, its containers, whether it asks for a GPU (any policy's), and its
  workload class;
- a **container** is ``{'c', 'list', 'i', 'lim', 'req', 'names', 'gpus'}``: the container,
  its list and index (``container_label`` makes ``container "x"`` of them), its limits and requests (maps),
  the resource names of both, and the GPU names it holds (more than zero of).
"""

from __future__ import annotations

import re

from collections.abc import Sequence

from webhook.cel import syntax as cel
from webhook.gpu import resources
from webhook.kube import quantity
from webhook.kube.patch import pointer
from webhook.kube.workload import KindPaths, field_path, split_pointer
from webhook.policy import schema


def kind_key(group: str, kind: str) -> str:
    """How the compiled policies name a kind: ``request.kind.group + '/' + request.kind.kind``."""
    return f"{group}/{kind}"


REQUEST_KIND = "request.kind.group + '/' + request.kind.kind"


def starred(kinds: Sequence[KindPaths]) -> list[KindPaths]:
    """The kinds with a ``*`` in a pod-spec path (``raw_targets`` reads the others directly)."""
    return [k for k in kinds if any("*" in p for p in (*k.template_patterns, *k.pod_spec_patterns))]


def patterns(kinds: Sequence[KindPaths]) -> str:
    """Where each kind keeps its pod specs, as CEL data: kind → a list of patterns, each a map of
    strings ``{'pre', 'star', 'post', 'tpl', 'pod', 'where', 'whereTail', 'at', 'atTail'}``: a path
    is the keys of ``pre``, then ``*`` when ``star`` is "1", then the keys of ``post`` (keys joined
    by "/"); a template (``tpl``) holds ``spec`` and ``metadata``; ``where`` and ``at`` are its
    message prefix and JSON pointer, or their parts around the ``*``."""
    table = {}
    for paths in kinds:
        found = [_pattern(split_pointer(p), template=True) for p in paths.templates]
        found += [_pattern(split_pointer(p), template=False) for p in paths.pod_specs]
        table[kind_key(paths.group, paths.kind)] = found
    return cel.literal(table)


def _pattern(path: tuple[str, ...], template: bool) -> dict[str, str]:
    star = "*" in path
    pre = path[: path.index("*")] if star else path
    post = path[path.index("*") + 1:] if star else ()
    tail = ("spec",) if template else ()
    flags = {"star": "1" if star else "", "tpl": "1" if template else "", "pod": "1" if path == ("spec",) else ""}
    if star:
        where_tail = field_path(post)
        return {"pre": "/".join(pre), "post": "/".join(post), **flags, "where": " " + field_path(pre),
                "whereTail": f".{where_tail}" if where_tail else "", "at": pointer(pre), "atTail": pointer((*post, *tail))}
    where = "" if path == ("spec",) else field_path(path)
    return {"pre": "/".join(pre), "post": "", **flags, "where": f" {where}" if where else "", "whereTail": "",
            "at": pointer((*pre, *tail)), "atTail": ""}


def _depths(kinds: Sequence[KindPaths]) -> tuple[int, int]:
    """The most keys a walk takes before the ``*`` and after it (``spec`` or ``metadata`` included)."""
    pre, post = [1], [1]
    for paths in kinds:
        for pattern in (*paths.template_patterns, *paths.pod_spec_patterns):
            star = pattern.index("*") if "*" in pattern else len(pattern)
            pre.append(star)
            post.append(len(pattern) - star)
    return max(pre), max(post) + 1


def _walk(value: str, keys: str, depth: int, var: str) -> str:
    """The value reached from ``value`` through the keys of the list ``keys`` (each step a map
    holding the next key), or null; unrolled ``depth`` steps, each bound once (``[x].map(v, …)[0]``
    stands for a let)."""
    expr = value
    for i in range(depth):
        expr = f"[{expr}].map({var}, size(q) > {i} ? (type({var}) == map && q[{i}] in {var} ? {var}[q[{i}]] : null) : {var})[0]"
    return f"[{keys}].map(q, {expr})[0]"


def raw_targets(root: str, kinds: Sequence[KindPaths], table: str = "variables.podSpecPaths") -> str:
    """The pod specs of ``root`` (``object``, ``oldObject`` or a comprehension variable) for the
    admitted kind, in the order ``pod_targets`` finds them: a list of ``{'spec', 'meta', 'where',
    'at'}``. Kinds whose paths hold no ``*`` (Pods, the built-in workloads) are read directly;
    the others through ``table``, ``patterns`` of them bound to a variable."""
    fixed: dict[tuple[tuple[tuple[str, ...], bool], ...], list[str]] = {}
    wild = starred(kinds)
    for paths in kinds:
        if paths not in wild:
            shape = (*((p, True) for p in paths.template_patterns), *((p, False) for p in paths.pod_spec_patterns))
            fixed.setdefault(shape, []).append(kind_key(paths.group, paths.kind))
    expr = "[]"
    if wild:
        most = max(len(k.templates) + len(k.pod_specs) for k in wild)
        per_pattern = f"{table}[{REQUEST_KIND}].map(p, {_pattern_targets(root, *_depths(wild))})"
        found = f"(({REQUEST_KIND}) in {table} ? {per_pattern} : [])"
        # a list of lists, joined by hand: Kubernetes 1.33's CEL has no flatten()
        joined = " + ".join(f"(size(L) > {i} ? L[{i}] : [])" for i in range(most))
        expr = f"[{found}].map(L, {joined})[0]"
    for shape, keys in reversed(list(fixed.items())):
        found = " + ".join(_fixed_targets(root, path, template) for path, template in shape) or "[]"
        condition = f"{REQUEST_KIND} == {cel.quote(keys[0])}" if len(keys) == 1 else f"{REQUEST_KIND} in {cel.strings(keys)}"
        expr = cel.when(condition, found, expr)
    return expr


def _fixed_targets(root: str, path: tuple[str, ...], template: bool) -> str:
    """The target of a path without ``*`` (a list of one, or none)."""
    spec_path = (*path, "spec") if template else path
    condition, spec = cel.map_at(root, spec_path)
    if template:
        meta = cel.value_at(root, [*path, "metadata"], "{}")
        meta = f"[{meta}].map(m, type(m) == map ? m : {{}})[0]"
        where = field_path(path)
    else:
        meta = cel.sub_map(root, "metadata") if path == ("spec",) else "{}"
        where = "" if path == ("spec",) else field_path(path)
    target = _target(spec, meta, cel.quote(f" {where}" if where else ""), cel.quote(pointer(spec_path)))
    return cel.when(condition, f"[{target}]", "[]")


def _target(spec: str, meta: str, where: str, at: str) -> str:
    return cel.record(spec=spec, meta=meta, where=where, at=at)


def _pattern_targets(root: str, pre_depth: int, post_depth: int) -> str:
    """The targets one pattern ``p`` finds below ``root``."""
    pre = "(p.pre == '' ? [] : p.pre.split('/'))"
    post = "(p.post == '' ? [] : p.post.split('/'))"
    node = _walk(root, pre, pre_depth, "w")
    # where the pattern's * leads: {'n': the value, 'w': its part of the message prefix, 'a': of the pointer}
    # (a map's keys in order: the JSON kube-apiserver sends has them sorted; CEL iterates a map at random)
    sorted_keys = "[N.map(k, k)].map(K, K.transformList(i, x, K.filter(k, K.filter(j, j < k).size() == i)[0]))[0]"
    by_key = cel.record(n="N[k]", w="'.' + k", a="'/' + k.replace('~', '~0').replace('/', '~1')")
    by_index = cel.record(n="N[k]", w="'[' + string(k) + ']'", a="'/' + string(k)")
    starred = (f"type(N) == map ? {sorted_keys}.map(k, {by_key}) : "
               f"(type(N) == list ? N.transformList(k, x, {by_index}) : [])")
    children = f"[{node}].map(N, p.star != '1' ? [{cel.record(n='N', w=chr(39) * 2, a=chr(39) * 2)}] : ({starred}))[0]"
    spec = _walk("e.n", f"(p.tpl == '1' ? {post} + ['spec'] : {post})", post_depth, "w")
    meta = _walk("e.n", f"{post} + ['metadata']", post_depth, "w")
    meta = (f"(p.tpl == '1' ? [{meta}].map(m, type(m) == map ? m : {{}})[0] : "
            f"(p.pod == '1' && has({root}.metadata) && type({root}.metadata) == map ? {root}.metadata : {{}}))")
    target = _target("s", meta, "p.where + e.w + p.whereTail", "p.at + e.a + p.atTail")
    # each child's target (a list of one or none), kept by hand: no flatten() in Kubernetes 1.33's CEL
    return f"{children}.map(e, [{spec}].map(s, type(s) == map ? [{target}] : [])[0]).filter(l, size(l) > 0).map(l, l[0])"


def containers(spec: str, any_gpu: Sequence[str]) -> str:
    """Init containers then containers (maps only), as records: ``resources.containers`` in CEL,
    each with its limits and requests, their resource names and the GPUs it holds (by ``any_gpu``)."""
    parts = []
    for list_name in resources.CONTAINER_LISTS:
        names = "l.map(n, n).filter(n, type(n) == string) + r.map(n, n).filter(n, type(n) == string && !(n in l))"
        gpus = f"N.filter(n, {cel.matcher('n', any_gpu)} && {held('n')})"
        record = cel.record(c="c", list=cel.quote(list_name), i="i", lim="l", req="r", names="N", gpus=gpus)
        # (each of the container's maps read once: [x].map(v, …)[0] binds v to x)
        built = f"[{resource_map('c', 'limits')}].map(l, [{resource_map('c', 'requests')}].map(r, [{names}].map(N, {record})[0])[0])[0]"
        parts.append(f"{cel.sub_list(spec, list_name)}.transformList(i, c, type(c) == map, {built})")
    return " + ".join(parts)


def is_sidecar(record: str) -> str:
    """``resources.is_sidecar`` of a container record's container (ask it of init containers only)."""
    return f"(has({record}.c.restartPolicy) && {record}.c.restartPolicy == 'Always')"


def container_label(record: str) -> str:
    """A container record's label for messages, ``container "c"`` (``init container "c"`` of the init
    containers; ``#<index>`` for a container without a name): worked out where a message needs it,
    not for every container of every pod spec each policy reads."""
    name = f"(has({record}.c.name) && type({record}.c.name) == string ? {record}.c.name : '#' + string({record}.i))"
    return f"({record}.list == 'initContainers' ? 'init container \"' : 'container \"') + {name} + '\"'"


def resource_map(container: str, field: str) -> str:
    """``resources.resource_map``: ``resources.<field>`` of a container when both are maps, else ``{}``."""
    condition, value = cel.map_at(container, ["resources", field])
    return cel.when(condition, value, "{}")


def held(n: str, limits: str = "l", requests: str = "r") -> str:
    """``resources.held``: not every quantity given for the name is zero (a null one counts as zero)."""
    zero = [f"(!({n} in {m}) || {is_zero(f'{m}[{n}]')})" for m in (limits, requests)]
    return f"!({cel.every(*zero)})"


def is_zero(value: str) -> str:
    """``resources.is_zero``: null, or a quantity of zero (what does not parse is not zero)."""
    return cel.some(
        f"type({value}) == null_type",
        f"type({value}) == string && isQuantity({value}) && quantity({value}).compareTo(quantity('0')) == 0",
        f"type({value}) == int && {value} == 0",
        f"type({value}) == double && {value} == 0.0",
    )


def is_windows(spec: str) -> str:
    """``workload.is_windows``: ``os.name: windows``, or a nodeSelector on ``kubernetes.io/os: windows``."""
    os_name = cel.value_at(spec, ["os", "name"], "''")
    selected = cel.value_at(spec, ["nodeSelector", "kubernetes.io/os"], "''")
    return cel.some(f"{os_name} == 'windows'", f"{selected} == 'windows'")


#: kube-apiserver's generated names: the generateName prefix (its first 58 characters) and five of these
GENERATED_SUFFIX = "^[bcdfghjklmnpqrstvwxz2456789]{5}$"
GENERATED_BASE = 58


def generated_name(name: str, generated: str) -> str:
    """A CREATE's ``name`` (a CEL string) is one kube-apiserver made from ``generated``, its
    generateName (what the mutating webhooks saw in its place). A name given with a generateName
    that looks just like one made from it is taken as made (documented in docs/compiled-policies.md)."""
    base = f"({generated}.size() > {GENERATED_BASE} ? {generated}.substring(0, {GENERATED_BASE}) : {generated})"
    made = (f"{name}.size() == b.size() + 5 && {name}.startsWith(b) && "
            f"{name}.substring(b.size()).matches({cel.quote(GENERATED_SUFFIX)})")
    return f"(request.operation == 'CREATE' && {generated} != '' && [{base}].map(b, {made})[0])"


def subject(before_name: bool = False) -> str:
    """``Request.subject``: ``Pod ml/trainer`` (the name as ``display_name`` finds it); with
    ``before_name``, as the mutating webhook saw it: ``Pod ml/trainer-*`` for a name kube-apiserver
    generated after it (``generated_name``)."""
    name = cel.value_at("object", ["metadata", "name"], "''")
    generated = cel.value_at("object", ["metadata", "generateName"], "''")
    display = (f"request.name != '' ? request.name : ({name} != '' ? string({name}) : "
               f"({generated} != '' ? string({generated}) + '*' : '(unnamed)'))")
    if before_name:
        display = f"{generated_name(f'string({name})', f'string({generated})')} ? string({generated}) + '*' : ({display})"
    return f"request.kind.kind + ' ' + (request.namespace != '' ? request.namespace + '/' : '') + ({display})"


def namespace_labels() -> str:
    """The namespace's labels (kube-apiserver sets the name label on every namespace)."""
    return ("namespaceObject != null && has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : "
            "{'kubernetes.io/metadata.name': request.namespace}")


def workload_class(entries: Sequence[tuple[schema.ClassMatch, str]], meta: str, ns_labels: str) -> str:
    """``Classifier.classify``: the class of the first entry that matches the pod spec's metadata, "" if none.
    The labels, annotations and owner kinds are read once (bound to comprehension variables) and not
    again by every entry that looks at them."""
    reads = {
        "wcLabels": cel.sub_map(meta, "labels"),
        "wcAnnotations": cel.sub_map(meta, "annotations"),
        "wcOwners": f"{cel.sub_list(meta, 'ownerReferences')}.filter(r, type(r) == map && has(r.kind)).map(r, string(r.kind))",
    }
    expr = "''"
    for entry, name in reversed(entries):
        expr = cel.when(_entry(entry, "wcLabels", "wcAnnotations", "wcOwners", ns_labels), cel.quote(name), expr)
    for var, value in reversed(reads.items()):
        if re.search(rf"\b{var}\b", expr):
            expr = f"[{value}].map({var}, {expr})[0]"
    return expr


def _entry(m: schema.ClassMatch, labels: str, annotations: str, owners: str, ns_labels: str) -> str:
    conditions = []
    if m.ownerKinds:
        conditions.append(f"{owners}.exists(o, o in {cel.strings(m.ownerKinds)})")
    if m.workloadKinds:
        conditions.append(f"request.kind.kind in {cel.strings(m.workloadKinds)}")
    if m.labels is not None:
        conditions.append(cel.selector(labels, m.labels))
    for key, value in m.annotations.items():
        present = f"{cel.quote(key)} in {annotations}"
        conditions.append(present if value == "*" else f"{present} && string({annotations}[{cel.quote(key)}]) == {cel.quote(value)}")
    conditions.append(cel.globs("request.namespace", m.namespaces))
    conditions.append(cel.selector(ns_labels, m.namespaceSelector))
    return cel.every(*conditions)


def targets(raw: str, any_gpu: Sequence[str], classes: str | None, every: str = "false") -> str:
    """The records of ``raw`` targets (a list expression) the compiled rules read: pod specs that
    name no DRA claims (the webhook judges those: which claims hand out GPUs is cluster state) and
    give no GPU a quantity outside ``quantity.PLAIN`` (the webhook judges those too), or all of
    them where ``every`` (a CEL condition) holds, with their containers, whether any asks for a
    GPU, and their workload class (when a policy reads it: ``classes`` is ``workload_class`` of
    ``t.meta``)."""
    full = cel.record(spec="t.spec", meta="t.meta", where="t.where", at="t.at", cs="cs",
                      gpu="cs.exists(c, size(c.gpus) > 0)", **{"class": classes or "''"})
    edge = "c.gpus.exists(n, " + " || ".join(_edge(m, "n") for m in ("c.lim", "c.req")) + ")"
    keep = "" if every == "false" else f"{every} || "
    return (f"({raw}).transformList(k, t, {keep}!('resourceClaims' in t.spec), [{containers('t.spec', any_gpu)}].map(cs, {full})[0])"
            f".filter(t, {keep}!t.cs.exists(c, {edge}))")


def _edge(values: str, n: str) -> str:
    """``quantity.is_edge`` of ``values[n]``: a valid quantity CEL cannot judge exactly (``offload.left_to_webhook``),
    or a double it cannot judge as the webhook does (every edge here is one there: the webhook judges it)."""
    value = f"{values}[{n}]"
    return (f"({n} in {values} && ((type({value}) == string && !{value}.matches({cel.quote('^(' + quantity.PLAIN + ')$')}) && "
            f"isQuantity({value})) || (type({value}) == double && !{_judged_double(value)})))")


def _judged_double(value: str) -> str:
    """Whether the double ``value`` is one CEL judges as the webhook does (``quantity.is_edge``: zero, or of
    magnitude from 10^-40 below 2^63; an int is an int64, always judged)."""
    return (f"({value} == 0.0 || ({value} >= 1e-40 && {value} < 9223372036854775808.0) || "
            f"({value} <= -1e-40 && {value} > -9223372036854775808.0))")
