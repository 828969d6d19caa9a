"""The body of the pull request that bumps the patch set to a new vLLM release, rendered from one run's
records: `patchkit rebase --json` (the rebased patch.toml, edit by edit), the release's test record and its
`patch-necessity` records (tests/release_record.py), `patchkit retire --json`, `patchkit verify --json`
(the matrix), `patchkit verify --kernels --json` (the kernel census), `patchkit upstream --json` (tracked
upstream state) and the diff of UPSTREAM.md. The daily `verify-upstream` workflow writes these files and
opens or updates the pull request with this body; a person reviews and merges it.

Every input is read bounded and shape-checked (exit 2 on a wrong shape); text from them (vLLM source
lines, reasons) is escaped for Markdown tables or fenced, and the body is kept under GitHub's 65,536
characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from patchkit.errors import PatchkitError
from patchkit.jsondata import decode
from patchkit.untrusted import read_file
from patchkit.verify.render import _longest_run, _md
from patchkit.verify.retire import RunRecord, test_prefix

BODY_LIMIT = 60_000  # GitHub refuses a pull request body over 65,536 characters
DIFF_LINES = 400


class _Open(msgspec.Struct):
    """The answers carry more than this reads; the rest is ignored."""


class EvidenceJ(_Open):
    why: str
    similarity: float
    new_path: str
    new_lines: list[int]


class ProposalJ(_Open):
    edit: int
    action: str
    kind: str
    file: list[str]
    versions: str | None
    old_versions: str | None
    evidence: EvidenceJ


class PersonJ(_Open):
    edit: int
    action: str
    reason: str
    candidates: list[str]


class RangeJ(_Open):
    package: str
    to: str
    from_: str = msgspec.field(name="from")


class RebasedJ(_Open):
    patch: str
    state: str
    detail: str
    range: RangeJ | None
    proposals: list[ProposalJ]
    needs_person: list[PersonJ]


class TestJ(_Open):
    patch: str
    passed: bool
    tail: str


class RebaseRun(_Open):
    ok: bool
    to: str
    versions: dict[str, str]
    patches: list[RebasedJ]
    check: dict[str, str]
    tests: list[TestJ]
    tests_note: str
    written: bool
    from_: str = msgspec.field(name="from")


class CellJ(_Open):
    state: str
    detail: str


class CompanionJ(_Open):
    finding: str | None = None


class ColumnJ(_Open):
    label: str
    source: str
    companion: CompanionJ | None = None  # a record from before sources.companion has none


class MatrixPatchJ(_Open):
    id: str
    cells: dict[str, CellJ]


class BuildJ(_Open):
    builds: bool
    blockers: list[str]


class ImageJ(_Open):
    name: str
    builds: dict[str, BuildJ]


class FindingJ(_Open):
    patch: str
    column: str
    reason: str


class VerifyRun(_Open):
    pinned: str
    exit_code: int
    columns: list[ColumnJ]
    patches: list[MatrixPatchJ]
    images: list[ImageJ]
    findings: list[FindingJ]


class KernelJ(_Open):
    need: str
    required: bool
    ok: bool
    loads_on_sm121: list[str]


class RuntimeJ(_Open):
    name: str
    why: str


class KernelRun(_Open):
    wheel: str
    ok: bool
    kernels: list[KernelJ]
    runtime_compiled: list[RuntimeJ] = []


class EvidenceR(_Open):
    kind: str
    text: str
    where: str


class VerdictJ(_Open):
    patch: str
    verdict: str
    evidence: list[EvidenceR]


class RetireRun(_Open):
    release: str
    verdicts: list[VerdictJ]


class TrackedJ(_Open):
    patch: str
    repo: str
    number: int
    kind: str
    state: str
    title: str
    url: str
    released_in: str | None


class UpstreamRun(_Open):
    tracked: list[TrackedJ]


@dataclass
class BumpRun:
    """One run's records, decoded; any but the rebase may be absent (the body then says it did not run)."""

    release: str
    rebase: RebaseRun
    tests: RunRecord | None = None
    necessity: dict[str, RunRecord] | None = None  # patch id -> its record without it
    retire: RetireRun | None = None
    verify: VerifyRun | None = None
    kernels: KernelRun | None = None
    upstream: UpstreamRun | None = None
    upstream_diff: str | None = None


