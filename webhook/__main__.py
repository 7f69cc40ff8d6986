"""``python -m webhook`` runs the command line."""

from __future__ import annotations

import sys

from webhook import cli

if __name__ == "__main__":
    sys.exit(cli.main())
