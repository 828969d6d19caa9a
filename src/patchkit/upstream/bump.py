"""The body of the pull request that bumps the patch set to a new vLLM release, rendered from one run's
records (read by upstream/bump_records.py, each through its producer's own type). The daily
`verify-upstream` workflow writes the records and opens or updates the pull request with this body; a
person reviews and merges it.

The body renders from whatever the run produced: a record that could not be used is a line of the body
(`BumpRun.problems`), never an error. Text from the records (vLLM source lines, reasons, error messages)
is escaped for Markdown tables or fenced, the body is a function of the records alone (no clock, no host:
the same records give the same bytes), and it is kept under GitHub's 65,536 characters.
"""

from __future__ import annotations

from patchkit.patching.planner import State
from patchkit.patching.rebase.model import EXIT_FAILED, EXIT_WRITTEN, RebaseState
from patchkit.patching.rebase.records import PatchRecord, RebaseRecord
from patchkit.patching.test_files import BEHAVIOUR_TESTS, behaviour_test_prefix
from patchkit.upstream.bump_records import BumpRun, code, load_run
from patchkit.upstream.retire import Kind, Retirement
from patchkit.upstream.run_record import RunRecord, TestOutcome
from patchkit.verify.render import _longest_run, _md

__all__ = ["BumpRun", "body", "load_run"]

BODY_LIMIT = 60_000  # GitHub refuses a pull request body over 65,536 characters
DIFF_LINES = 400


def _fenced(text: str, lang: str = "text") -> list[str]:
    fence = "`" * max(3, _longest_run(text, "`") + 1)
    return [f"{fence}{lang}", *text.splitlines(), fence]


def _counts(record: RunRecord | None, prefix: str) -> tuple[int, int, int]:
    outcomes = [o for node, o in (record.tests if record else {}).items() if node.startswith(prefix)]
    return outcomes.count(TestOutcome.PASSED), outcomes.count(TestOutcome.FAILED), outcomes.count(TestOutcome.SKIPPED)


APPLIES = (State.APPLIED, State.NOT_APPLIED, State.UPSTREAMED, State.OUT_OF_RANGE, State.NOT_APPLICABLE)  # no error
ALWAYS_COUNTED = (RebaseState.REBASED, RebaseState.UNCHANGED, RebaseState.UPSTREAMED)  # said even when 0


def shown_state(run: BumpRun, p: PatchRecord) -> tuple[RebaseState, str]:
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
    passed, failed, _ = _counts(run.tests, behaviour_test_prefix(p.patch))
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


def _people(rebase: RebaseRecord) -> list[str]:
    return [f"`{p.patch}` edit{'s' if len(p.needs_person) > 1 else ''} " + ", ".join(str(n.edit) for n in p.needs_person)
            for p in rebase.patches if p.needs_person]


def _written(rb: RebaseRecord) -> str:
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
    return f"no test record {code(str(run.tests_path))}" + (f"; the rebase: {note}" if note else "")


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
        passed, failed, skipped = _counts(run.tests, BEHAVIOUR_TESTS + "/")
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
            lines.append(f"  - edit {pr.edit} ({_md(pr.action)}) {_md(pr.kind)} -> " + ", ".join(code(f) for f in pr.file)
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
        passed, failed, skipped = _counts(run.tests, behaviour_test_prefix(patch))
        cell = f"{passed} passed" + (f", **{failed} failed**" if failed else "") + (f", {skipped} skipped" if skipped else "")
        without = (run.necessity or {}).get(patch)
        if without is None:
            necessity = "not run"
        else:
            w_passed, w_failed, _ = _counts(without, behaviour_test_prefix(patch))
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
        lines += [f"  - {_md(e.kind)}: {_md(e.text)}" + (f" ({code(e.where)})" if e.where else "") for e in v.evidence
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
    lines = [f"## Kernel census of {code(k.wheel)}", "", "| kernel | loads on sm_121 | verdict |", "|---|---|---|"]
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
        lines += [f"| `{t.patch}` | [{_md(t.repo)}#{t.number}]({_md(t.url)}) {_md(t.title)} | {_md(t.words)} | "
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