def read(path: Path, schema: type, what: str):
    return decode(read_file(path, "run-record"), schema, f"{what} {path}")


def load_run(release: str, rebase: Path, *, results: Path | None = None, retire: Path | None = None,
             verify: Path | None = None, kernels: Path | None = None, upstream: Path | None = None,
             upstream_diff: Path | None = None) -> BumpRun:
    run = BumpRun(release, read(rebase, RebaseRun, "the rebase record"))
    if run.rebase.versions.get("vllm") != release:
        raise PatchkitError(f"{rebase}: a rebase onto vllm {run.rebase.versions.get('vllm')}, not {release}")
    if results is not None:
        path = results / f"vllm-{release}.json"
        run.tests = read(path, RunRecord, "the test record") if path.exists() else None
        run.necessity = {p.name.removeprefix(f"vllm-{release}-").removesuffix(".json"): read(p, RunRecord, "the necessity record")
                         for p in sorted((results / "necessity").glob(f"vllm-{release}-*.json"))}
    if retire is not None:
        run.retire = read(retire, RetireRun, "the retire record")
        if run.retire.release != release:
            raise PatchkitError(f"{retire}: retirement measured on vllm {run.retire.release}, not {release}")
    if verify is not None:
        run.verify = read(verify, VerifyRun, "the verify record")
    if kernels is not None:
        run.kernels = read(kernels, KernelRun, "the kernel census")
    if upstream is not None:
        run.upstream = read(upstream, UpstreamRun, "the upstream state")
    if upstream_diff is not None:
        run.upstream_diff = read_file(upstream_diff, "run-record").decode("utf-8", "replace")
    return run


def _fenced(text: str, lang: str = "text") -> list[str]:
    fence = "`" * max(3, _longest_run(text, "`") + 1)
    return [f"{fence}{lang}", *text.splitlines(), fence]


def _code(text: str) -> str:
    """Inline code that survives any backticks inside (CommonMark: a longer fence, spaces around)."""
    if "`" not in text:
        return f"`{_md(text)}`"
    fence = "`" * (_longest_run(text, "`") + 1)
    return f"{fence} {_md(text)} {fence}"


def _counts(record: RunRecord | None, prefix: str) -> tuple[int, int, int]:
    outcomes = [o for node, o in (record.tests if record else {}).items() if node.startswith(prefix)]
    return outcomes.count("passed"), outcomes.count("failed"), outcomes.count("skipped")


def _summary(run: BumpRun) -> list[str]:
    rb = run.rebase
    states = [p.state for p in rb.patches]
    people = sum(len(p.needs_person) for p in rb.patches)
    # the planner's states of the rebased series on the release ("not-applied": it applies there); any other fails
    applies = all(s in ("applied", "not-applied", "upstreamed", "out-of-range", "not-applicable") for s in rb.check.values())
    lines = [f"- rebase {_md(rb.from_)} -> {_md(rb.to)}: {states.count('rebased')} patch(es) rebased, "
             f"{states.count('unchanged')} unchanged, {states.count('upstreamed')} upstreamed, "
             f"{people} edit(s) need a person" + ("" if rb.ok else " (**rebase exit 1**)"),
             f"- the rebased series on {run.release}: " + ("applies" if applies else "**does not apply**")]
    if run.tests is None:
        lines.append(f"- behaviour tests on {run.release}: **not run** ({_md(rb.tests_note) or 'no test record'})")
    else:
        passed, failed, skipped = _counts(run.tests, "tests/patches/")
        lines.append(f"- behaviour tests on {run.release}: {passed} passed, {failed} failed, {skipped} skipped"
                     + (" (**failures**)" if failed else ""))
    if run.kernels is None:
        lines.append("- kernel census: not run")
    else:
        lost = [k.need for k in run.kernels.kernels if k.required and not k.ok]
        lines.append("- kernel census: every kernel the GLM-5.3 NVFP4 path needs loads on sm_121" if not lost else
                     "- kernel census: **lost sm_12x code**: " + ", ".join(lost))
    if run.retire is not None:
        drop = [v.patch for v in run.retire.verdicts if v.verdict == "retire"]
        lines.append("- proposed for retirement: " + (", ".join(f"`{p}`" for p in drop) or "none"))
    return lines


