"""Policy files → a validated, immutable PolicySet (or every problem, with file and field)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pydantic
import yaml

from webhook.errors import PolicyError
from webhook.gpu import device_classes
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.gpu.resources import DEFAULT_GPU_RESOURCES, ResourceMatcher
from webhook.kube import dra
from webhook.kube.workload import BUILTIN_KINDS, KindPaths, kind_index
from webhook.policy import schema, yaml_errors
from webhook.policy.match import Classifier, kind_matches
from webhook.policy.offload import Offload

POLICY_SUFFIXES = (".yaml", ".yml")
_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(schema.Document)


@dataclass(frozen=True)
class PolicySet:
    """Everything loaded from one policy directory, ready for the engine."""

    policies: tuple[schema.GPUPolicy, ...] = ()
    classes: tuple[schema.GPUWorkloadClass, ...] = ()
    #: named objects that some rules skip (in file order; none in most policy sets)
    exceptions: tuple[schema.GPUPolicyException, ...] = ()
    kinds: dict[tuple[str, str], KindPaths] = field(default_factory=lambda: kind_index(BUILTIN_KINDS))
    fingerprint: str = ""
    #: what the engine works out once per policy set (its rule plans); not part of equality
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    #: JSON pointers of the paths the rules write, shared by the patch builders
    pointers: dict[tuple[str | int, ...], str] = field(default_factory=dict, compare=False, repr=False)
    #: the rule parts compiled policies run in kube-apiserver, which the engine leaves to them
    #: (``serve --compiled``; None: the engine runs every rule whole)
    offload: Offload | None = field(default=None, compare=False)

    @property
    def gpu_resources(self) -> tuple[str, ...]:
        """Every resource name or pattern any policy counts as a GPU."""
        extra = [r for p in self.policies for r in p.spec.gpuResources]
        return tuple(dict.fromkeys([*DEFAULT_GPU_RESOURCES, *extra]))

    @cached_property
    def any_gpu(self) -> ResourceMatcher:
        """Matches what any policy counts as a GPU (the engine's fast path)."""
        return ResourceMatcher.of(self.gpu_resources)

    @cached_property
    def matchers(self) -> dict[str, ResourceMatcher]:
        """Policy name → what that policy counts as a GPU."""
        return {
            p.metadata.name: ResourceMatcher.of([*DEFAULT_GPU_RESOURCES, *p.spec.gpuResources])
            for p in self.policies
        }

    def matcher_of(self, policy: schema.GPUPolicy) -> tuple[ResourceMatcher, bool]:
        """The policy's GPU matcher, and whether it is narrower than ``any_gpu``."""
        matcher = self.matchers[policy.metadata.name]
        return matcher, policy.metadata.name in self.narrower_matchers

    @cached_property
    def narrower_matchers(self) -> frozenset[str]:
        return frozenset(name for name, m in self.matchers.items() if m != self.any_gpu)

    @cached_property
    def device_classes(self) -> dict[str, DeviceClassInfo]:
        """DRA device class → the GPUs it hands out: NVIDIA's, plus what any policy adds."""
        return device_classes.table(e.info() for p in self.policies for e in p.spec.deviceClasses)

    @cached_property
    def class_entries(self) -> tuple[tuple[schema.ClassMatch, str], ...]:
        """Every workload-class entry with the class it assigns, in the order they are tried."""
        return tuple(
            (entry, cls.spec.workloadClass or cls.metadata.name) for cls in self.classes for entry in cls.spec.matchAny
        )

    @cached_property
    def classifier(self) -> Classifier:
        """The class entries, indexed for classifying pods."""
        return Classifier(self.class_entries)

    @cached_property
    def active_policies(self) -> tuple[schema.GPUPolicy, ...]:
        """Policies with at least one rule that is not off, in order."""
        return tuple(p for p in self.policies if p.spec.rules.active())


def offloaded(policy_set: PolicySet, found: Offload) -> PolicySet:
    """The same policies with ``found`` left to compiled policies (what the engine works out anew)."""
    return replace(policy_set, offload=found, memo={}, pointers={})


@dataclass(frozen=True)
class _Source:
    path: Path
    index: int
    data: Any


def load_directory(directory: str | os.PathLike[str]) -> PolicySet:
    """Load every policy file under ``directory`` (recursively) or raise PolicyError."""
    root = Path(directory)
    if not root.is_dir():
        raise PolicyError([f"{root}: {'not a directory' if root.exists() else 'no such directory'}"])
    files = list(policy_files(root))
    return load_files(files, base=root)


def load_enforcing(directory: str | os.PathLike[str]) -> PolicySet:
    """``load_directory``, refusing a directory without a GPUPolicy: the server would enforce nothing.

    An empty ConfigMap, or a path into it that names no policy file, would otherwise
    be served as ready while every GPU pod passes unchecked.
    """
    policy_set = load_directory(directory)
    if not policy_set.policies:
        raise PolicyError([f"{directory}: no GPUPolicy found: the server would enforce nothing"])
    return policy_set


def skipped_files(root: Path) -> list[Path]:
    """Visible files below ``root`` that are not read as policies (not .yaml/.yml): said, not silently ignored.

    A ConfigMap key written without its extension (``gpu-validations``) is such a file.
    """
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath) / n for n in sorted(filenames) if not n.startswith(".") and not n.endswith(POLICY_SUFFIXES))
    return found


