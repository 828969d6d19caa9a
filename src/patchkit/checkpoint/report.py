"""What `patchkit preflight` found, as JSON or a rich table: the report preflight.py fills."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class PreflightReport:
    variant: str
    image: str  # the image whose series was judged
    root: str
    tp: int
    identity: dict
    declared: dict
    tensors: int
    total_gib: float
    header_only_shards: int
    formats: list[dict]
    mtp: dict
    # checkpoint: needed by the quantization layout (the variant's [vllm] patches must list them); platform:
    # needed by the config and serve contract; spelling: needed by the tensor names; missing: every needed
    # patch the image's series lacks ({patch, why, found}), each a problem.
    patches: dict
    memory: dict
    spelling: dict = field(default_factory=dict)  # tensor-name spelling (nested/flat) and whether the image loads it
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        return json.dumps(dict(asdict(self), ok=self.ok), indent=2)

    def __rich__(self):
        from rich.console import Group
        from rich.markup import escape
        from rich.table import Table

        head = Table(title=f"preflight {self.variant} (image {self.image}): {self.root}", show_header=False)
        head.add_column()
        head.add_column(overflow="fold")  # paths, patch ids and sizes, never cut
        head.add_row("identity", f"config {self.identity['config_sha256'][:16]}… index {self.identity['index_sha256'][:16]}… ✓")
        head.add_row("declared", f"{self.declared['format']} {self.declared['quant_algo']} → vLLM --quantization {self.declared['vllm_method']}")
        head.add_row("tensors", f"{self.tensors:,} ({self.total_gib:.2f} GiB){'; header-only shards: ' + str(self.header_only_shards) if self.header_only_shards else ''}")
        head.add_row("MTP", f"layers {self.mtp['layers'] or 'none'}; routed experts {self.mtp['routed_expert_formats'] or '-'}")
        head.add_row("spelling", self.spelling.get("verdict", "-"))
        missing = [m["patch"] for m in self.patches["missing"]]
        head.add_row("patches", f"needed {self.patches['checkpoint'] or 'none'}; platform {self.patches['platform']}"
                     f"{'; the image lacks ' + ', '.join(missing) if missing else '; all in the image'}")
        m = self.memory
        head.add_row("memory", f"{m['weights_gib_per_rank']:.2f} GiB weights/rank at TP={self.tp} + {m['kv_gib']:.2f} GiB KV + {m['reserve_gib']:.1f} reserve = {m['total_gib']:.2f} of {m['budget_gib']} GiB")
        fmt = Table(title="storage by module kind", show_lines=False)
        for col in ("kind", "part", "format", "modules", "GiB"):
            fmt.add_column(col, justify="right" if col in ("modules", "GiB") else "left", overflow="fold")
        for row in self.formats:
            fmt.add_row(row["kind"], row["part"], row["format"], f"{row['modules']:,}", f"{row['gib']:.2f}")
        lines = [f"[red]✗ {escape(p)}[/red]" for p in self.problems] + [f"[yellow]• {escape(n)}[/yellow]" for n in self.notes]
        verdict = "[green]OK: the layout matches what vLLM 0.33 will build[/green]" if self.ok else "[red]FAILED[/red]"
        return Group(head, fmt, *lines, verdict)