def _rebase_section(run: BumpRun) -> list[str]:
    lines = ["## The rebased patch.toml files", ""]
    for p in run.rebase.patches:
        head = f"- `{p.patch}`: **{p.state}**" + (f" ({_md(p.detail)})" if p.detail else "")
        if p.range is not None:
            head += f"; range {p.range.package} `{_md(p.range.from_)}` -> `{_md(p.range.to)}`"
        lines.append(head)
        for pr in p.proposals:
            split = f", the old edit kept for `{_md(pr.old_versions)}`" if pr.old_versions else ""
            lines.append(f"  - edit {pr.edit} ({pr.action}) {pr.kind} -> " + ", ".join(_code(f) for f in pr.file)
                         + (f" for `{_md(pr.versions)}`" if pr.versions else "") + split
                         + f": {_md(pr.evidence.why)} (anchor {pr.evidence.similarity:.0%} similar)")
        for n in p.needs_person:
            lines.append(f"  - edit {n.edit} ({n.action}) **needs a person**: {_md(n.reason)}")
            for c in n.candidates[:2]:
                lines += ["", *("    " + line for line in _fenced(c)), ""]
    check = "; ".join(f"`{k}` {_md('applies' if v == 'not-applied' else v)}" for k, v in run.rebase.check.items())
    lines += ["", f"The rebased series planned on {_md(run.rebase.to)}: {check}.", ""]
    return lines


def _tests_section(run: BumpRun) -> list[str]:
    lines = [f"## Behaviour tests on vLLM {run.release}", ""]
    if run.tests is None:
        return lines + [f"Not run: {_md(run.rebase.tests_note) or 'no test record'}.", ""]
    verdicts = {v.patch: v for v in run.retire.verdicts} if run.retire else {}
    lines += ["| patch | with the rebased series | without it (`patch-necessity`) | retirement |", "|---|---|---|---|"]
    for p in run.rebase.patches:
        passed, failed, skipped = _counts(run.tests, test_prefix(p.patch))
        cell = f"{passed} passed" + (f", **{failed} failed**" if failed else "") + (f", {skipped} skipped" if skipped else "")
        without = (run.necessity or {}).get(p.patch)
        if without is None:
            necessity = "not run"
        else:
            w_passed, w_failed, _ = _counts(without, test_prefix(p.patch))
            necessity = f"fails without it ({w_failed} failed)" if w_failed else f"**passes without it** ({w_passed} passed)"
        verdict = verdicts[p.patch].verdict if p.patch in verdicts else "-"
        lines.append(f"| `{p.patch}` | {cell} | {necessity} | {_md(verdict)} |")
    return lines + ["", f"Test record: vLLM {_md(run.tests.vllm or '?')}, pytest exit status {run.tests.exitstatus}.", ""]


def _retire_section(run: BumpRun) -> list[str]:
    if run.retire is None:
        return []
    lines = [f"## Retirement on {run.release}", ""]
    for v in run.retire.verdicts:
        if v.verdict in ("out of range",):
            continue
        lines.append(f"- `{v.patch}`: **{_md(v.verdict)}**")
        lines += [f"  - {_md(e.kind)}: {_md(e.text)}" + (f" ({_code(e.where)})" if e.where else "") for e in v.evidence]
    return lines + [""]


