"""The manifest loader answers as PyYAML's C safe loader does: value for value, error for error.

Differential: the corpus and generated YAML (tags, anchors and aliases,
merge keys, YAML 1.1 booleans, octals, sexagesimals, timestamps, .inf/.nan,
null forms, duplicate keys, several documents, broken text) go through
``yaml.CSafeLoader`` and :class:`ManifestLoader`, and what each gives back
(the values, with their types and which objects are shared, then the
exception) must be the same. Then :func:`inputs.parse`, which reads a file in
one pass when it can, must give what parsing each document alone with the C
loader gives, Problems included.
"""

from __future__ import annotations

import datetime
import itertools
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.audit import inputs
from webhook.audit.yamlload import ManifestLoader

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
C_LOADER: Any = yaml.CSafeLoader

_TOKENS = [
    "yes", "Yes", "YES", "no", "No", "on", "On", "OFF", "off", "y", "n", "true", "False", "TRUE",
    "~", "null", "Null", "NULL", "", "''", '""', "0", "-0", "+12", "0755", "0o755", "0x1F", "-0x1f", "0b101",
    "1_000", "1:20", "190:20:30", "-1:30", "1e3", "1.0e+3", "1.5", "-.5", "1_0.2_5", ".inf", "-.Inf", "+.INF",
    ".NaN", ".nan", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2002-12-14 21:59:43.10 -5", "2001-12-15T02:59:43Z",
    "2001-02-30", "=", "<<", "'quoted: x'", '"double \\t"', '"8"', "plain text", "nvidia.com/gpu", "32Gi", "v1",
    "1.2.3", "0.", "._", "12:60", "0_", "0b", "0x", "1e", "Infinity", "NaN",
]  # fmt: skip
# mostly none: each tag fits few values, and a document with one error tells no more than its first
_ANCHORS = ["&a "] * 4 + ["&b "] * 4
_SCALAR_PROPERTIES = [""] * 50 + _ANCHORS + ["!!str ", "!!int ", "!!float ", "!!bool ", "!!null ", "!!binary ",
                                             "!!timestamp ", "!!map ", "!custom ", "!!python/tuple "]
_COLLECTION_PROPERTIES = [""] * 30 + _ANCHORS + ["!!map ", "!!seq ", "!!set ", "!!omap ", "!!pairs ", "!!str ", "!custom "]
_KEYS = ["a", "b", "c", "a", "b", "1", "01", "1.0", "true", "yes", "~", "null", "<<", "=", "'<<'", "2001-12-14"] * 4 + [
    "[x, y]", "{k: v}"]


def _canon(value: Any, seen: dict[int, int]) -> Any:
    """Comparable form of a loaded value: types kept (1 != 1.0 != True), NaN equal to itself, sharing shown."""
    if isinstance(value, (dict, list, set, tuple)):
        if id(value) in seen:
            return ("shared", seen[id(value)])
        seen[id(value)] = len(seen)
        if isinstance(value, dict):
            return ("dict", [(_canon(k, seen), _canon(v, seen)) for k, v in value.items()])
        if isinstance(value, set):
            return ("set", sorted(repr(_canon(v, seen)) for v in value))
        return (type(value).__name__, [_canon(v, seen) for v in value])
    if isinstance(value, (float, datetime.date)):
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def _load(text: str, loader: Any) -> tuple[list[Any], tuple[str, str] | None]:
    """Every document's value up to the first error, and that error (its type and message)."""
    values: list[Any] = []
    parser = loader(text)
    try:
        while parser.check_data():
            values.append(_canon(parser.get_data(), {}))
    except Exception as exc:  # noqa: BLE001 - which exception, and its text, is what is compared
        return values, (type(exc).__name__, str(exc))
    finally:
        parser.dispose()
    return values, None


def _assert_same(text: str) -> None:
    assert _load(text, ManifestLoader) == _load(text, C_LOADER), text


def test_every_corpus_file_loads_as_with_the_c_loader() -> None:
    files = sorted(CORPUS.rglob("*.yaml")) + sorted(CORPUS.rglob("*.yml")) + sorted(CORPUS.rglob("*.json"))
    assert len(files) > 50
    for path in files:
        _assert_same(path.read_text(encoding="utf-8"))


