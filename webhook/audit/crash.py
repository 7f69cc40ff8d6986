"""How a command ends on an error: the errors it expects as one line and their exit code, the
unexpected as one line on stderr (the traceback with ``--debug``) and exit code 3."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Mapping

from webhook.errors import PolicyError

EXIT_UNEXPECTED = 3


def guarded(command: Callable[[], int], debug: bool, expected: Mapping[type[Exception], int]) -> int:
    """``command``'s exit code; an error of a type in ``expected`` is ``error: …`` on stderr and that
    type's code, a PolicyError goes on to the CLI (which prints every problem, with file and
    field, and exits 2), as does a BrokenPipeError (the output's reader went away: the CLI exits
    141 and prints nothing), and anything else is a crash (``crashed``)."""
    try:
        return command()
    except (PolicyError, BrokenPipeError):  # (the CLI's to answer: every problem; a reader gone)
        raise
    except Exception as exc:  # noqa: BLE001 - the contract is exit 3 and one line
        code = next((code for kind, code in expected.items() if isinstance(exc, kind)), None)
        if code is None:
            return crashed(exc, debug)
        print(f"error: {exc}", file=sys.stderr)
        return code


def crashed(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"error: unexpected {type(exc).__name__}: {exc}" + ("" if debug else " (--debug for the traceback)"),
          file=sys.stderr)  # fmt: skip
    return EXIT_UNEXPECTED
