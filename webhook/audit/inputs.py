"""Manifests in: files, folders, stdin → Kubernetes objects with where they came from.

Each file is a stream of documents (YAML with ``---``, or one JSON value);
``List`` kinds are flattened. A document that is not valid YAML/JSON, or not
a Kubernetes object, becomes a :class:`Problem` with file, document index and
line, and the run goes on (Helm and kustomize output carry comments, empty
documents and templating left-overs).

JSON is parsed as JSON and YAML with :class:`~webhook.audit.yamlload.ManifestLoader`
(libyaml's parser, PyYAML's safe loader's answers), one parser per file;
each document on its own only in a file where one is broken.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import yaml

from webhook.audit.yamlload import ManifestLoader
from webhook.errors import ManifestError
from webhook.policy import yaml_errors

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
STDIN_NAME = "<stdin>"
#: the source of an object read from a live cluster: cluster:NAMESPACE
CLUSTER_PREFIX = "cluster:"

_SEPARATOR = re.compile(r"^---(?=[ \t\r\n]|$)", re.M)
#: a line that is more than a separator (``---``, ``...``), a comment or blank (a byte-order mark aside)
_CONTENT = re.compile(r"^(?!---(?:[ \t]*(?:#.*)?)?\r?$)(?!\.\.\.[ \t]*(?:#.*)?\r?$)\ufeff?[ \t]*[^\s#\ufeff]", re.M)
#: the same, directives aside: a line of a document's own
_OWN_CONTENT = re.compile(r"^(?!---(?:[ \t]*(?:#.*)?)?\r?$)(?!\.\.\.[ \t]*(?:#.*)?\r?$)\ufeff?(?!%)[ \t]*[^\s#\ufeff]", re.M)


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
    given: list[str] = []  # the name of the path each file was found under
    for raw in paths:
        if raw == STDIN:
            files.append(SourceFile(STDIN, "stdin.yaml"))
            given.append("")
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()
                           and not _hidden(p.relative_to(path)))  # fmt: skip
            if not found:
                raise ManifestError(f"{path}: no manifest files ({', '.join('*' + s for s in MANIFEST_SUFFIXES)}) in it")
            files.extend(SourceFile(str(p), str(p.relative_to(path))) for p in found)
            given.extend(path.resolve().name for _ in found)
        elif path.is_file():
            files.append(SourceFile(str(path), path.name))
            given.append(path.resolve().parent.name)
        else:
            raise ManifestError(f"{path}: no such file or folder")
    return _distinct(files, given)


def _distinct(files: list[SourceFile], given: list[str]) -> list[SourceFile]:
    """Each file its own relative path (--write-mutated writes one file per input file): two inputs
    of the same relative path (``a/pod.yaml`` and ``b/pod.yaml``) are kept below the names of the
    folders they came from (``a/pod.yaml``, ``b/pod.yaml``), and numbered if even those agree."""
    counts = Counter(f.relative for f in files)
    if all(n == 1 for n in counts.values()):
        return files
    renamed = [SourceFile(f.path, f"{name}/{f.relative}" if counts[f.relative] > 1 and name else f.relative)
               for f, name in zip(files, given)]
    taken: set[str] = set()
    distinct = []
    for f in renamed:
        relative, n = f.relative, 1
        while relative in taken:
            n += 1
            stem, dot, suffix = f.relative.rpartition(".")
            relative = f"{stem}-{n}.{suffix}" if dot else f"{f.relative}-{n}"
        taken.add(relative)
        distinct.append(SourceFile(f.path, relative))
    return distinct


def _hidden(relative: Path) -> bool:
    """Below a folder, ``.git``, ``.github`` and other dot-folders hold no manifests (CI workflows are YAML too)."""
    return any(part.startswith(".") for part in relative.parts)


class Unreadable(ManifestError):
    """A manifest file that cannot be read as text: reported as a document that could not be audited
    (the run goes on), ``line`` where the reading stopped (0: not known)."""

    def __init__(self, reason: str, line: int = 0) -> None:
        super().__init__(reason)
        self.reason, self.line = reason, line


def read_text(source: SourceFile, stdin: IO[str] | None = None) -> str:
    """A manifest file's text as kubectl reads it: UTF-8, or UTF-16 with its byte-order mark (what
    Windows PowerShell's redirection writes); Unreadable otherwise."""
    if source.path == STDIN:
        try:
            return (stdin or sys.stdin).read()
        except UnicodeDecodeError as exc:
            raise Unreadable(f"not UTF-8 text ({exc.reason} at byte {exc.start} of a chunk)") from exc
    try:
        data = Path(source.path).read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read: {exc.strerror or exc}") from exc
    return decode(data)