def test_what_the_one_pass_build_leaves_to_the_safe_constructor() -> None:
    cases = [
        "base: &b {cpu: 1, memory: 2Gi}\nlimits: {<<: *b, cpu: 2}\n",  # merge key
        "a: &x [1, 2]\nb: *x\n",  # shared list
        "&r [*r]\n",  # recursive list
        "&m {self: *m}\n",  # recursive mapping
        "? [a, b]\n: 1\n",  # unhashable key: an error
        "? {a: 1}\n: 1\n",
        "!!set {a, b}\n",
        "!!omap [a: 1, b: 2]\n",
        "!!pairs [a: 1, a: 2]\n",
        "=: x\n",  # the value key reads as a string
        "k: =\n",  # a value tag the safe constructor refuses
        "!!python/tuple [1]\n",
        "!custom x\n",
        "!!int abc\n",
        "!!binary 'not base64!'\n",
        "a: !!map [1]\n",
        "a: 1\na: 2\n1: x\ntrue: y\n1.0: z\n",  # duplicate keys: the last value, the first key
        "a: 1\n---\nb: *undefined\n---\nc: 3\n",
        "- .nan\n- .inf\n- -0.0\n- 2001-12-14t21:59:43.10-05:00\n- 0o755\n- 0755\n- 1:20\n- yes\n- ~\n",
    ]
    for text in cases:
        _assert_same(text)
    # what a shared anchor gives is one object, as with the safe constructor
    data = yaml.load("a: &x {k: v}\nb: *x\n", Loader=ManifestLoader)
    assert data["a"] is data["b"]


def _flow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    props = st.sampled_from(_COLLECTION_PROPERTIES)
    items = st.lists(children, max_size=4)
    pairs = st.lists(st.tuples(st.sampled_from(_KEYS), children), max_size=4)
    return st.one_of(
        st.builds(lambda p, xs: p + "[" + ", ".join(xs) + "]", props, items),
        st.builds(lambda p, kv: p + "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}", props, pairs),
    )


_LEAF = st.builds(lambda p, t: t if t.startswith("*") else p + t, st.sampled_from(_SCALAR_PROPERTIES), st.sampled_from(_TOKENS + ["*a", "*b"] * 6))
_NODE = st.recursive(_LEAF, _flow, max_leaves=12)


@st.composite
def _block(draw: st.DrawFn, indent: int = 0) -> str:
    """A block mapping or sequence whose values are flow nodes or, nested, blocks."""
    pad = " " * indent
    if draw(st.booleans()):
        return "".join(f"{pad}- {draw(_NODE)}\n" for _ in range(draw(st.integers(1, 3))))
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(_KEYS))
        if indent < 4 and draw(st.booleans()):
            lines.append(f"{pad}{key}:{draw(st.sampled_from(['', ' &a', ' &b', ' !!map']))}\n{draw(_block(indent + 2))}")
        elif key == "<<" and draw(st.booleans()):
            lines.append(f"{pad}<<: {draw(st.sampled_from(['*a', '*b', '[*a, *b]', '{m: 1}']))}\n")
        else:
            lines.append(f"{pad}{key}: {draw(_NODE)}\n")
    return "".join(lines)


_SHARED = st.builds(lambda node, block: f"shared: &c {node}\nagain: *c\n{block}", _NODE, _block())
_DOCUMENT = st.one_of(_block(), _SHARED, _NODE.map(lambda n: n + "\n"), st.just("# only a comment\n"), st.just(""))
_SEPARATORS = st.sampled_from(["---\n", "--- \n", "...\n---\n", "--- # comment\n", "%YAML 1.1\n---\n", "\n"])


@st.composite
def _stream(draw: st.DrawFn) -> str:
    documents = draw(st.lists(_DOCUMENT, min_size=1, max_size=4))
    text = documents[0]
    for document in documents[1:]:
        text += draw(_SEPARATORS) + document
    return _number_anchors(text)


def _number_anchors(text: str) -> str:
    """Each anchor a name of its own (libyaml refuses a name twice in a document); an alias names the last one."""
    numbers = itertools.count(1)
    last = {"a": 0, "b": 0, "c": 0}

    def name(match: re.Match[str]) -> str:
        sigil, letter = match.group(1), match.group(2)
        if sigil == "&":
            last[letter] = next(numbers)
        return f"{sigil}{letter}{last[letter]}"

    return re.sub(r"([&*])([abc])\b", name, text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_stream())
