"""The MutatingAdmissionPolicy (placeholder until the mutations compile)."""

from __future__ import annotations

from typing import Any

from webhook.cel.reach import Reach
from webhook.cel.validating import Compilation


def documents(compilation: Compilation, reach: Reach) -> list[dict[str, Any]]:
    return []