def decode(data: bytes) -> str:
    """``read_text`` of a file's bytes."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise Unreadable(f"not UTF-16 text after its byte-order mark ({exc.reason} at byte {exc.start})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise Unreadable(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} (manifests are UTF-8, or UTF-16 "
                         "with a byte-order mark, as kubectl reads them)", line) from exc


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
    yield from _yaml_objects(name, source.relative, text)


def _looks_like_json(path: str, text: str) -> bool:
    return path.endswith(".json") or text.lstrip()[:1] in ("{", "[")


#: the line breaks YAML reads besides LF and CRLF: a CR alone (classic Mac OS) and NEL, each read as
#: LF is, in a scalar's value too (LS and PS, which YAML keeps in values, are left as they are)
_OTHER_BREAKS = re.compile("\r(?!\n)|\x85")


def _yaml_objects(name: str, relative: str, text: str) -> Iterator[Document | Problem]:
    if "\r" in text or "\x85" in text:  # documents are told apart, and lines counted, at "\n"
        text = _OTHER_BREAKS.sub("\n", text)
    chunks = split_documents(text)
    parsed = _whole_stream(text, chunks)
    if parsed is None:
        yield from _one_by_one(name, relative, text, chunks)
        return
    for chunk, value in parsed:
        yield from _objects(name, relative, chunk.number, chunk.line, value)


def _whole_stream(text: str, chunks: list[Chunk]) -> list[tuple[Chunk, Any]] | None:
    """Each chunk's document, from one parser over the whole text; None to parse them one by one.

    One parser is the fast way, but it stops at the first broken document and
    its documents are not always the chunks (a ``%YAML`` directive, line
    breaks other than ``\\n``): then None, and :func:`_one_by_one` reports
    each broken document and goes on past it.
    """
    if _chunks_may_differ(text):
        return None
    loader = ManifestLoader(text)
    try:
        values = []
        while loader.check_data():
            values.append(loader.get_data())
    except yaml_errors.UNREADABLE:
        return None
    finally:
        loader.dispose()
    found = [(line, value) for (line, empty), value in zip(loader.starts, values) if not empty]
    if len(found) != len(chunks):
        return None
    for (line, _), chunk in zip(found, chunks):
        if not chunk.first <= line + 1 <= chunk.last:
            return None
    return [(chunk, value) for (_, value), chunk in zip(found, chunks)]


def _chunks_may_differ(text: str) -> bool:
    """Whether libyaml may see other documents than the chunks: a directive (a %YAML or %TAG line ends
    the chunk before its ---, which alone is no document) or line breaks other than \\n and \\r\\n.

    String scans, not a regular expression: those take a tenth of the parsing time.
    """
    return (
        text.startswith("%") or "\n%" in text or text.count("\r") != text.count("\r\n")
        or "\x85" in text or "\u2028" in text or "\u2029" in text
    )  # fmt: skip


def _one_by_one(name: str, relative: str, text: str, chunks: list[Chunk]) -> Iterator[Document | Problem]:
    """Each chunk parsed alone. Directives (``%YAML 1.1``, ``%TAG``) closing a chunk that does not parse
    with them belong to the document after them, as YAML reads them (a directive at the start of a
    line ends the document before it): given to the next chunk when it follows at once (else an empty
    document follows, which takes them); a chunk of nothing else is no document (its number goes to
    the next one); such directives closing the text are a problem of their own."""
    carried, number = "", 0  # (directives given to the next chunk; the documents counted so far)
    for n, chunk in enumerate(chunks):
        piece, first = carried + text[chunk.begin : chunk.end], chunk.first - carried.count("\n")
        carried, dangling = "", 0
        values: list[Any] | None
        try:
            values = list(yaml.load_all(piece, Loader=ManifestLoader))
        except yaml_errors.UNREADABLE as exc:
            cut = _closing_directives(piece)
            if cut is None:
                number += 1
                yield Problem(name, number, chunk.line, yaml_errors.describe(exc, first), relative)
                continue
            head, tail = cut
            if n + 1 < len(chunks) and chunks[n + 1].begin == chunk.end:
                carried = tail
            elif _SEPARATOR.search(text, chunk.end) is None:  # (else an empty document, dropped, takes them)
                dangling = first + head.count("\n")
            if _OWN_CONTENT.search(head) is None:
                if dangling:
                    number += 1
                    yield Problem(name, number, dangling, _dangling(dangling), relative)
                continue
            try:
                values = list(yaml.load_all(head, Loader=ManifestLoader))
            except yaml_errors.UNREADABLE as broken:  # (the document before them is broken itself)
                number += 1
                yield Problem(name, number, chunk.line, yaml_errors.describe(broken, first), relative)
                values = None
        if values is not None:
            number += 1
            for value in values:
                yield from _objects(name, relative, number, chunk.line, value)
        if dangling:
            number += 1
            yield Problem(name, number, dangling, _dangling(dangling), relative)


def _dangling(line: int) -> str:
    return f"invalid YAML at line {line}: a directive with no document after it"


def _closing_directives(piece: str) -> tuple[str, str] | None:
    """``piece`` cut before its closing run of directive lines (with the comments and blank lines among
    them) that YAML reads as directives: (what comes before, the run); None without one. A ``%`` line
    that is no directive alone (a template's stray line, a quoted text's line) ends the run. Walked
    back line by line, each directive line and then the run parsed once: linear in the piece."""
    found, start = -1, len(piece)
    while start > 0:
        begin = piece.rfind("\n", 0, start - 1) + 1
        line = piece[begin:start]
        if line.startswith("%") or (begin == 0 and line.startswith("\ufeff%")):  # (a byte-order mark first)
            if _parsed(line.rstrip("\r\n") + "\n---\n") is None:
                break
            found = begin
        elif line.strip() and not line.lstrip().startswith("#"):
            break
        start = begin
    if found < 0 or _parsed(piece[found:].rstrip("\r\n") + "\n---\n") is None:
        return None
    return piece[:found], piece[found:]


def _parsed(text: str) -> list[Any] | None:
    try:
        return list(yaml.load_all(text, Loader=ManifestLoader))
    except yaml_errors.UNREADABLE:
        return None


class Chunk(NamedTuple):
    """One ``---``-separated document of a file's text."""

    number: int  # the document number: 1-based, counting only chunks with content
    line: int  # first content line (1-based)
    first: int  # first line (the ``---`` one, if any)
    last: int  # last line
    begin: int  # offsets in the text
    end: int


def split_documents(text: str) -> list[Chunk]:
    """The ``---``-separated documents of a text that hold more than comments and blank lines.

    Helm prints a comment-only document for every template that renders to
    nothing; those are no documents.
    """
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    starts.append(len(text))
    chunks: list[Chunk] = []
    line = 1
    for begin, end in zip(starts, starts[1:]):
        content = _CONTENT.search(text, begin, end)
        lines = text.count("\n", begin, end)
        if content is not None:
            last = line + text.count("\n", begin, end - 1)
            chunks.append(Chunk(len(chunks) + 1, line + text.count("\n", begin, content.start()), line, last, begin, end))
        line += lines
    return chunks


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


def stream(
    files: Iterable[SourceFile], stdin: IO[str] | None = None, file_done: Callable[[], None] | None = None
) -> Iterator[Document | Problem]:
    """Objects and problems of every file, in order; ``file_done`` is called after each file."""
    for source in files:
        try:
            text = read_text(source, stdin)
        except Unreadable as exc:  # (one file: the run goes on, as for a document that is no object)
            yield Problem(STDIN_NAME if source.path == STDIN else source.path, 1, exc.line, exc.reason, source.relative)
        else:
            yield from parse(source, text)
        if file_done is not None:
            file_done()