def test_generated_yaml_loads_as_with_the_c_loader(text: str) -> None:
    _assert_same(text)


# inputs.parse: one pass over the file when it can, each document alone when it must


_K8S = [
    "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec: {containers: [{name: c, image: x}]}\n",
    "# Source: chart/templates/x.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n",
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ .Values.name }}\n",  # a template left-over
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n",  # broken
    "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- 3\n",
    "replicaCount: 1\n", "- a\n", "hello\n", "~\n", "# only a comment\n", "\n", "", "...\n",
    "apiVersion: v1\nkind: ConfigMap\ndata:\n  script: |\n    ---\n    echo hi\n",
    "apiVersion: v1\nkind: ConfigMap\ndata: {a: *nope}\n",
    "--- |\n  text\n", "!!null\n", "apiVersion: v1\r\nkind: Pod\r\n", "apiVersion: v1\rkind: Pod\r", "apiVersion: v1\x85kind: Pod\x85",
    "base: &b {x: 1}\napiVersion: v1\nkind: Pod\nspec: {<<: *b}\n", "a: 'unterminated\n",
    "apiVersion: v1\nkind: Deployment\nspec: {replicas: !!int two}\n", "a: !!bool maybe\n",
    "\ufeffapiVersion: v1\nkind: Pod\n", "--- {apiVersion: v1, kind: Pod}\n", "apiVersion: v1\nkind: Pod\n...\n",
]  # fmt: skip


def _reference(source: inputs.SourceFile, text: str) -> list[inputs.Document | inputs.Problem]:
    """Each document parsed alone by the C loader: how the audit read YAML before it read files in one pass
    (a CR alone and NEL are line breaks to YAML, as LF is: where one starts a line with ---, a document ends)."""
    text = text.replace("\r\n", "\0").replace("\r", "\n").replace("\x85", "\n").replace("\0", "\r\n")
    items: list[inputs.Document | inputs.Problem] = []
    for chunk in inputs.split_documents(text):
        try:
            values = list(yaml.load_all(text[chunk.begin : chunk.end], Loader=C_LOADER))
        except (ValueError, KeyError) as exc:  # the safe constructor's own, on a value its tag does not fit
            message = f"invalid YAML: a value that its tag does not fit ({type(exc).__name__}: {exc})"
            items.append(inputs.Problem(source.path, chunk.number, chunk.line, message, source.relative))
            continue
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            where = "" if mark is None else f" at line {chunk.first + mark.line}"
            items.append(inputs.Problem(source.path, chunk.number, chunk.line, f"invalid YAML{where}: {problem}", source.relative))
            continue
        for value in values:
            items.extend(inputs._objects(source.path, source.relative, chunk.number, chunk.line, value))
    return items


def _comparable(items: list[inputs.Document | inputs.Problem]) -> list[Any]:
    return [
        (type(i).__name__, i.index, i.line, _canon(i.obj, {}), i.item) if isinstance(i, inputs.Document)
        else (type(i).__name__, i.index, i.line, i.message)
        for i in items
    ]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(_K8S), min_size=1, max_size=6),
    st.lists(st.sampled_from(["---\n", "--- \n", "---\n# c\n", "...\n---\n"]), min_size=6, max_size=6),
)
def test_a_file_read_in_one_pass_gives_what_each_document_alone_gives(documents: list[str], separators: list[str]) -> None:
    text = documents[0] + "".join(s + d for s, d in zip(separators, documents[1:]))
    source = inputs.SourceFile("f.yaml", "f.yaml")
    assert _comparable(list(inputs.parse(source, text))) == _comparable(_reference(source, text)), text


def test_a_value_that_its_tag_does_not_fit_is_a_problem_of_its_document() -> None:
    text = "apiVersion: v1\nkind: Pod\nspec: {priority: !!int high}\n---\napiVersion: v1\nkind: Pod\n"
    problem, document = inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), text)
    assert isinstance(problem, inputs.Problem) and (problem.index, problem.line) == (1, 1)
    assert problem.message == "invalid YAML: a value that its tag does not fit (ValueError: invalid literal for int() with base 10: 'high')"
    assert isinstance(document, inputs.Document) and document.index == 2


