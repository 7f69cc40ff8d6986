"""README.md and docs/*.md against the code: the commands they show, the messages and outputs they quote.

Every fenced block is one of:

- ``sh``: commands, line by line. gpu-admission's own parse as they are written (no unknown
  option, no missing argument) and run where what they name is in the repository; make
  targets exist; scripts exist and run in their read-only form; kustomizations named by
  ``kubectl apply -k`` exist; other programs (a cluster's kubectl, curl, docker, helm) are
  named in EXTERNAL and not run, though the files they read must exist;
- no language: an output or a message, which one of the checks in OUTPUTS reproduces (a
  new quoted output with no check fails ``test_every_quoted_output_is_checked``). Quoted
  messages are those the engine gives for a golden case (tests/cases/, where
  docs_examples.yaml holds the objects the docs describe);
- ``yaml``, ``json``, ``python``: parsed; policy documents load; README's answer is the server's;
- ``text``: a diagram of the code (docs/architecture.md): every module and folder of webhook/ it
  names exists.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.audit.support import GPU_POD
from tests.conftest import Webhook
from tests.support import POLICIES, REPO
from tests.test_cases import _load_cases, evaluate_case
from webhook import cli
from webhook.audit.suite.schema import GPUAdmissionTest
from webhook.policy import loader

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: programs the docs show that act on a cluster, a registry or an image: not run here
EXTERNAL = {"kubectl", "curl", "docker", "helm", "cat"}
GPU_ADMISSION = {"gpu-admission", ".venv/bin/gpu-admission"}


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(str(path.relative_to(REPO)), line, match.group(1), match.group(2)))
    return found


BLOCKS = _blocks()


def _of(lang: str) -> list[Any]:
    return [pytest.param(b, id=str(b)) for b in BLOCKS if b.lang == lang]


def test_the_docs_have_blocks_of_every_kind_checked_here() -> None:
    assert {b.lang for b in BLOCKS} == {"sh", "", "yaml", "json", "python", "text"}, {b.lang for b in BLOCKS}


# --------------------------------------------------------------------------- commands


def commands(block: Block) -> Iterator[list[str]]:
    """The commands of a ``sh`` block as argv lists: continued lines joined, comments, here-documents
    and redirections dropped, pipelines split."""
    lines = iter(block.text.splitlines())
    for line in lines:
        while line.endswith("\\"):
            line = line[:-1] + next(lines)
        words = shlex.split(line, comments=True)
        for word in [w for w in words if w.startswith("<<")]:  # a here-document: its lines are data
            for body in lines:
                if body.strip() == word[2:]:
                    break
            words.remove(word)
        argv: list[str] = []
        redirected = False
        for word in [*words, "|"]:
            if word == "|":
                if argv:
                    yield argv
                argv = []
            elif redirected or word.startswith(">"):
                redirected = word == ">"  # the file follows (`>file` names it in the same word)
            else:
                argv.append(word)


def _parse_cli(argv: list[str]) -> Any:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return cli._parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"gpu-admission {' '.join(argv)}: {err.getvalue().strip()}") from None


def _existing(path: str) -> bool:
    return (REPO / path).exists()


def _check_gpu_admission(argv: list[str]) -> None:
    """Parses; runs when it reads only what the repository holds (never a cluster, stdin or a server)."""
    args = _parse_cli(argv)
    offline = args.command in ("audit", "policies") and not getattr(args, "cluster", False)
    paths = [*getattr(args, "paths", []), *map(str, getattr(args, "cluster_state", None) or [])]
    if args.command == "policies":
        writes = getattr(args, "output", None) is not None and not getattr(args, "check", False)
        if writes:  # `compile -o DIR` writes into the repository: parsing it is the check
            return
        paths = [str(getattr(args, "directory", None) or args.policies)]
    if not offline or not paths or "-" in paths or not all(map(_existing, paths)):
        return
    done = subprocess.run([sys.executable, "-m", "webhook", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    expected = {0} if args.command == "policies" else {0, 1}  # 1: the audit found denials
    assert done.returncode in expected, f"gpu-admission {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}"


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {t for line in re.findall(r"^([\w .-]+):(?!=)", text, re.M) for t in line.split()}


def _check_command(argv: list[str]) -> None:
    program, rest = argv[0], argv[1:]
    if program in GPU_ADMISSION:
        _check_gpu_admission(rest)
    elif program in ("python", "python3", ".venv/bin/python") and rest[:2] == ["-m", "webhook"]:
        _check_gpu_admission(rest[2:])
    elif program in ("python", "python3", ".venv/bin/python") and rest[:2] == ["-m", "pytest"]:
        for target in (word for word in rest[2:] if not word.startswith("-")):
            path, _, test = target.partition("::")
            assert _existing(path), f"{path} does not exist"
            assert not test or f"def {test.split('[')[0]}(" in (REPO / path).read_text(), f"no test {test} in {path}"
    elif program in ("python", "python3", ".venv/bin/python"):
        script = rest[0]
        assert _existing(script), f"{script} does not exist"
        if "--check" in rest:  # the read-only form
            done = subprocess.run([sys.executable, *rest], cwd=REPO, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    elif program == "make":
        missing = {t for t in rest if "=" not in t} - _make_targets()
        assert not missing, f"make: no target {missing} in the Makefile"
    elif program in EXTERNAL:
        if program == "kubectl" and rest[:2] == ["apply", "-k"]:
            assert (REPO / rest[2] / "kustomization.yaml").is_file(), f"{rest[2]} is no kustomization"
        for word in rest:
            if word.startswith("@"):  # curl's --data @file
                assert _existing(word[1:]), f"{word[1:]} does not exist"
    else:
        raise AssertionError(f"{program}: a command these checks do not know (add it above, or to EXTERNAL)")


@pytest.mark.parametrize("block", _of("sh"))
def test_commands_parse_and_run(block: Block) -> None:
    found = list(commands(block))
    assert found, f"{block}: no command"
    for argv in found:
        _check_command(argv)


def test_commands_are_read_as_written() -> None:
    block = Block("x", 1, "sh", "a --b c   # d\ncat <<'EOF' | e -f - > out\nx: 1\nEOF\nf \\\n  g\n")
    assert list(commands(block)) == [["a", "--b", "c"], ["cat"], ["e", "-f", "-"], ["f", "g"]]
    with pytest.raises(AssertionError, match="unrecognized arguments: --no-such-flag"):
        _check_command(["gpu-admission", "audit", "k8s/", "--no-such-flag"])
    with pytest.raises(AssertionError, match="no target"):
        _check_command(["make", "no-such-target"])


# --------------------------------------------------------------------------- quoted messages


def _variants(message: str) -> set[str]:
    """How the docs may quote an engine message: whole, without its ``[policy/rule]``, or only
    what follows its subject."""
    bare = re.sub(r"^\[[^]]+\] ", "", message)
    return {message, bare, bare.split(": ", 1)[-1]}


@pytest.fixture(scope="module")
def engine_messages() -> set[str]:
    """Every denial line and warning the engine gives for the golden cases, in each quotable form."""
    said: set[str] = set()
    for case in _load_cases():
        decision = evaluate_case(*case.values).decision
        for line in [*decision.message().splitlines(), *decision.warnings]:
            said |= _variants(" ".join(line.split()))
    return said


def _check_messages(block: Block, said: set[str]) -> None:
    """The block is messages of the engine, one after the other (each may be wrapped over lines)."""
    rest = " ".join(block.text.split())
    while rest:
        quoted = [m for m in said if rest.startswith(m) and rest[len(m):len(m) + 1] in ("", " ")]
        assert quoted, f"{block}: the engine says no such thing of any golden case: {rest[:300]}"
        rest = rest[len(max(quoted, key=len)):].strip()


def _check_synopsis(block: Block, _: set[str]) -> None:
    """A command's synopsis (audit, test, report): its options are the command's, and so are its output formats."""
    [commands] = [a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)]
    command = commands.choices[block.text.split()[1]]
    options = {o for action in command._actions for o in action.option_strings}
    shown = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", block.text))
    assert shown <= options, f"{block}: not options of {block.text.split()[1]}: {shown - options}"
    for flag, values in re.findall(r"(-o|--api) ([\w|]+)\]", block.text):
        choices = next(a for a in command._actions if flag in a.option_strings).choices
        assert values.split("|") == list(choices), f"{block}: {flag} takes {list(choices)}"  # type: ignore[arg-type]


SUITE = POLICIES / ".tests"


def _check_test_diff(block: Block, _: set[str], tmp_path: Path) -> None:
    """docs/testing.md's patched-resource difference: the suite's trainer pod expected with two fields wrong."""
    expected = yaml.safe_load((SUITE / "mutations" / "patched" / "pod-ml-a-trainer.yaml").read_text())
    expected["spec"]["securityContext"]["runAsUser"] = 1001
    [shm] = [v for v in expected["spec"]["volumes"] if v["name"] == "gpu-admission-shm"]
    shm["emptyDir"]["sizeLimit"] = "2Gi"
    (tmp_path / "patched").mkdir()
    (tmp_path / "patched" / "pod-ml-a-trainer.yaml").write_text(yaml.safe_dump(expected))
    _write_suite_test(tmp_path, "t", SUITE / "mutations" / "pods.yaml",
                      [{"resources": ["Pod/ml-a/trainer"], "verdict": "mutate",
                        "patchedResource": "patched/pod-ml-a-trainer.yaml"}])  # fmt: skip
    done = _run_test(tmp_path, ".")
    assert done.returncode == 1, done.stdout + done.stderr
    assert block.text in done.stdout, f"{block}: the command printed\n{done.stdout}"


def _check_test_table(block: Block, _: set[str], tmp_path: Path) -> None:
    """docs/testing.md's table: a wrong verdict and a right one on the suite's validation workloads."""
    _write_suite_test(tmp_path / "validations", "example", SUITE / "validations" / "workloads.yaml", [
        {"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validations", "rule": "resourceShape", "verdict": "pass"},
        {"resources": ["Deployment/ml-c/well-formed"], "verdict": "pass"},
    ])  # fmt: skip
    done = _run_test(tmp_path, "validations")
    assert done.returncode == 1, done.stdout + done.stderr
    _same_lines(block, done.stdout)


def _write_suite_test(folder: Path, name: str, resources: Path, results: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUAdmissionTest", "metadata": {"name": name},
                "spec": {"policies": [str(POLICIES)], "resources": [str(resources)],
                         "clusterState": [str(SUITE / "cluster")], "results": results}}  # fmt: skip
    (folder / "gpu-admission-test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


def _run_test(cwd: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "test", *paths], cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


_NGC_POD = GPU_POD.replace("pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime", "nvcr.io/nvidia/pytorch:24.05-py3")
#: documents 1, 2 and 3 at lines 1, 10 and 20, as docs/audit.md's report says
AUDIT_PODS = "---\n".join([
    _NGC_POD,
    _NGC_POD.replace("name: trainer", "name: too-new").replace("  containers:", "  nodeSelector: {pool: old}\n  containers:"),
    "apiVersion: v1\nmetadata: {name: [}\n",
])


def _node(name: str, pool: str, product: str, driver: str) -> dict[str, Any]:
    labels = {"pool": pool, "nvidia.com/gpu.product": product, "nvidia.com/cuda.driver-version.full": driver}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def _check_audit_text(block: Block, _: set[str], tmp_path: Path) -> None:
    """docs/audit.md's text report: two pods (one steered onto the nodes whose driver runs its CUDA,
    one held to two nodes whose driver does not) and a document that is not YAML."""
    (tmp_path / "pods.yaml").write_text(AUDIT_PODS)
    nodes = [_node("rtx-1", "old", "NVIDIA-GeForce-RTX-4090", "535.104.05"),
             _node("rtx-2", "old", "NVIDIA-GeForce-RTX-4090", "535.104.05"),
             _node("h100-1", "new", "NVIDIA-H100-80GB-HBM3", "550.54.15")]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    done = subprocess.run([sys.executable, "-m", "webhook", "audit", "--policies", str(POLICIES), "--cluster-state",
                           "nodes.yaml", "pods.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    _same_lines(block, done.stdout)


def _same_lines(block: Block, output: str) -> None:
    """Line by line; a quoted line that ends in "…" stands for every line it begins."""
    quoted, printed = block.text.rstrip("\n").splitlines(), output.rstrip("\n").splitlines()
    assert len(quoted) == len(printed), f"{block}: quotes {len(quoted)} lines, the command printed:\n{output}"
    for doc, real in zip(quoted, printed):
        same = real.startswith(doc[:-1]) if doc.endswith("…") else real.rstrip() == doc.rstrip()
        assert same, f"{block}: quotes\n  {doc}\nthe command printed\n  {real}"


def _check_policies_check(block: Block, _: set[str], tmp_path: Path) -> None:
    """docs/policies.md's load error: gpu-defaults.yaml with memoryFraction misspelt."""
    shutil.copytree(POLICIES, tmp_path / "policies")
    defaults = tmp_path / "policies" / "gpu-defaults.yaml"
    text = defaults.read_text()
    assert "memoryFraction:" in text
    defaults.write_text(text.replace("memoryFraction:", "memoryFracton:", 1))
    done = subprocess.run([sys.executable, "-m", "webhook", "policies", "check", "policies"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).splitlines()
    assert block.text.strip() in [line.strip() for line in lines], f"{block}: the command printed\n{done.stdout}{done.stderr}"


#: (doc, how the block begins) → what reproduces it
OUTPUTS: dict[tuple[str, str], Callable[..., None]] = {
    ("README.md", "[a100-pool/nodeAffinity] "): _check_messages,
    ("docs/validations.md", "[gpu-validations/resourceShape] "): _check_messages,
    ("docs/quota.md", "[quota-caps/quota] "): _check_messages,
    ("docs/validations.md", "namespace ml-a uses 6 of 8 nvidia.com/gpu "): _check_messages,
    ("docs/validations.md", "namespace ml-a uses 6 of 8 requests."): _check_messages,
    ("docs/validations.md", "Deployment quota-a/d spec.template: "): _check_messages,
    ("docs/audit.md", "gpu-admission audit [PATH…]"): _check_synopsis,
    ("docs/testing.md", "gpu-admission test PATH…"): _check_synopsis,
    ("docs/reports.md", "gpu-admission report [--policies"): _check_synopsis,
    ("docs/testing.md", "  #1 Pod ml-a/trainer: patched resource differs"): _check_test_diff,
    ("docs/testing.md", "Loading test validations/"): _check_test_table,
    ("docs/audit.md", "MUTATE  Pod ml-a/trainer"): _check_audit_text,
    ("docs/policies.md", "gpu-defaults.yaml: document 1 "): _check_policies_check,
}


def _check_of(block: Block) -> Callable[..., None] | None:
    found = [check for (doc, start), check in OUTPUTS.items() if block.doc == doc and block.text.startswith(start)]
    assert len(found) <= 1, block
    return found[0] if found else None


def test_every_quoted_output_is_checked() -> None:
    unchecked = [str(b) for b in BLOCKS if b.lang == "" and _check_of(b) is None]
    assert not unchecked, f"quoted outputs no check reproduces (add one to OUTPUTS): {unchecked}"
    checked = [b for b in BLOCKS if b.lang == "" and _check_of(b) is not None]
    assert len(checked) == len(OUTPUTS), "a check of OUTPUTS finds no block: the doc changed"


@pytest.mark.parametrize("block", _of(""))
def test_quoted_outputs_are_what_the_code_prints(block: Block, engine_messages: set[str], tmp_path: Path) -> None:
    check = _check_of(block)
    assert check is not None
    if check in (_check_audit_text, _check_policies_check, _check_test_diff, _check_test_table):
        check(block, engine_messages, tmp_path)
    else:
        check(block, engine_messages)


def test_a_misquoted_message_is_found(engine_messages: set[str]) -> None:
    [block] = [b for b in BLOCKS if b.text.startswith("[a100-pool/nodeAffinity]")]
    wrong = Block(block.doc, block.line, "", block.text.replace("Tesla-T4", "Tesla-V100"))
    with pytest.raises(AssertionError, match="the engine says no such thing"):
        _check_messages(wrong, engine_messages)


# --------------------------------------------------------------------------- source


def _ledger_schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "deploy" / "base" / "quota-ledger-crd.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _outside_schema(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The fields of ``value`` its structural schema has no place for, or whose type it refuses."""
    kinds = {"object": dict, "string": str, "integer": int, "array": list, "boolean": bool}
    if "type" in schema and not isinstance(value, kinds[schema["type"]]):
        return [f"{path or '.'}: not {schema['type']}"]
    if isinstance(value, dict) and "properties" in schema:
        return [problem for key, item in value.items()
                for problem in (_outside_schema(item, schema["properties"][key], f"{path}.{key}")
                                if key in schema["properties"] else [f"{path}.{key}"])]  # fmt: skip
    return []


def test_a_ledger_field_the_crd_lacks_is_found() -> None:
    ledger = {"kind": "GPUQuotaLedger", "spec": {"scope": "team", "group": "v", "modelLabel": "m"},
              "status": {"charges": "", "chargez": "", "settledGeneration": "12"}}  # fmt: skip
    assert _outside_schema(ledger, _ledger_schema()) == [".status.chargez", ".status.settledGeneration: not integer"]


@pytest.mark.parametrize("block", _of("yaml"))
def test_yaml_parses_and_policies_load(block: Block) -> None:
    documents = list(yaml.safe_load_all(block.text))
    # a test file of `gpu-admission test` (docs/testing.md) is read as one: every field it shows is one of ours
    for test in [d for d in documents if d.get("kind") == "GPUAdmissionTest"]:
        GPUAdmissionTest.model_validate(test)
    # a GPU quota ledger (docs/quota.md) shows only fields its CRD has
    for ledger in [d for d in documents if d.get("kind") == "GPUQuotaLedger"]:
        assert not _outside_schema(ledger, _ledger_schema()), f"{block}: not in the CRD: {_outside_schema(ledger, _ledger_schema())}"
    policies = [d for d in documents if str(d.get("apiVersion", "")).startswith("gpu-admission.io/")
                and d.get("kind") not in ("GPUAdmissionTest", "GPUQuotaLedger")]
    if policies and "{...}" not in block.text:  # (a sketch of every field is no policy)
        # among the shipped ones, in place of any of the same kind and name (what it names must exist)
        names = {(d["kind"], d["metadata"]["name"]) for d in policies}
        shipped = [d for f in sorted(POLICIES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
                   if (d["kind"], d["metadata"]["name"]) not in names]
        loader.load_text("\n---\n".join([yaml.safe_dump_all(shipped), block.text]), str(block))


@pytest.mark.parametrize("block", _of("python"))
def test_python_compiles_and_its_imports_exist(block: Block) -> None:
    compile(block.text, str(block), "exec")
    for line in re.findall(r"^from webhook\S* import .*$", block.text, re.M):
        exec(line, {})


#: a path a diagram names: webhook/cli.py, server/, policy/rules/*.py, audit/report/*
_CODE_PATH = re.compile(r"(?<![\w/.-])((?:webhook/)?(?:[a-z_]+/)*(?:[a-z_]+\.py|[a-z_]+/\*?(?:\.py)?|\*\.py))(?![\w/])")


def named_code_paths(text: str) -> list[str]:
    """The paths of webhook/ a diagram names, relative to the repository."""
    return [p if p.startswith("webhook/") else f"webhook/{p}" for p in _CODE_PATH.findall(text)]


@pytest.mark.parametrize("block", _of("text"))
def test_diagrams_name_modules_that_exist(block: Block) -> None:
    paths = named_code_paths(block.text)
    assert paths, f"{block}: a diagram that names no module of webhook/"
    missing = [p for p in paths if not list(REPO.glob(p.rstrip("/")))]
    assert not missing, f"{block} names what webhook/ does not hold: {missing}"


def test_a_diagram_naming_a_moved_module_is_found() -> None:
    assert named_code_paths("policy/engine.py  view/devices.py, audit/report/* and server/") == [
        "webhook/policy/engine.py", "webhook/view/devices.py", "webhook/audit/report/*", "webhook/server/"]
    [block] = [b for b in BLOCKS if b.lang == "text" and "kube/workload.py" in b.text]
    moved = Block(block.doc, block.line, "text", block.text.replace("kube/workload.py", "policy/workload.py"))
    with pytest.raises(AssertionError, match="webhook/policy/workload.py"):
        test_diagrams_name_modules_that_exist(moved)


async def test_the_readme_answer_is_the_server_s(webhook: Webhook) -> None:
    """The curl example's answer: its fields, and what README says the patch does."""
    [block] = [b for b in BLOCKS if b.doc == "README.md" and b.lang == "json"]
    assert block.text.count("...") == 1  # (the patch, abridged)
    quoted = json.loads(block.text)["response"]
    [curl] = [argv for b in _of("sh") for argv in commands(b.values[0]) if argv[0] == "curl"]
    sent = (REPO / curl[curl.index("--data") + 1].removeprefix("@")).read_text()
    assert curl[-1].endswith("/mutate")
    answer = (await webhook.review("/mutate", sent))["response"]
    assert {k: answer[k] for k in quoted if k != "patch"} == {k: v for k, v in quoted.items() if k != "patch"}
    assert answer["patch"].startswith(quoted["patch"].removesuffix("..."))
    ops = json.loads(base64.b64decode(answer["patch"]))
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "it sets `runtimeClassName: nvidia`" in readme
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in ops
    assert "a 32Gi memory-backed `/dev/shm`" in readme and any('"32Gi"' in json.dumps(op) for op in ops)
    assert "The toleration is not added again" in readme and not any("toleration" in op["path"] for op in ops)