def policy_files(root: Path) -> Iterator[Path]:
    """YAML files below ``root`` in a stable order.

    Hidden entries are skipped: a ConfigMap volume keeps its real files in
    ``..<timestamp>`` folders and links the visible names to them.
    """
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(POLICY_SUFFIXES) and not name.startswith("."):
                yield Path(dirpath) / name


def load_files(files: Iterable[Path], *, base: Path | None = None) -> PolicySet:
    """Load the given files; every problem is collected before raising."""
    problems: list[str] = []
    sources: list[_Source] = []
    digest = hashlib.sha256()
    for path in files:
        shown = path.relative_to(base) if base else path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{shown}: cannot read: {exc}")
            continue
        digest.update(str(shown).encode() + b"\0" + text.encode() + b"\0")
        sources.extend(_parse(text, Path(str(shown)), problems))
    documents = _validate(sources, problems)
    policy_set = _assemble(documents, problems)
    if problems:
        raise PolicyError(problems)
    return PolicySet(
        policies=policy_set.policies,
        classes=policy_set.classes,
        exceptions=policy_set.exceptions,
        kinds=policy_set.kinds,
        fingerprint=digest.hexdigest()[:16],
    )


def load_text(text: str, name: str = "<policy>") -> PolicySet:
    """Load policies from one YAML text (tests, stdin)."""
    problems: list[str] = []
    documents = _validate(list(_parse(text, Path(name), problems)), problems)
    policy_set = _assemble(documents, problems)
    if problems:
        raise PolicyError(problems)
    return policy_set


def _parse(text: str, path: Path, problems: list[str]) -> Iterator[_Source]:
    try:
        for index, data in enumerate(yaml.safe_load_all(text)):
            if data is not None:
                yield _Source(path, index, data)
    except yaml_errors.UNREADABLE as exc:
        problems.append(f"{path}: {yaml_errors.describe(exc)}")


def _validate(sources: list[_Source], problems: list[str]) -> list[tuple[_Source, Any]]:
    documents: list[tuple[_Source, Any]] = []
    for source in sources:
        where = f"{source.path}: document {source.index + 1}"
        data = source.data
        if not isinstance(data, dict):
            problems.append(f"{where}: expected a mapping with apiVersion, kind, metadata and spec")
            continue
        if data.get("apiVersion") != schema.API_VERSION:
            problems.append(f"{where}: apiVersion must be {schema.API_VERSION} (got {data.get('apiVersion')!r})")
            continue
        if data.get("kind") not in schema.DOCUMENT_KINDS:
            problems.append(f"{where}: kind must be one of {', '.join(schema.DOCUMENT_KINDS)} (got {data.get('kind')!r})")
            continue
        name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) else None
        label = f"{where} ({data['kind']} {name or '?'})"
        try:
            documents.append((source, _ADAPTER.validate_python(data)))
        except pydantic.ValidationError as exc:
            problems.extend(f"{label}: {field_path(err['loc'][1:])}: {err['msg']}" for err in exc.errors())
    return documents


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a field path: ``spec.rules.quota.limits[0].max``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


def _assemble(documents: list[tuple[_Source, Any]], problems: list[str]) -> PolicySet:
    seen: dict[tuple[str, str], _Source] = {}
    for source, doc in documents:
        key = (doc.kind, doc.metadata.name)
        if key in seen:
            first = seen[key]
            problems.append(
                f"{source.path}: document {source.index + 1}: {doc.kind} {doc.metadata.name!r} "
                f"is already defined in {first.path} document {first.index + 1}"
            )
        seen[key] = source
    policies = sorted(
        (d for _, d in documents if isinstance(d, schema.GPUPolicy)),
        key=lambda p: (p.spec.order, p.metadata.name),
    )
    classes = sorted(
        (d for _, d in documents if isinstance(d, schema.GPUWorkloadClass)),
        key=lambda c: (c.spec.order, c.metadata.name),
    )
    custom = [
        KindPaths(d.spec.group, d.spec.kind, tuple(d.spec.podTemplates), tuple(d.spec.podSpecs))
        for _, d in documents
        if isinstance(d, schema.GPUWorkloadKind)
    ]
    kinds = kind_index([*BUILTIN_KINDS, *custom])
    _check_match_kinds(documents, kinds, problems)
    _check_workload_classes(documents, {c.spec.workloadClass or c.metadata.name for c in classes}, problems)
    exceptions = [(source, d) for source, d in documents if isinstance(d, schema.GPUPolicyException)]
    _check_exceptions(exceptions, {p.metadata.name: p for p in policies}, _known_kinds(kinds), problems)
    return PolicySet(
        policies=tuple(policies),
        classes=tuple(classes),
        exceptions=tuple(d for _, d in exceptions),
        kinds=kinds,
    )