def test_the_corpus_reads_as_each_document_alone_gives() -> None:
    for path in sorted((CORPUS / "manifests").rglob("*.y*ml")):
        source = inputs.SourceFile(str(path), path.name)
        text = path.read_text(encoding="utf-8")
        assert _comparable(list(inputs.parse(source, text))) == _comparable(_reference(source, text)), path


def test_a_file_without_broken_documents_is_read_by_one_parser() -> None:
    """The one-pass path is the one taken (the comparisons above would pass if every file went one by one)."""
    valid = "# Source: a.yaml\n" + _K8S[0] + "---\n# empty\n---\n" + _K8S[1] + "---\n" + _K8S[4]
    parsed = inputs._whole_stream(valid, inputs.split_documents(valid))
    assert parsed is not None and [(chunk.number, chunk.line) for chunk, _ in parsed] == [(1, 2), (2, 10), (3, 15)]
    for odd in (valid + "---\n" + _K8S[3], "%YAML 1.1\n---\n" + valid, valid.replace("\n", "\r")):
        assert inputs._whole_stream(odd, inputs.split_documents(odd)) is None


def _laughs(levels: int) -> str:
    """A pod whose labels hold nine aliases of nine aliases … of nine strings: 9**levels nodes expanded."""
    lines = ['    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"    l{n}: &l{n} [{','.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: laughs\n  labels:\n" + "\n".join(lines) + \
        "\nspec:\n  containers: [{name: c, image: x}]\n"


def test_a_document_its_aliases_expand_past_a_million_nodes_is_a_problem_at_once() -> None:
    # "billion laughs": shared by aliases it loads small, and a diff or a written manifest expanded it to
    # gigabytes (`audit --diff`: 77 s, 2.9 GB, then a crash)
    [problem] = list(inputs.parse(inputs.SourceFile("laughs.yaml", "laughs.yaml"), _laughs(8)))
    assert isinstance(problem, inputs.Problem), problem
    found = re.search(r"excessive aliasing: the document's aliases expand it to ([\d,]+) nodes", problem.message)
    assert found and int(found[1].replace(",", "")) > 9**8, problem.message  # (nine strings and a list per level)
    # control: aliases that expand to fewer nodes load as the C loader loads them
    text = _laughs(5)
    [document] = list(inputs.parse(inputs.SourceFile("few.yaml", "few.yaml"), text))
    assert isinstance(document, inputs.Document) and document.obj == yaml.load(text, Loader=yaml.CSafeLoader)


def test_a_document_nested_as_deep_as_libyaml_reads_is_loaded() -> None:
    # the one-pass build recurses past Python's limit there and leaves it to SafeConstructor; the count of
    # expanded nodes before it must not recurse either (it did: "unexpected RecursionError", exit 3)
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: d}\ndata: {a: " + "{a: " * 995 + "x" + "}" * 995 + "}\n"
    [document] = list(inputs.parse(inputs.SourceFile("deep.yaml", "deep.yaml"), text))
    assert isinstance(document, inputs.Document), document
    value = document.obj["data"]
    for _ in range(995):  # (walked, not compared: == recurses as deep)
        value = value["a"]
    assert value == {"a": "x"}


#: whole objects, and directives the way they come between documents
_OBJECTS = [_K8S[0], _K8S[1], _K8S[13], _K8S[17], "apiVersion: v1\nkind: ConfigMap\ndata:\n  k: \"a\n%d\"\n"]
_DIRECTIVES = ["---\n", "%YAML 1.1\n---\n", "...\n%YAML 1.1\n---\n", "---\n%YAML 1.1\n---\n",
               "...\n# c\n%YAML 1.1\n\n%TAG !k! tag:k8s.io,2024:\n---\n", "\n%TAG ! tag:x,2024:\n--- \n",
               "---\n# Source: empty.yaml\n---\n", "%YAML 1.1\n---\n# Source: empty.yaml\n---\n",
               "".join(f"%TAG !t{i}! tag:k8s.io,2024:\n" for i in range(17)) + "---\n"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_OBJECTS), min_size=1, max_size=5), st.lists(st.sampled_from(_DIRECTIVES), min_size=5, max_size=5),
       st.booleans(), st.sampled_from(["\n", "\r\n"]))
