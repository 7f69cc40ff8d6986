"""Test files: found under the command line's paths, read, and validated document by document.

A folder is searched recursively, hidden folders included (a suite kept
beside its policies in ``.tests/`` is never loaded as a policy), ``.git``
excepted, for files whose name matches the pattern (default
``*gpu-admission-test.yaml``, ``.yml`` too); a file named on the command
line is read whatever its name. Every problem is collected with its file,
document and field before :class:`~webhook.errors.SuiteError` is raised.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pydantic
import yaml

from webhook.audit.suite.schema import KIND, GPUAdmissionTest
from webhook.errors import SuiteError
from webhook.policy import yaml_errors
from webhook.policy.loader import field_path

FILE_PATTERN = "*gpu-admission-test.y*ml"
_SKIPPED = frozenset({".git", ".hg", ".svn"})


@dataclass(frozen=True)
class TestDocument:
    """One GPUAdmissionTest, and where it was read."""

    __test__ = False  # not a pytest class

    path: Path
    index: int  # 1-based document number in its file
    test: GPUAdmissionTest

    @property
    def folder(self) -> Path:
        """What the test's paths are relative to."""
        return self.path.parent

    @property
    def label(self) -> str:
        return f"{self.path}: document {self.index} ({KIND} {self.test.metadata.name})"  # (as load's problems say it)


def find(paths: Iterable[str], pattern: str = FILE_PATTERN) -> list[Path]:
    """The test files under ``paths``, each once, in a stable order."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found[path] = None
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED)
                for name in sorted(filenames):
                    if fnmatch.fnmatch(name, pattern):
                        found[Path(dirpath) / name] = None
        else:
            raise SuiteError([f"{path}: no such file or folder"])
    if not found:
        raise SuiteError([f"no test files ({pattern}) under {', '.join(str(p) for p in paths)}"])
    return list(found)


def load(path: Path) -> list[TestDocument]:
    """Every GPUAdmissionTest of one file, or SuiteError naming each problem."""
    try:
        values = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError([f"{path}: cannot read: {exc}"]) from exc
    except yaml_errors.UNREADABLE as exc:
        raise SuiteError([f"{path}: {yaml_errors.describe(exc)}"]) from exc
    documents: list[TestDocument] = []
    problems: list[str] = []
    for index, value in enumerate((v for v in values if v is not None), start=1):
        where = f"{path}: document {index}"
        if not isinstance(value, dict) or value.get("kind") != KIND:
            kind = value.get("kind") if isinstance(value, dict) else None
            problems.append(f"{where}: kind must be {KIND} (got {kind!r})")
            continue
        name = value.get("metadata", {}).get("name") if isinstance(value.get("metadata"), dict) else None
        try:
            documents.append(TestDocument(path, index, GPUAdmissionTest.model_validate(value)))
        except pydantic.ValidationError as exc:
            problems.extend(f"{where} ({KIND} {name or '?'}): {field_path(e['loc'])}: {e['msg']}" for e in exc.errors())
    if not documents and not problems:
        problems.append(f"{path}: no {KIND} document in it")
    if problems:
        raise SuiteError(problems)
    return documents
