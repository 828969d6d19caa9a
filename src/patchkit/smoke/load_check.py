"""Judging a quantprobe table: each layer's resolved algorithm against the variant's expected rows and
against the storage format its loader can read (vllm_rules.loads, the table preflight reads too)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchkit.vllm_rules import loads

if TYPE_CHECKING:  # the smoke's workers import this module where only the standard library is sure
    from patchkit.variants.definitions import Variant


@dataclass
class SmokeReport:
    variant: str
    vllm: str
    rows: list[dict]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        return json.dumps({"variant": self.variant, "vllm": self.vllm, "ok": self.ok, "problems": self.problems,
                           "rows": self.rows}, indent=2)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"quantprobe {self.variant} on {self.vllm}")
        for col in ("layer", "prefix", "algo", "stored", "expected"):
            table.add_column(col, overflow="fold")  # a prefix is a module path to look up whole
        for r in self.rows:
            if r.get("expected") or r["algo"] != "None" or r["stored"] != "BF16":
                mark = "" if r.get("verdict", "ok") == "ok" else "[red]"
                table.add_row(r["layer"], r["prefix"], f"{mark}{r['algo']}", r["stored"], r.get("expected") or "")
        lines = [f"[red]✗ {p}[/red]" for p in self.problems] or ["[green]every layer resolves to what its weights need[/green]"]
        return Group(table, *lines)


def judge(variant: Variant, rows: list[dict], stored: dict[str, str], label: str) -> SmokeReport:
    """Compare the resolved table with the variant's expected rows and with what the weights need."""
    expected = {r.prefix: r for r in variant.expect.quantprobe}
    problems = []
    for row in rows:
        row["stored"] = stored.get(row["module"], "absent")
        want = expected.pop(row["prefix"], None)
        row["expected"] = want.algo if want else None
        verdicts = []
        if want and (want.layer, want.algo) != (row["layer"], row["algo"]):
            verdicts.append(f"expected {want.algo}")
        # The indexer's fused wk_weights_proj is always built BF16; its loader (not run here) decides
        # whether quantized wk/weights_proj tensors are dequantized into it (patched) or not (stock).
        if row["built"] != "none" and row["stored"] not in loads(variant.checkpoint.format, row["algo"]):
            verdicts.append(f"weights stored {row['stored']} cannot load as {row['algo']}")
        row["verdict"] = "; ".join(verdicts) or "ok"
        if verdicts:
            problems.append(f"{row['prefix']}: resolves to {row['algo']}: {row['verdict']}")
    for prefix in expected:
        problems.append(f"{prefix}: expected by the variant but not a layer of the checkpoint")
    return SmokeReport(variant.name, label, rows, problems)