def test_directives_between_documents_give_what_yaml_reads_of_the_whole_file(
    documents: list[str], separators: list[str], opened: bool, line_break: str
) -> None:
    """Whatever directives come between documents (and before the first), the file's objects are
    those YAML reads of the whole text, numbered as its documents that are not empty, and no problem."""
    text = ("%YAML 1.1\n---\n" if opened else "") + documents[0] + "".join(s + d for s, d in zip(separators, documents[1:]))
    text = text.replace("\r\n", "\n").replace("\n", line_break)
    items = list(inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), text))
    assert all(isinstance(i, inputs.Document) for i in items), (text, items)
    whole = [v for v in yaml.load_all(text, Loader=C_LOADER) if v is not None]
    assert [_canon(i.obj, {}) for i in items] == [_canon(v, {}) for v in whole], text  # type: ignore[union-attr]
    assert [i.index for i in items] == list(range(1, len(documents) + 1)), text


def test_a_directive_belongs_to_the_document_after_it() -> None:
    """``%YAML 1.1`` (or ``%TAG``) before a ``---`` opens the next document, as YAML reads it (and a
    document before it ends with ``...``): no document of its own, so no problem either."""
    pod, service = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n", "apiVersion: v1\nkind: Service\nmetadata: {name: b}\n"
    text = "%YAML 1.1\n---\n" + pod + "...\n%YAML 1.1\n%TAG !k! tag:k8s.io,2024:\n# the service\n---\n" + service
    items = list(inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), text))
    assert [(type(i).__name__, i.index, i.line) for i in items] == [("Document", 1, 3), ("Document", 2, 11)]
    assert [i.obj["kind"] for i in items if isinstance(i, inputs.Document)] == ["Pod", "Service"]
    # directives closing the file, after a document: the document is read, the directives are a problem
    document, problem = inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), service + "...\n%YAML 1.1\n")
    assert isinstance(document, inputs.Document) and document.obj["kind"] == "Service"
    assert isinstance(problem, inputs.Problem) and (problem.index, problem.line) == (2, 5)
    assert problem.message == "invalid YAML at line 5: a directive with no document after it"
    # a template's stray line is no directive: its own problem, and the documents around it are read
    items = list(inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), pod + "---\n%{ if x }\n---\n" + service))
    assert [(type(i).__name__, i.index) for i in items] == [("Document", 1), ("Problem", 2), ("Document", 3)]
    # a directive closing the file without a line break; directives after a broken document open the next one
    document, problem = inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), pod + "...\n%YAML 1.1")
    assert isinstance(document, inputs.Document) and isinstance(problem, inputs.Problem) and "no document after it" in problem.message
    tagged = pod + "a: [\n%TAG !k! tag:yaml.org,2002:\n---\napiVersion: !k!str v1\nkind: Service\nmetadata: {name: b}\n"
    problem, document = inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), tagged)
    assert isinstance(problem, inputs.Problem) and problem.index == 1 and "did not find expected" in problem.message
    assert isinstance(document, inputs.Document) and document.index == 2 and document.obj["kind"] == "Service"
    # directives before an empty document are that document's: no problem, no object
    assert list(inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), pod + "...\n%YAML 1.1\n---\n# Source: x.yaml\n"))[1:] == []
    # a directive behind a byte-order mark; one at the start of a line of quoted text is none
    assert [type(i).__name__ for i in inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), "\ufeff%YAML 1.1\n---\n" + pod)] == ["Document"]
    quoted = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  k: \"a\n%d\"\n---\n" + service
    assert [i.obj["kind"] for i in inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), quoted)] == ["ConfigMap", "Service"]  # type: ignore[union-attr]
    # a broken document after a directive is still its own problem, its lines counted from the file's first
    (problem,) = [i for i in inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), "%YAML 1.1\n---\na: [\n") if isinstance(i, inputs.Problem)]
    assert (problem.index, problem.line) == (1, 3) and problem.message.startswith("invalid YAML at line")
