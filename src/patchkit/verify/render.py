"""The `patchkit verify` matrix shown: rich renderables for a terminal, a dict for --json, Markdown for a
CI job summary or an issue body.

Each shows the cells' states as `states.CellState` words them (label, mark, style); an out-of-range
cell carries what it would do with the ranges ignored. Beneath the table: the details of every cell a
reader needs the reason of, the images' verdicts, and the findings behind exit 1.
"""

from __future__ import annotations

from patchkit.patching.patchset import Patch
from patchkit.patching.series import FULL_SERIES
from patchkit.verify.matrix import Cell, Column, Matrix
from patchkit.verify.states import CellState


def to_dict(matrix: Matrix) -> dict:
    """Plain data for --json (matrix_record.MatrixRecord, which the bump pull request's body reads back)."""
    from patchkit.verify.matrix_record import matrix_record

    return matrix_record(matrix).to_dict()


def _short(cell: Cell) -> str:
    """A cell in a table: its label, and what an out-of-range patch would do."""
    if _holds(cell):
        return "holds"
    text = cell.state.label
    if cell.would_state is not None and cell.would_state.would_short:
        text += f" ({cell.would_state.would_short})"
    return text


def _holds(cell: Cell) -> bool:
    """An assert-only patch reads as applied when its invariants hold: say "holds", not "applied"."""
    return cell.state == CellState.APPLIED and all(e.action == "assert" for e in cell.result.patch.edits)


def _heading(column: Column) -> str:
    head = column.label
    if column.version != column.label.removeprefix("v"):
        head += f" [{column.version}]"
    return head + (" (pinned)" if column.pinned else "")


def _noteworthy(matrix: Matrix) -> list[tuple[Patch, Column, Cell]]:
    """Cells whose reason a reader needs: all but a plain "applies" or "holds" (an "applies" with a
    caveat, such as a package's edits left unchecked, is listed)."""
    return [
        (p, c, cell)
        for p in matrix.patches
        for c in matrix.columns
        if not _holds(cell := matrix.cell(p.id, c.label))
        and (cell.state != CellState.APPLIES or cell.result.detail or cell.companion)
    ]


def _newest_line(matrix: Matrix) -> str:
    newest = matrix.newest_for_all
    what = "every image builds" if FULL_SERIES not in matrix.images else "the full series builds"
    return f"newest version {what} on: {_heading(newest) if newest else 'none'}"


def render(matrix: Matrix) -> list:
    """Rich renderables: the matrix, the details of every cell that is not a plain "applies", images."""
    from rich.table import Table
    from rich.text import Text

    out: list = []
    table = Table(title=f"patch x vLLM version (pinned {matrix.pinned})", title_justify="left")
    table.add_column("patch", overflow="fold")  # a patch id is copied whole: folded at any width, never cut
    for column in matrix.columns:
        table.add_column(_heading(column), overflow="fold")
    for patch in matrix.patches:
        cells = [matrix.cell(patch.id, c.label) for c in matrix.columns]
        table.add_row(patch.id, *(Text(_short(cell), style=cell.state.style) for cell in cells))
    out.append(table)
    for label, finding in matrix.companion_findings:
        out.append(Text(f"{label}: {finding}", style="yellow"))
    details = _noteworthy(matrix)
    if details:
        out.append(Text("details", style="bold"))
        for patch, column, cell in details:
            out.append(Text(f"{patch.id} @ {column.label}: {cell.summary()}", style=cell.state.style))
            if diagnostics := cell.diagnostics():
                out.append(Text("  " + diagnostics.replace("\n", "\n  ")))
    images = Table(title="images: would they build?", title_justify="left")
    images.add_column("image", overflow="fold")  # an image name, likewise
    for column in matrix.columns:
        images.add_column(_heading(column), overflow="fold")
    for name in matrix.images:
        row = []
        for column in matrix.columns:
            verdict = matrix.images[name][column.label]
            text = "builds" if verdict.builds else "; ".join(verdict.blockers)
            row.append(Text(text, style="green" if verdict.builds else "red"))
        images.add_row(name, *row)
    out.append(images)
    out.append(Text(_newest_line(matrix), style="bold"))
    out.extend(_findings_text(matrix))
    return out


def _findings_text(matrix: Matrix) -> list:
    from rich.text import Text

    findings = matrix.findings
    if not findings:
        return [Text("no regression against the pinned release", style="green")]
    return [Text("regressions (exit 1):", style="bold red")] + [
        Text(f"  {f.patch} @ {f.column}: {f.reason}", style="red") for f in findings
    ]


def to_markdown(matrix: Matrix) -> str:
    """GitHub-flavoured Markdown, for a job summary or an issue body."""
    heads = [_heading(c) for c in matrix.columns]
    lines = [f"## patchkit verify: {len(matrix.patches)} patches x {len(matrix.columns)} vLLM versions", ""]
    lines += [f"Pinned release: vLLM {matrix.pinned}.", ""]
    findings = matrix.findings
    if findings:
        lines += ["**Regressions (exit 1):**", ""]
        lines += [f"- `{f.patch}` @ {_md(f.column)}: {_md(f.reason)}" for f in findings]
    else:
        lines.append("No regression against the pinned release.")
    if matrix.companion_findings:
        lines += ["", "**Companions not checked as pinned:**", ""]
        lines += [f"- {_md(label)}: {_md(finding)}" for label, finding in matrix.companion_findings]
    lines += ["", "| patch | " + " | ".join(_md(h) for h in heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for patch in matrix.patches:
        cells = [matrix.cell(patch.id, c.label) for c in matrix.columns]
        row = [f"{cell.state.mark} {_short(cell)}" for cell in cells]
        lines.append(f"| `{patch.id}` | " + " | ".join(_md(r) for r in row) + " |")
    lines += ["", "### Images", "", "| image | " + " | ".join(_md(h) for h in heads) + " |"]
    lines.append("|---" * (len(heads) + 1) + "|")
    for name in matrix.images:
        row = []
        for column in matrix.columns:
            verdict = matrix.images[name][column.label]
            row.append("✅ builds" if verdict.builds else "❌ " + "; ".join(verdict.blockers))
        lines.append(f"| `{name}` | " + " | ".join(_md(r) for r in row) + " |")
    lines += ["", f"**{_md(_newest_line(matrix))}**", ""]
    details = _noteworthy(matrix)
    if details:
        lines += ["### Details", ""]
        for patch, column, cell in details:
            lines.append(f"- `{patch.id}` @ {_md(column.label)}: {_md(cell.summary())}")
            if diagnostics := cell.diagnostics():
                fence = "`" * max(3, _longest_run(diagnostics, "`") + 1)
                lines += ["", "  <details><summary>diagnostic</summary>", "", f"  {fence}text"]
                lines += ["  " + line for line in diagnostics.splitlines()]
                lines += [f"  {fence}", "", "  </details>", ""]
    lines += ["", "Sources: " + "; ".join(f"{_md(c.label)}: {_md(c.source)}" for c in matrix.columns), ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    """Table-safe inline text: pipes escaped, newlines folded."""
    return text.replace("|", "\\|").replace("\n", " ")


def _longest_run(text: str, char: str) -> int:
    best = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        best = max(best, run)
    return best
