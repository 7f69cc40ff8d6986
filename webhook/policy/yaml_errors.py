"""What reading a user's YAML raises when the text is no valid YAML, and how to say what is wrong and where.

PyYAML raises its :class:`yaml.YAMLError` on text that does not parse, but
its safe constructor raises plain Python errors on a value that its explicit
tag does not fit: ``!!int abc`` a ValueError, ``!!bool maybe`` a KeyError.
Every reader of a user's file (policies, manifests, cluster-state dumps)
catches :data:`UNREADABLE` and says :func:`describe`: a bad value in a file is
the user's mistake to be told about, never a traceback.
"""

from __future__ import annotations

import yaml

#: what loading a document that cannot be read raises: PyYAML's errors, and the safe
#: constructor's own on a value that its explicit tag does not fit
UNREADABLE = (yaml.YAMLError, ValueError, KeyError, TypeError)


def describe(exc: Exception, first_line: int = 1) -> str:
    """One line: "invalid YAML at line N: what" (N counted from ``first_line``, the text's first line)."""
    if not isinstance(exc, yaml.YAMLError):
        return f"invalid YAML: a value that its tag does not fit ({type(exc).__name__}: {exc})"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {first_line + mark.line}: {problem}"
