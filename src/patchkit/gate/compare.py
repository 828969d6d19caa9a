"""Two runs' outcomes per test id: the same, or a difference the series made."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    test_id: str
    stock: str  # an outcome (plugin.py), or "absent" where the id was not collected on that tree
    patched: str

    @property
    def regression(self) -> bool:
        """Passed on stock, not on the patched tree."""
        return self.stock in ("passed", "xfailed") and self.patched not in ("passed", "xfailed")


@dataclass(frozen=True)
class Comparison:
    stock: dict[str, str]
    patched: dict[str, str]
    differences: list[Difference]

    @property
    def same(self) -> int:
        return len(set(self.stock) | set(self.patched)) - len(self.differences)

    def counts(self, tree: str) -> Counter[str]:
        """Outcomes on one tree: what could not run on CPU fails or skips alike, counted here, not hidden."""
        return Counter((self.stock if tree == "stock" else self.patched).values())


def compare(stock: dict[str, str], patched: dict[str, str]) -> Comparison:
    ids = sorted(set(stock) | set(patched))
    differences = [Difference(i, stock.get(i, "absent"), patched.get(i, "absent")) for i in ids
                   if stock.get(i, "absent") != patched.get(i, "absent")]
    return Comparison(stock, patched, differences)
