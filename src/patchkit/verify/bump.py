"""The body of the pull request that bumps the patch set to a new vLLM release, rendered from one run's
records: `patchkit rebase --json` (the rebased patch.toml, edit by edit), the release's test record and its
`patch-necessity` records (tests/release_record.py), `patchkit retire --json`, `patchkit verify --json`
(the matrix), `patchkit verify --kernels --json` (the kernel census), `patchkit upstream --json` (tracked
upstream state) and the diff of UPSTREAM.md. The daily `verify-upstream` workflow writes these files and
opens or updates the pull request with this body; a person reviews and merges it.

The body renders from whatever the run produced: a record that is missing, that holds a failed command's
error (`{"ok": false, "error": ...}`, what every command writes with --json when it fails), that does not
validate (its file and the field named), or that is of another release becomes a line of the body
(`BumpRun.problems`: the summary counts them, the step's section gives the line); nothing in a record
stops the body. Every input is still read bounded and shape-checked before any of it is used;
text from them (vLLM source lines, reasons, error messages) is escaped for Markdown tables or fenced, the
body is a function of the records alone (no clock, no host: the same records give the same bytes), and it
is kept under GitHub's 65,536 characters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson, decode
from patchkit.patching.planner import State
from patchkit.patching.rebase.model import EXIT_FAILED, EXIT_WRITTEN, RebaseState
from patchkit.sources.companion import How
from patchkit.untrusted import read_file
from patchkit.verify.render import _longest_run, _md
from patchkit.verify.retire import Kind, Retirement, RetireRecord, RunRecord, test_prefix
from patchkit.verify.states import CellState

BODY_LIMIT = 60_000  # GitHub refuses a pull request body over 65,536 characters
DIFF_LINES = 400
MESSAGE_LIMIT = 600  # a failed command's message, as one line of the body


class _Open(msgspec.Struct):
    """The records carry more than this reads; the rest is ignored. Every state is the producer's own enum
    (RebaseState, the planner's State, CellState, How, Retirement) and the retirement record is retire's
    own struct: a value or a field a producer renames fails to validate here, and the recorded runs'
    tests (tests/test_bump.py, tests/test_bump_workflow.py) fail with it."""


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
    state: RebaseState
    detail: str
    range: RangeJ | None
    proposals: list[ProposalJ]
    needs_person: list[PersonJ]
    failure: str | None = None  # a rebase that writes per patch: why its rebased form failed a check
    written: bool | None = None  # None: a record from before rebase wrote per patch


class TestJ(_Open):
    patch: str
    passed: bool
    tail: str


class RebaseRun(_Open):
    ok: bool
    to: str
    versions: dict[str, str]
    patches: list[RebasedJ]
    check: dict[str, State]  # patch id -> the planner's state of the rebased series on the new release
    tests: list[TestJ]
    tests_note: str
    written: bool
    from_: str = msgspec.field(name="from")
    exit_code: int | None = None  # 0 written, 4 some edit needs a person, 1 a check failed (None: an older record)
    written_patches: list[str] = []
    not_written: dict[str, str] = {}  # patch id -> why it was not written
    write_asked: bool | None = None


class ErrorJ(_Open):
    exit_code: int
    kind: str
    message: str


class FailedRun(_Open):
    """What a patchkit command writes on stdout with --json when it fails (cli.common._json_failure)."""

    ok: bool
    error: ErrorJ


class CellJ(_Open):
    state: CellState
    detail: str


class CompanionJ(_Open):
    how: How
    finding: str | None


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
    """One run's records, decoded. Any may be absent: not given (its section says it did not run), or given
    and not usable (missing, a failed command's error, not valid, of another release): then `problems`
    holds the line that says so, keyed by the step it belongs to."""

    release: str
    rebase: RebaseRun | None = None
    tests: RunRecord | None = None
    necessity: dict[str, RunRecord] | None = None  # patch id -> its record without it
    retire: RetireRecord | None = None
    verify: VerifyRun | None = None
    kernels: KernelRun | None = None
    upstream: UpstreamRun | None = None
    upstream_diff: str | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (step, the line), in the steps' order
    tests_path: Path | None = None  # where the test record was looked for (--results)

    def problem(self, step: str) -> str | None:
        """The first line said of a step's record, or None."""
        return next((line for s, line in self.problems if s == step), None)


def read(path: Path, schema: type, what: str):
    """A record decoded into its schema; a PatchkitError naming it otherwise (exit 2 where a caller wants one)."""
    return decode(read_file(path, "run-record"), schema, f"{what} {path}")


def _one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _record(run: BumpRun, step: str, path: Path, schema: type, what: str):
    """The record at `path` decoded into `schema`, or None with the line that says why in run.problems."""
    def said(line: str) -> None:
        run.problems.append((step, f"{what} {_code(str(path))}: {line}"))

    try:
        present = path.exists()
    except OSError as e:  # a folder on the way that cannot be searched
        return said(f"not read: {_md(_one_line(e.strerror or str(e)))}")
    if not present:
        return said("missing: its step wrote nothing")
    try:
        data = read_file(path, "run-record")
    except PatchkitError as e:  # too large, not a regular file, unreadable
        return said(f"not read: {_md(_one_line(str(e)))}")
    try:
        return decode(data, schema, what)
    except MalformedJson as e:
        try:
            failed = decode(data, FailedRun, what)
        except MalformedJson:
            return said(f"does not validate: {_md(_one_line(e.problem))}" + ("" if e.at == "$" else f" at {_code(e.at)}"))
        return said(f"the command failed (exit {failed.error.exit_code}, {_md(_one_line(failed.error.kind, 40))}): "
                    + _md(_one_line(failed.error.message)))


def load_run(release: str, rebase: Path | None, *, results: Path | None = None, retire: Path | None = None,
             verify: Path | None = None, kernels: Path | None = None, upstream: Path | None = None,
             upstream_diff: Path | None = None) -> BumpRun:
    """Every record of the run that can be used; each one that cannot is a line in `problems`, never an error."""
    run = BumpRun(release)
    if rebase is not None:
        run.rebase = _record(run, "rebase", rebase, RebaseRun, "the rebase record")
        if run.rebase is not None and run.rebase.versions.get("vllm") != release:
            run.problems.append(("rebase", f"the rebase record {_code(str(rebase))}: a rebase onto vllm "
                                 f"{_md(str(run.rebase.versions.get('vllm')))}, not {release}: not used"))
            run.rebase = None
    if results is not None:
        path = run.tests_path = results / f"vllm-{release}.json"
        run.tests = _record(run, "tests", path, RunRecord, "the test record") if path.exists() else None
        if run.tests is not None and (run.tests.vllm != release or run.tests.excluded):
            run.problems.append(("tests", f"the test record {_code(str(path))}: a run on vllm {_md(str(run.tests.vllm))}"
                                 f" without {_md(', '.join(run.tests.excluded) or 'nothing')}, filed as vllm {release}"
                                 " with the whole series: not used"))
            run.tests = None
        run.necessity = {}
        folder = results / "necessity"
        for p in sorted(folder.glob(f"vllm-{release}-*.json")) if folder.is_dir() else []:
            patch_id = p.name.removeprefix(f"vllm-{release}-").removesuffix(".json")
            record = _record(run, "necessity", p, RunRecord, "the necessity record")
            if record is not None and (record.vllm != release or record.excluded != [patch_id]):
                run.problems.append(("necessity", f"the necessity record {_code(str(p))}: a run on vllm "
                                     f"{_md(str(record.vllm))} without {_md(', '.join(record.excluded) or 'nothing')}, "
                                     f"filed as vllm {release} without {patch_id}: not used"))
            elif record is not None:
                run.necessity[patch_id] = record
    if retire is not None:
        run.retire = _record(run, "retire", retire, RetireRecord, "the retire record")
        if run.retire is not None and run.retire.release != release:
            run.problems.append(("retire", f"the retire record {_code(str(retire))}: retirement measured on vllm "
                                 f"{_md(run.retire.release)}, not {release}: not used"))
            run.retire = None
    if verify is not None:
        run.verify = _record(run, "verify", verify, VerifyRun, "the verify record")
    if kernels is not None:
        run.kernels = _record(run, "kernels", kernels, KernelRun, "the kernel census")
    if upstream is not None:
        run.upstream = _record(run, "upstream", upstream, UpstreamRun, "the upstream state")
    if upstream_diff is not None:
        if not upstream_diff.exists():
            run.problems.append(("upstream-diff", f"the UPSTREAM.md diff {_code(str(upstream_diff))}: missing: its "
                                 "step wrote nothing"))
        else:
            try:
                run.upstream_diff = read_file(upstream_diff, "run-record").decode("utf-8", "replace")
            except PatchkitError as e:
                run.problems.append(("upstream-diff", f"the UPSTREAM.md diff {_code(str(upstream_diff))}: not read: "
                                     + _md(_one_line(str(e)))))
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


APPLIES = (State.APPLIED, State.NOT_APPLIED, State.UPSTREAMED, State.OUT_OF_RANGE, State.NOT_APPLICABLE)  # no error
ALWAYS_COUNTED = (RebaseState.REBASED, RebaseState.UNCHANGED, RebaseState.UPSTREAMED)  # said even when 0


def shown_state(run: BumpRun, p: RebasedJ) -> tuple[RebaseState, str]:
    """A patch's state as the body says it, and why where it is not the rebase record's own: "rebased" only
    where its behaviour tests passed on the release, in the rebase's own run or in the release's test
    record of this run (`nox -s release-<release>`, after a `--no-tests` rebase); tests that failed there
    make it "re-anchored, tests failed"."""
    assert run.rebase is not None
    placed = (RebaseState.REBASED, RebaseState.UNTESTED)
    if p.state not in placed:
        return p.state, ""
    own = [t for t in run.rebase.tests if t.patch == p.patch]
    if own and all(t.passed for t in own):
        return RebaseState.REBASED, ""
    passed, failed, _ = _counts(run.tests, test_prefix(p.patch))
    record = f"the release's test record: {passed} passed" + (f", {failed} failed" if failed else "")
    if failed:
        return RebaseState.TESTS_FAILED, record
    if passed:
        return RebaseState.REBASED, record
    if p.state == RebaseState.REBASED:  # a record that says rebased with no test of the patch behind it
        return RebaseState.UNTESTED, "no behaviour test of it recorded on the release"
    return p.state, ""


def _states(run: BumpRun) -> str:
    assert run.rebase is not None
    counts: dict[RebaseState, int] = {}
    for p in run.rebase.patches:
        state = shown_state(run, p)[0]
        counts[state] = counts.get(state, 0) + 1
    parts = [f"{counts.pop(state, 0)} {'patch(es) ' if state == RebaseState.REBASED else ''}{state}"
             for state in ALWAYS_COUNTED]
    said = {RebaseState.NEEDS_PERSON: "held for a person (their old range and files kept)"}
    parts += [f"{counts[state]} {said.get(state) or _state(state)}" for state in RebaseState if state in counts]
    return ", ".join(parts)


def _state(state: RebaseState) -> str:
    """A rebase state in a list: "re-anchored, untested" reads "re-anchored (untested)"."""
    head, sep, rest = state.partition(", ")
    return _md(f"{head} ({rest})" if sep else str(state))


def _people(rebase: RebaseRun) -> list[str]:
    return [f"`{p.patch}` edit{'s' if len(p.needs_person) > 1 else ''} " + ", ".join(str(n.edit) for n in p.needs_person)
            for p in rebase.patches if p.needs_person]


def _written(rb: RebaseRun) -> str:
    if rb.written_patches:
        return "written: " + ", ".join(f"`{p}`" for p in rb.written_patches)
    if rb.written:
        return "written"
    return "nothing written" + ("" if rb.write_asked is not False else " (not asked to: no --write)")


def _patch_ids(run: BumpRun) -> list[str]:
    """The patches the body lists: the rebase's, else the retirement's, else the matrix's."""
    if run.rebase is not None:
        return [p.patch for p in run.rebase.patches]
    if run.retire is not None:
        return [v.patch_id for v in run.retire.verdicts]
    return [p.id for p in run.verify.patches] if run.verify is not None else []


def _no_record(run: BumpRun, step: str, default: str = "not run") -> str:
    return "**no record** (its section says why)" if run.problem(step) else default


def _tests_not_run(run: BumpRun) -> str:
    note = _md(run.rebase.tests_note) if run.rebase is not None else ""
    if run.tests_path is None:
        return note or "no test record"
    return f"no test record {_code(str(run.tests_path))}" + (f"; the rebase: {note}" if note else "")


def _summary(run: BumpRun) -> list[str]:
    lines = []
    rb = run.rebase
    if rb is None:
        lines.append(f"- rebase onto {run.release}: {_no_record(run, 'rebase')}")
    else:
        people = sum(len(p.needs_person) for p in rb.patches)
        code = rb.exit_code if rb.exit_code is not None else (EXIT_WRITTEN if rb.ok else EXIT_FAILED)
        lines.append(f"- rebase {_md(rb.from_)} -> {_md(rb.to)}: {_states(run)}, {people} edit(s) need a person"
                     + ("" if code == EXIT_WRITTEN else f" (**rebase exit {code}**)") + "; " + _written(rb))
        if people:
            lines.append("- edits that need a person: " + "; ".join(_people(rb)))
        bad = sorted(k for k, v in rb.check.items() if v not in APPLIES)
        outside = sorted(k for k, v in rb.check.items() if v == State.OUT_OF_RANGE)
        lines.append(f"- the rebased series planned on {run.release}: "
                     + ("applies" if not bad else "**does not apply**: " + ", ".join(f"`{k}` {_md(rb.check[k])}" for k in bad))
                     + ("; out of range there (not carried): " + ", ".join(f"`{k}`" for k in outside) if outside else ""))
    if run.tests is None:
        lines.append(f"- behaviour tests on {run.release}: **not run** ({_tests_not_run(run)})")
    else:
        passed, failed, skipped = _counts(run.tests, "tests/patches/")
        lines.append(f"- behaviour tests on {run.release}: {passed} passed, {failed} failed, {skipped} skipped"
                     + (" (**failures**)" if failed else ""))
    if run.verify is None:
        lines.append(f"- the matrix: {_no_record(run, 'verify')}")
    else:
        v = run.verify
        lines.append(f"- the matrix: verify exit {v.exit_code}, {len(v.findings)} regression(s)"
                     + "".join(f"; {_md(c.label)}: {_md(c.companion.finding)}" for c in v.columns
                               if c.companion is not None and c.companion.finding))
    if run.kernels is None:
        lines.append(f"- kernel census: {_no_record(run, 'kernels')}")
    else:
        lost = [k.need for k in run.kernels.kernels if k.required and not k.ok]
        lines.append("- kernel census: every kernel the GLM-5.3 NVFP4 path needs loads on sm_121" if not lost else
                     "- kernel census: **lost sm_12x code**: " + ", ".join(lost))
    if run.retire is not None:
        drop = [v.patch_id for v in run.retire.verdicts if v.verdict == Retirement.RETIRE]
        lines.append("- proposed for retirement: " + (", ".join(f"`{p}`" for p in drop) or "none"))
        hand = [v.patch_id for v in run.retire.verdicts if v.verdict == Retirement.CHECK_BY_HAND]
        if hand:
            lines.append("- retirement to check by hand: " + ", ".join(f"`{p}`" for p in hand))
    elif run.problem("retire"):
        lines.append(f"- retirement: {_no_record(run, 'retire')}")
    if run.problems:
        lines.append(f"- **{len(run.problems)} record(s) missing or not usable**: "
                     + ", ".join(dict.fromkeys(step for step, _ in run.problems)))
    return lines


def _rebase_section(run: BumpRun) -> list[str]:
    lines = ["## The rebased patch.toml files", ""]
    if run.rebase is None:
        return lines + [f"No rebase: {run.problem('rebase') or 'the rebase record was not given'}.", ""]
    for p in run.rebase.patches:
        state, why = shown_state(run, p)
        head = (f"- `{p.patch}`: **{_md(state)}**" + (f" ({_md(p.detail)})" if p.detail else "")
                + (f" ({'' if state == p.state else f'rebase record: {_md(p.state)}; '}{_md(why)})" if why else ""))
        if p.range is not None and p.written is False:
            head += (f"; range {_md(p.range.package)} `{_md(p.range.from_)}` kept (proposed: `{_md(p.range.to)}`)")
        elif p.range is not None:
            head += f"; range {_md(p.range.package)} `{_md(p.range.from_)}` -> `{_md(p.range.to)}`"
        if p.written is not None and (p.written or p.patch in run.rebase.not_written):
            head += "; written" if p.written else f"; **not written**: {_md(run.rebase.not_written[p.patch])}"
        lines.append(head)
        if p.failure:
            lines += ["", *("    " + line for line in _fenced(p.failure)), ""]
        for pr in p.proposals:
            split = f", the old edit kept for `{_md(pr.old_versions)}`" if pr.old_versions else ""
            lines.append(f"  - edit {pr.edit} ({_md(pr.action)}) {_md(pr.kind)} -> " + ", ".join(_code(f) for f in pr.file)
                         + (f" for `{_md(pr.versions)}`" if pr.versions else "") + split
                         + f": {_md(pr.evidence.why)} (anchor {pr.evidence.similarity:.0%} similar)")
        for n in p.needs_person:
            lines.append(f"  - edit {n.edit} ({_md(n.action)}) **needs a person**: {_md(n.reason)}")
            for c in n.candidates[:2]:
                lines += ["", *("    " + line for line in _fenced(c)), ""]
    check = "; ".join(f"`{k}` {_md('applies' if v == State.NOT_APPLIED else v)}" for k, v in run.rebase.check.items())
    lines += ["", f"The rebased series planned on {_md(run.rebase.to)}: {check}.", ""]
    return lines


def _tests_section(run: BumpRun) -> list[str]:
    lines = [f"## Behaviour tests on vLLM {run.release}", ""]
    unusable = [f"- {line}" for step, line in run.problems if step == "necessity"]
    if run.tests is None:
        line = run.problem("tests")
        return lines + [f"Not run: {line or _tests_not_run(run)}.", "", *unusable, *([""] if unusable else [])]
    verdicts = {v.patch_id: v for v in run.retire.verdicts} if run.retire else {}
    lines += ["| patch | with the rebased series | without it (`patch-necessity`) | retirement |", "|---|---|---|---|"]
    for patch in _patch_ids(run):
        passed, failed, skipped = _counts(run.tests, test_prefix(patch))
        cell = f"{passed} passed" + (f", **{failed} failed**" if failed else "") + (f", {skipped} skipped" if skipped else "")
        without = (run.necessity or {}).get(patch)
        if without is None:
            necessity = "not run"
        else:
            w_passed, w_failed, _ = _counts(without, test_prefix(patch))
            necessity = f"fails without it ({w_failed} failed)" if w_failed else f"**passes without it** ({w_passed} passed)"
        verdict = verdicts[patch].verdict if patch in verdicts else "-"
        lines.append(f"| `{patch}` | {cell} | {necessity} | {_md(verdict)} |")
    return lines + ["", f"Test record: vLLM {_md(run.tests.vllm or '?')}, pytest exit status {run.tests.exitstatus}.", "",
                    *unusable, *([""] if unusable else [])]


def _retire_section(run: BumpRun) -> list[str]:
    if run.retire is None:
        line = run.problem("retire")
        return [f"## Retirement on {run.release}", "", f"No retirement: {line}.", ""] if line else []
    lines = [f"## Retirement on {run.release}", ""]
    for v in run.retire.verdicts:
        lines.append(f"- `{v.patch_id}`: **{_md(v.verdict)}**"
                     + ("" if v.in_range else f" (proposed: {run.release} is outside its range)"))
        lines += [f"  - {_md(e.kind)}: {_md(e.text)}" + (f" ({_code(e.where)})" if e.where else "") for e in v.evidence
                  if v.in_range or e.kind != Kind.RANGE]
    return lines + [""]


def _matrix_section(run: BumpRun) -> list[str]:
    if run.verify is None:
        line = run.problem("verify")
        return ["## The matrix (`patchkit verify`)", "", f"No matrix: {line}.", ""] if line else []
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
        line = run.problem("kernels")
        return ["## Kernel census", "", f"No census: {line}.", ""] if line else []
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
    elif run.problem("upstream"):
        lines += ["## Tracked upstream changes", "", f"Not read: {run.problem('upstream')}.", ""]
    lines += ["## UPSTREAM.md", ""]
    if not run.upstream_diff:
        if run.problem("upstream-diff"):
            return lines + [f"No diff: {run.problem('upstream-diff')}.", ""]
        return lines + ["Unchanged." if run.upstream_diff == "" else "No diff recorded.", ""]
    diff = run.upstream_diff.splitlines()
    shown = "\n".join(diff[:DIFF_LINES]) + (f"\n... {len(diff) - DIFF_LINES} more lines" if len(diff) > DIFF_LINES else "")
    return lines + ["<details><summary>the diff</summary>", "", *_fenced(shown, "diff"), "", "</details>", ""]


def body(run: BumpRun) -> str:
    """The pull request body in GitHub-flavoured Markdown."""
    lines = [f"# vLLM {run.release}: the patch set rebased and measured", "",
             "Opened by the daily `verify-upstream` workflow; written by `patchkit bump body` from this run's "
             "records. Nothing here merges without a person's review.", "", *_summary(run), ""]
    for section in (_rebase_section, _tests_section, _retire_section, _matrix_section,
                    _kernels_section, _upstream_section):
        lines += section(run)
    text = "\n".join(lines).rstrip("\n") + "\n"
    if len(text) > BODY_LIMIT:  # GitHub refuses longer bodies
        text = text[:BODY_LIMIT] + "\n\n... cut at 60,000 characters: the records are in the run's log\n"
    return text