def _check_match_kinds(
    documents: list[tuple[_Source, Any]], kinds: dict[tuple[str, str], KindPaths], problems: list[str]
) -> None:
    """A ``match.kinds`` entry no known kind answers to is refused, not left to match nothing.

    A misspelt kind (``Deploymnet``) or Kyverno's ``group/version/Kind`` form would
    otherwise switch the policy off (or an exception off) for that kind without a word.
    """
    known = _known_kinds(kinds)
    for source, doc in documents:
        if not isinstance(doc, (schema.GPUPolicy, schema.GPUPolicyException)):
            continue
        for i, pattern in enumerate(doc.spec.match.kinds):
            if not _names_a_kind(pattern, known):
                problems.append(
                    f"{_where(source, doc)}: spec.match.kinds[{i}]: {pattern!r} is no kind the policies know; "
                    "write Kind or group/Kind (no version), e.g. Deployment or kubeflow.org/PyTorchJob, and "
                    "describe a custom resource in a GPUWorkloadKind"
                )


def _names_a_kind(pattern: str, known: list[tuple[str, str]]) -> bool:
    return any(kind_matches((pattern,), group, kind) for group, kind in known)


def _overlap(ours: list[str], theirs: list[str], known: list[tuple[str, str]]) -> bool:
    """Is some known kind matched by both lists of kind patterns?"""
    return any(kind_matches(ours, group, kind) and kind_matches(theirs, group, kind) for group, kind in known)


def _known_kinds(kinds: dict[tuple[str, str], KindPaths]) -> list[tuple[str, str]]:
    """(group, kind) of every kind a policy may name: those with pod specs, and DRA claims."""
    return [*kinds, *((dra.GROUP, kind) for kind in dra.CLAIM_KINDS)]


def _where(source: _Source, doc: Any) -> str:
    return f"{source.path}: document {source.index + 1} ({doc.kind} {doc.metadata.name})"


def _check_exceptions(
    exceptions: list[tuple[_Source, schema.GPUPolicyException]], policies: dict[str, schema.GPUPolicy],
    known: list[tuple[str, str]], problems: list[str],
) -> None:
    """An exception lifts rules that exist: a policy loaded here, a rule that policy has, on kinds it applies to.

    A misspelt name would otherwise lift nothing, and the object it was written for
    would stay refused with no word of why.
    """
    for source, doc in exceptions:
        kinds = doc.spec.match.kinds
        for i, entry in enumerate(doc.spec.exceptions):
            policy = policies.get(entry.policy)
            if policy is None:
                problems.append(
                    f"{_where(source, doc)}: spec.exceptions[{i}].policy: no GPUPolicy {entry.policy!r} "
                    f"(known: {', '.join(sorted(policies)) or 'none'})"
                )
                continue
            theirs = policy.spec.match.kinds
            # (a kind no policy knows is reported once, by _check_match_kinds)
            if kinds and all(_names_a_kind(k, known) for k in kinds) and not _overlap(kinds, theirs, known):
                problems.append(
                    f"{_where(source, doc)}: spec.match.kinds: GPUPolicy {entry.policy} applies to "
                    f"{', '.join(theirs)} only: this exception's kinds lift nothing of it"
                )
            has = [name for name in schema.Rules.model_fields if getattr(policy.spec.rules, name) is not None]
            for j, rule in enumerate(entry.rules):
                if rule not in has:
                    problems.append(
                        f"{_where(source, doc)}: spec.exceptions[{i}].rules[{j}]: GPUPolicy {entry.policy} has no "
                        f"rule {rule!r} (it has: {', '.join(has) or 'none'})"
                    )


def _check_workload_classes(documents: list[tuple[_Source, Any]], known: set[str], problems: list[str]) -> None:
    """A workload class no GPUWorkloadClass assigns is refused where a policy names it.

    ``priorityClass.classes: {trainng: …}`` or ``match.workloadClasses: [trainng]``
    would otherwise never fire, and nothing would say why.
    """
    for source, doc in documents:
        if not isinstance(doc, schema.GPUPolicy):
            continue
        spec = doc.spec
        named = [(f"spec.match.workloadClasses[{i}]", c) for i, c in enumerate(spec.match.workloadClasses)]
        if spec.exclude is not None:
            named += [(f"spec.exclude.workloadClasses[{i}]", c) for i, c in enumerate(spec.exclude.workloadClasses)]
        if spec.rules.priorityClass is not None:
            named += [(f"spec.rules.priorityClass.classes.{c}", c) for c in spec.rules.priorityClass.classes]
        for where, name in named:
            if name not in known:
                problems.append(
                    f"{_where(source, doc)}: {where}: no GPUWorkloadClass assigns workload class {name!r} (known: {', '.join(sorted(known)) or 'none'})"
                )
