"""Manifests in: files, folders, stdin → Kubernetes objects with where they came from.

Each file is a stream of documents (YAML with ``---``, or one JSON value);
``List`` kinds are flattened. A document that is not valid YAML/JSON, or not
a Kubernetes object, becomes a :class:`Problem` with file, document index and
line, and the run goes on (Helm and kustomize output carry comments, empty
documents and templating left-overs).

JSON is parsed as JSON and YAML with libyaml's C loader where PyYAML has it:
the pure-Python loader is 10-20x slower.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from webhook.errors import ManifestError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
STDIN_NAME = "<stdin>"
#: the source of an object read from a live cluster: cluster:NAMESPACE
CLUSTER_PREFIX = "cluster:"

#: libyaml when PyYAML was built with it (the wheels are)
YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_SEPARATOR = re.compile(r"^---(?=[ \t\r\n]|$)", re.M)
_CONTENT = re.compile(r"^(?!---(?:[ \t]*(?:#.*)?)?$)[ \t]*[^\s#]", re.M)


@dataclass(frozen=True)
class Document:
    """One Kubernetes object read from a manifest."""

    source: str  # the file as named on the command line (or found in a folder), or <stdin>
    index: int  # 1-based document number within the file
    line: int  # 1-based line where the document's content starts (0: unknown)
    obj: dict[str, Any]
    item: int | None = None  # position in the items of a List document
    relative: str = ""  # the file's path below the folder it was found in (for --write-mutated)


@dataclass(frozen=True)
class Problem:
    """A document that could not be audited."""

    source: str
    index: int
    line: int
    message: str
    relative: str = ""  # as for Document

    def text(self) -> str:
        where = f", line {self.line}" if self.line else ""
        return f"{self.source}: document {self.index}{where}: {self.message}"


@dataclass(frozen=True)
class SourceFile:
    """A manifest file to read, and its path below the folder it was found in."""

    path: str
    relative: str


def find_files(paths: Iterable[str]) -> list[SourceFile]:
    """The files behind the command line's paths (folders recursively, sorted, dot-folders and dot-files
    skipped); ManifestError if a path is missing or a folder holds no manifest file."""
    files: list[SourceFile] = []
    for raw in paths:
        if raw == STDIN:
            files.append(SourceFile(STDIN, "stdin.yaml"))
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()
                           and not _hidden(p.relative_to(path)))  # fmt: skip
            if not found:
                raise ManifestError(f"{path}: no manifest files ({', '.join('*' + s for s in MANIFEST_SUFFIXES)}) in it")
            files.extend(SourceFile(str(p), str(p.relative_to(path))) for p in found)
        elif path.is_file():
            files.append(SourceFile(str(path), path.name))
        else:
            raise ManifestError(f"{path}: no such file or folder")
    return files


def _hidden(relative: Path) -> bool:
    """Below a folder, ``.git``, ``.github`` and other dot-folders hold no manifests (CI workflows are YAML too)."""
    return any(part.startswith(".") for part in relative.parts)


def read_text(source: SourceFile, stdin: IO[str] | None = None) -> str:
    if source.path == STDIN:
        return (stdin or sys.stdin).read()
    try:
        return Path(source.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{source.path}: cannot read: {exc}") from exc


def parse(source: SourceFile, text: str) -> Iterator[Document | Problem]:
    """Every object of one file's text, and a Problem for each document that is none."""
    name = STDIN_NAME if source.path == STDIN else source.path
    if _looks_like_json(source.path, text):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if source.path.endswith(".json"):
                yield Problem(name, 1, 1, f"invalid JSON at line {exc.lineno}: {exc.msg}", source.relative)
                return
            # not JSON after all (a YAML flow mapping, or broken): YAML says which line
        else:
            yield from _objects(name, source.relative, 1, 1, value)
            return
    for index, line, start, chunk in split_documents(text):
        try:
            values = list(yaml.load_all(chunk, Loader=YAML_LOADER))
        except yaml.YAMLError as exc:
            yield Problem(name, index, line, _yaml_error(exc, start), source.relative)
            continue
        for value in values:
            yield from _objects(name, source.relative, index, line, value)


def _looks_like_json(path: str, text: str) -> bool:
    return path.endswith(".json") or text.lstrip()[:1] in ("{", "[")


def split_documents(text: str) -> Iterator[tuple[int, int, int, str]]:
    """(document index, first content line, first line, text) of each ``---``-separated document.

    PyYAML stops at the first broken document, so each is parsed on its own;
    documents holding only comments or blank lines are left out (Helm prints
    one for every template that renders to nothing).
    """
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    starts.append(len(text))
    line = 1
    index = 0
    for begin, end in zip(starts, starts[1:]):
        chunk = text[begin:end]
        content = _CONTENT.search(chunk)
        if content is not None:
            index += 1
            yield index, line + chunk.count("\n", 0, content.start()), line, chunk
        line += chunk.count("\n")


def _objects(source: str, relative: str, index: int, line: int, value: Any) -> Iterator[Document | Problem]:
    if value is None:
        return
    if not isinstance(value, dict) or not value.get("kind") or not value.get("apiVersion"):
        yield Problem(source, index, line, "not a Kubernetes object (no apiVersion and kind)", relative)
        return
    items = value.get("items")
    if str(value["kind"]).endswith("List") and isinstance(items, list):
        item_kind = str(value["kind"])[: -len("List")]
        for position, item in enumerate(items):
            if isinstance(item, dict) and "kind" not in item and item_kind != "":
                # API list responses (PodList ...) leave kind off their items
                item = {"apiVersion": value["apiVersion"], "kind": item_kind, **item}
            if isinstance(item, dict) and item.get("kind") and item.get("apiVersion"):
                yield Document(source, index, line, item, position, relative)
            else:
                yield Problem(source, index, line, f"items[{position}] is not a Kubernetes object", relative)
        return
    yield Document(source, index, line, value, None, relative)


def _yaml_error(exc: yaml.YAMLError, chunk_line: int) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {chunk_line + mark.line}: {problem}"


def stream(
    files: Iterable[SourceFile], stdin: IO[str] | None = None, file_done: Callable[[], None] | None = None
) -> Iterator[Document | Problem]:
    """Objects and problems of every file, in order; ``file_done`` is called after each file."""
    for source in files:
        yield from parse(source, read_text(source, stdin))
        if file_done is not None:
            file_done()

