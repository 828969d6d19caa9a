"""A rich table read back as printed: one column's text, its cells' lines joined and whitespace removed,
so a folded or wrapped cell reads back as what was put in it, and a cut one ("…") does not."""

from __future__ import annotations

import re


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def column(table: str, name: str) -> str:
    """The body of the column headed `name` (its heading's lines joined, as the cells' are)."""
    lines = table.splitlines()
    headers = [line.strip()[1:-1].split("┃") for line in lines if line.startswith("┃")]
    assert headers, table
    index = [squeezed("".join(parts)) for parts in zip(*headers, strict=True)].index(squeezed(name))
    cells = [line.strip()[1:-1].split("│")[index] for line in lines if line.startswith("│")]
    assert cells, table
    return squeezed("".join(cells))