def _matrix_section(run: BumpRun) -> list[str]:
    if run.verify is None:
        return []
    v = run.verify
    labels = [c.label for c in v.columns]
    lines = ["## The matrix (`patchkit verify`)", "", f"Pinned: vLLM {_md(v.pinned)}; verify exit {v.exit_code}.", "",
             "| patch | " + " | ".join(_md(lb) for lb in labels) + " |", "|---" * (len(labels) + 1) + "|"]
    lines += [f"| `{p.id}` | " + " | ".join(_md(p.cells[lb].state) if lb in p.cells else "-" for lb in labels) + " |"
              for p in v.patches]
    lines += [f"| image `{i.name}` | " + " | ".join(
        ("builds" if i.builds[lb].builds else "does not build: " + _md("; ".join(i.builds[lb].blockers)))
        if lb in i.builds else "-" for lb in labels) + " |" for i in v.images]
    lines += [""] + [f"- regression: `{f.patch}` @ {_md(f.column)}: {_md(f.reason)}" for f in v.findings]
    lines += [f"- companion: {_md(c.label)}: {_md(c.companion.finding)}" for c in v.columns
              if c.companion is not None and c.companion.finding]
    lines += ["", "Sources: " + "; ".join(f"{_md(c.label)}: {_md(c.source)}" for c in v.columns), ""]
    return lines


def _kernels_section(run: BumpRun) -> list[str]:
    if run.kernels is None:
        return []
    k = run.kernels
    lines = [f"## Kernel census of {_code(k.wheel)}", "", "| kernel | loads on sm_121 | verdict |", "|---|---|---|"]
    for row in k.kernels:
        verdict = "ok" if row.ok and row.loads_on_sm121 else ("not needed on GB10" if row.ok else "**MISSING**")
        lines.append(f"| {_md(row.need)} | {_md(', '.join(row.loads_on_sm121) or '-')} | {verdict} |")
    if k.runtime_compiled:
        lines += ["", "Compiled at run time on 12.x (CUDA 13's nvcc where vLLM runs): "
                  + "; ".join(_md(r.name) for r in k.runtime_compiled) + "."]
    return lines + [""]


def _upstream_section(run: BumpRun) -> list[str]:
    lines = []
    if run.upstream is not None:
        lines += ["## Tracked upstream changes", "", "| patch | tracked | state | released in |", "|---|---|---|---|"]
        lines += [f"| `{t.patch}` | [{_md(t.repo)}#{t.number}]({_md(t.url)}) {_md(t.title)} | {_md(t.state)} | "
                  f"{_md(t.released_in or '-')} |" for t in run.upstream.tracked]
        lines.append("")
    lines += ["## UPSTREAM.md", ""]
    if not run.upstream_diff:
        return lines + ["Unchanged." if run.upstream_diff == "" else "No diff recorded.", ""]
    diff = run.upstream_diff.splitlines()
    shown = "\n".join(diff[:DIFF_LINES]) + (f"\n... {len(diff) - DIFF_LINES} more lines" if len(diff) > DIFF_LINES else "")
    return lines + ["<details><summary>the diff</summary>", "", *_fenced(shown, "diff"), "", "</details>", ""]


def body(run: BumpRun) -> str:
    """The pull request body in GitHub-flavoured Markdown."""
    lines = [f"# vLLM {run.release}: the patch set rebased and measured", "",
             "Opened by the daily `verify-upstream` workflow; written by `patchkit bump body` from this run's "
             "records. Nothing here merges without a person's review.", "", *_summary(run), ""]
    for section in (_rebase_section, _tests_section, _retire_section, _matrix_section, _kernels_section,
                    _upstream_section):
        lines += section(run)
    text = "\n".join(lines).rstrip("\n") + "\n"
    if len(text) > BODY_LIMIT:  # GitHub refuses longer bodies
        text = text[:BODY_LIMIT] + "\n\n... cut at 60,000 characters: the records are in the run's log\n"
    return text
