"""An unexpected error of a command: one line on stderr (the traceback with ``--debug``) and exit code 3."""

from __future__ import annotations

import sys
import traceback

EXIT_UNEXPECTED = 3


def report(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"error: unexpected {type(exc).__name__}: {exc}" + ("" if debug else " (--debug for the traceback)"),
          file=sys.stderr)  # fmt: skip
    return EXIT_UNEXPECTED
