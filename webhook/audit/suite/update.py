"""``gpu-admission test --update``: today's results written into the tests' expectations, for review.

Each expectation gets the verdict found (an expectation over several
resources whose verdicts differ is split, one per verdict), a message
pattern that matches nothing any more becomes the first message found
(escaped), and a patched-resource file is written with the object as the
mutating webhook leaves it. Every judged object no expectation names gets
one: its verdict (and patched resource when it is mutated, under
``patched/``), and a row for each rule that denies, audits, warns or
mutates. The files keep their comments and layout (ruamel.yaml's round
trip); review the change as any other.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from webhook.audit import mutated
from webhook.audit.suite.observed import Observed
from webhook.audit.suite.testrun import Key, TestRun
from webhook.errors import SuiteError

_REPORTED = ("deny", "audit", "warn", "mutate")  # the rule verdicts a new expectation is written for
_SPECIAL = re.compile(r"([\\.^$*+?{}\[\]|()])")


def pattern(message: str) -> str:
    """A regular expression matching ``message`` itself: only its metacharacters escaped (re.escape
    escapes spaces and dashes too, which makes a pattern hard to read and to trim)."""
    return _SPECIAL.sub(r"\\\1", message)


def update(runs: Sequence[TestRun]) -> list[str]:
    """Rewrite the test files of ``runs`` (and their patched resources); one line per file written."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    yaml.preserve_quotes = True
    by_file: dict[Path, list[TestRun]] = {}
    for run in runs:
        by_file.setdefault(run.document.path, []).append(run)
    written: list[str] = []
    for path, file_runs in by_file.items():
        documents = [d for d in yaml.load_all(path.read_text(encoding="utf-8"))]
        present = [d for d in documents if d is not None]
        files = 0
        for run in file_runs:
            spec = present[run.document.index - 1]["spec"]
            spec["results"], patched = _results(run, list(spec.get("results") or []))
            files += patched
        out = io.StringIO()
        yaml.dump_all(documents, out)
        path.write_text(out.getvalue(), encoding="utf-8")
        written.append(f"updated {path}" + (f" and {files} patched resource file(s)" if files else ""))
    return written


def _results(run: TestRun, rows: list[Any]) -> tuple[list[Any], int]:
    """The expectations of one test brought up to date, and how many patched-resource files were written."""
    results: list[Any] = []
    named: set[Key] = set()
    files = 0
    for row in rows:
        groups: dict[str, list[tuple[str, Observed]]] = {}
        for reference in row["resources"]:
            key, seen = _one(run, reference)
            named.add(key)
            groups.setdefault(_got(row, seen), []).append((reference, seen))
        for got, members in groups.items():
            updated = row if len(groups) == 1 else copy.deepcopy(row)
            if len(groups) > 1:
                updated["resources"] = [reference for reference, _ in members]
            if "verdict" in updated:
                updated["verdict"] = got
            if "message" in updated:
                _fix_message(updated, members)
            if "patchedResource" in updated:
                files += _write_patched(run, updated["patchedResource"], members[0][1])
            results.append(updated)
    for object_key, judged in run.objects:
        if judged is not None and object_key not in named:
            rows_added, written = _new(run, object_key, judged)
            results.extend(rows_added)
            files += written
    return results, files


def _one(run: TestRun, reference: str) -> tuple[Key, Observed]:
    found = run.find(reference)
    if len(found) != 1 or found[0][1] is None:
        raise SuiteError([f"{run.document.label}: spec.results: {reference}: names no one judged object"])
    key, seen = found[0]
    assert seen is not None
    return key, seen


def _got(row: Any, seen: Observed) -> str:
    if row.get("rule") is not None:
        return seen.rule(str(row["policy"]), str(row["rule"]))[0]
    return seen.verdict


def _messages(row: Any, seen: Observed) -> list[str]:
    return seen.rule(str(row["policy"]), str(row["rule"]))[1] if row.get("rule") is not None else seen.messages


def _fix_message(row: Any, members: list[tuple[str, Observed]]) -> None:
    for _, seen in members:
        messages = _messages(row, seen)
        if not any(re.search(str(row["message"]), m) for m in messages):
            if messages:
                row["message"] = pattern(messages[0])
            else:
                del row["message"]
            return


def _write_patched(run: TestRun, relative: str, seen: Observed) -> int:
    path = run.document.folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    text = mutated.dump(seen.result.patched)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return 0
    path.write_text(text, encoding="utf-8")
    return 1


def _new(run: TestRun, key: Key, seen: Observed) -> tuple[list[dict[str, Any]], int]:
    reference = "/".join(key)
    row: dict[str, Any] = {"resources": _flow([reference]), "verdict": seen.verdict}
    files = 0
    if seen.result.mutation.patch and not seen.result.denied:  # a denied object is never stored
        kind, namespace, name = key
        row["patchedResource"] = f"patched/{kind.lower()}-{namespace}-{name}.yaml".replace("*", "")
        files = _write_patched(run, row["patchedResource"], seen)
    rows = [row]
    for policy, rule in seen.rules():
        verdict, messages = seen.rule(policy, rule)
        if verdict in _REPORTED:
            added: dict[str, Any] = {"resources": _flow([reference]), "policy": policy, "rule": rule, "verdict": verdict}
            if verdict != "mutate" and messages:
                added["message"] = pattern(messages[0])
            rows.append(added)
    return rows, files


def _flow(items: list[str]) -> Any:
    """A list written on one line (``resources: [Pod/ml/trainer]``), as a person writes a short one."""
    from ruamel.yaml.comments import CommentedSeq

    seq = CommentedSeq(items)
    seq.fa.set_flow_style()
    return seq
