"""The image: small, non-root, the venv only, and the entrypoint the manifests expect."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field

import deploy_tree
import pytest
from deploy_tree import REPO

COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libc6?-dev)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return lines


def _stages() -> list[Stage]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines((REPO / "Dockerfile").read_text("utf-8")):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            image, *rest = args.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m[1] or m[2]], image)
            name = rest[1] if len(rest) == 2 and rest[0].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif not stages and keyword == "ARG":
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


STAGES = _stages()
FINAL = STAGES[-1]


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def test_multi_stage_on_python_slim() -> None:
    assert len(STAGES) >= 2
    for stage in STAGES:
        assert re.fullmatch(r"python:3\.11-slim(@sha256:[0-9a-f]{64})?", stage.base), stage.base


def test_final_stage_user_is_numeric_and_not_root() -> None:
    (user,) = FINAL.all("USER")
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    assert match, f"USER {user}: must be numeric for runAsNonRoot"
    assert int(match[1]) != 0 and int(match[2] or 1) != 0
    pod = deploy_tree.one("Deployment", "gpu-admission")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(match[1])


def test_entrypoint_is_the_server() -> None:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    assert _exec_form(entrypoint) == ["gpu-admission", "serve"]
    assert any("/opt/venv/bin" in env for env in FINAL.all("ENV")), "gpu-admission on PATH"


def test_console_script_is_declared() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["scripts"]["gpu-admission"] == "webhook.cli:main"


def test_default_arguments_agree_with_the_deployment() -> None:
    (cmd,) = FINAL.all("CMD")
    args = _exec_form(cmd)
    pairs = dict(zip(args[::2], args[1::2]))
    container = deploy_tree.one("Deployment", "gpu-admission")["spec"]["template"]["spec"]["containers"][0]
    deployed = container["args"]
    deployed_pairs = dict(zip(deployed[::2], deployed[1::2]))
    for flag in ("--policies", "--tls-cert", "--tls-key", "--host", "--port"):
        assert pairs[flag] == deployed_pairs[flag], flag


def test_final_stage_copies_only_the_venv() -> None:
    assert not FINAL.all("ADD")
    builders = {s.name for s in STAGES[:-1]}
    for copy in FINAL.all("COPY"):
        parts = copy.split()
        flags = [p for p in parts if p.startswith("--")]
        paths = [p for p in parts if not p.startswith("--")]
        assert any(f.split("=", 1)[1] in builders for f in flags if f.startswith("--from=")), \
            f"COPY {copy}: only from the builder, never the build context"
        assert paths[:-1] == ["/opt/venv"], f"COPY {copy}: only the virtual environment"


def test_no_compilers_in_the_final_stage() -> None:
    for run in FINAL.all("RUN"):
        if re.search(r"\b(apt-get|apt|apk|yum|dnf)\b.*\binstall\b", run):
            assert not COMPILERS.search(run.split("install", 1)[1]), run


def test_the_image_compiles_the_policy_core_and_refuses_an_interpreted_one() -> None:
    # the figures of docs/performance.md are of the compiled core: an image built without it is slower
    builds = [run for stage in STAGES[:-1] for run in stage.all("RUN") if "pip wheel" in run]
    assert builds and all("GPU_ADMISSION_COMPILE=1" in run for run in builds), builds
    assert any("policy_core() == 'compiled'" in run for run in builds), "the build checks what it built"


def _dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text("utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]").replace("\0", ".*")
        rules.append((negate, re.compile(regex)))
    return rules


def _excluded(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or a parent wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for negate, regex in _dockerignore():
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("path", ["certs/tls.key", "certs/README.md", ".venv/bin/python",
                                  "tests/deploy/test_dockerfile.py", ".git/HEAD",
                                  "webhook/__pycache__/cli.cpython-311.pyc", "deploy/kustomization.yaml"])
def test_build_context_excludes(path: str) -> None:
    assert _excluded(path)


@pytest.mark.parametrize("path", ["pyproject.toml", "setup.py", "webhook/__init__.py", "webhook/view/snapshot.py"])
def test_build_context_includes_what_the_wheel_needs(path: str) -> None:
    assert not _excluded(path)
