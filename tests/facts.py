"""FACTS.md read as data, so that code tables are checked against the reference itself."""

from __future__ import annotations

import re
from functools import lru_cache

from tests.support import SHARED

FACTS = SHARED / "FACTS.md"


@lru_cache(maxsize=None)
def section(number: int) -> str:
    """The text of ``## <number>.`` up to the next ``## ``."""
    text = FACTS.read_text(encoding="utf-8")
    match = re.search(rf"^## {number}\..*?(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"FACTS.md has no section {number}"
    return match.group(0)


def table_rows(text: str) -> list[list[str]]:
    """Cells of every markdown table row in ``text``, header and rule lines excluded."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] in ("CUDA", "rel", "GPU", "label"):
            continue  # a header row
        rows.append(cells)
    return rows


def cuda_releases(notation: str) -> list[str]:
    """FACTS §1 notation → X.Y.Z releases: "12.6 U1/U2", "11.5 GA–U2", "11.3.0/11.3.1", "12.1 GA/U1"."""
    notation = notation.strip()
    if re.fullmatch(r"\d+\.\d+\.\d+(/\d+\.\d+\.\d+)*", notation):
        return notation.split("/")
    base, _, updates = notation.partition(" ")

    def number(word: str) -> int:
        return 0 if word == "GA" else int(word.removeprefix("U"))

    if "–" in updates:
        first, last = (number(w) for w in updates.split("–"))
        return [f"{base}.{n}" for n in range(first, last + 1)]
    return [f"{base}.{number(w)}" for w in updates.split("/")]
