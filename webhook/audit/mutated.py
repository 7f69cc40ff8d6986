"""What the mutating webhook would make of the manifests: ``--diff`` and ``--write-mutated DIR``.

Both compare the object as read with the object as the patch leaves it,
each dumped as YAML the same way, so the diff shows only what the webhook
changes (not how the file was formatted).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from webhook.audit.inputs import Document, Problem
from webhook.audit.judge import Result
from webhook.errors import ManifestError

_BASE_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BASE_DUMPER):  # type: ignore[misc,valid-type]
    """Every value written out in full: no YAML anchors and aliases where a mutated object holds one
    value in several places (the engine adds one /dev/shm mount or container securityContext to
    every container), as kubectl writes a manifest. An object inside itself (a YAML input can
    build one with an alias) is still written as an anchor and an alias: in full it has no end."""

    def represent_data(self, data: Any) -> Any:
        inside = self.__dict__.setdefault("_inside", set())  # ids of the objects being written out
        key = id(data)
        self._recursive = key in inside
        if self._recursive:
            return super().represent_data(data)
        inside.add(key)
        try:
            return super().represent_data(data)
        finally:
            inside.discard(key)

    def ignore_aliases(self, data: Any) -> bool:
        if super().ignore_aliases(data):
            return True
        # the first time: kept (an anchor is written only if an alias refers to it); again: in
        # full, unless it is inside itself
        return id(data) in self.represented_objects and not self._recursive

#: one file's entries in order: a document and its result (None: not audited), or a problem
Entry = tuple[Document, Result | None] | Problem


def dump(obj: Any) -> str:
    return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False))


def diff(results: Iterable[Result]) -> str:
    """The unified diff of every object the mutating webhook would change."""
    chunks: list[str] = []
    for result in results:
        if not result.mutation.patch:
            continue
        doc = result.document
        label = f"{doc.source} document {doc.index}" + (f" items[{doc.item}]" if doc.item is not None else "")
        chunks.extend(difflib.unified_diff(
            dump(doc.obj).splitlines(keepends=True),
            dump(result.patched).splitlines(keepends=True),
            fromfile=f"{label}: {result.request.subject}",
            tofile=f"{label}: {result.request.subject} (mutated)",
        ))  # fmt: skip
    return "".join(chunks)


def check_targets(directory: Path, files: dict[str, list[Entry]]) -> None:
    """ManifestError if writing below ``directory`` would overwrite a manifest that was read (DIR is
    an input folder): the written file leaves out what could not be read (a Helm values file, a CI
    workflow), so the source would be lost."""
    sources = {Path((e[0] if isinstance(e, tuple) else e).source).resolve() for entries in files.values() for e in entries}
    for relative in files:
        target = directory / relative
        if target.resolve() in sources:
            raise ManifestError(
                f"--write-mutated {directory}: {target} is a manifest read; write the mutated manifests to "
                "another folder (nothing was written)"
            )


def write(directory: Path, files: dict[str, list[Entry]]) -> list[Path]:
    """One file per input file below ``directory``, each document mutated as it would be admitted
    (``check_targets`` first)."""
    written = []
    for relative, entries in files.items():
        target = directory / relative
        text = _render(relative, entries)
        if text is None:
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ManifestError(f"--write-mutated: cannot write {target}: {exc}") from exc
        written.append(target)
    return written


def _render(relative: str, entries: list[Entry]) -> str | None:
    """The file's text (None: a JSON file none of whose documents could be read, which holds nothing to
    write: JSON holds no comment, and the run's report names what could not be read)."""
    documents: list[Any] = []
    notes: list[str] = []
    lists: dict[int, dict[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, Problem):
            notes.append(f"# gpu-admission: {entry.text()} (left out)")
            continue
        doc, result = entry
        obj = result.patched if result is not None else doc.obj
        if doc.item is None:
            documents.append(obj)
        else:
            # items of one List document arrive in order; rebuild the List around them
            if doc.index not in lists:
                lists[doc.index] = {"apiVersion": "v1", "kind": "List", "items": []}
                documents.append(lists[doc.index])
            lists[doc.index]["items"].append(obj)
    if relative.endswith(".json") and len(documents) <= 1:
        # JSON holds no comment: an item left out is said in the run's report only
        return json.dumps(documents[0], indent=2) + "\n" if documents else None
    body = "---\n".join(dump(d) for d in documents)
    return "\n".join(notes) + ("\n" if notes else "") + body
