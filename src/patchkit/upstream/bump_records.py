"""One bump run's records, read for the pull request's body (upstream/bump.py): `patchkit rebase --json`
(the rebased patch.toml, edit by edit), the release's test record and its `patch-necessity` records
(tests/release_record.py), `patchkit retire --json`, `patchkit verify --json` (the matrix), `patchkit
census --json` (the kernel census), `patchkit upstream --json` (tracked upstream state) and the
diff of UPSTREAM.md.

Each record is read through its producer's own type, declared once beside the code that writes it
(SCHEMAS): rebase's RebaseRecord, retire's RetireRecord, the test runs' RunRecord, the matrix's MatrixRecord, the
census's CensusRecord, the tracked state's UpstreamRecord, and a failed command's FailedCommand. A field
or a state a producer renames is renamed for this reader too; a record written before the rename stops
validating, naming the field.

A record that is missing, that holds a failed command's error (`{"ok": false, "error": ...}`), that does
not validate (its file and the field named), or that is of another release becomes a line
(`BumpRun.problems`: the body's summary counts them, the step's section gives the line); nothing in a
record stops the body. Every input is read bounded and shape-checked before any of it is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from patchkit.census.kernels import CensusRecord
from patchkit.errors import PatchkitError
from patchkit.jsondata import FailedCommand, MalformedJson, decode
from patchkit.patching.rebase.records import RebaseRecord
from patchkit.untrusted import read_file
from patchkit.upstream.retire import RetireRecord
from patchkit.upstream.run_record import RunRecord
from patchkit.upstream.upstream_state import UpstreamRecord
from patchkit.verify.matrix_record import MatrixRecord
from patchkit.verify.render import _longest_run, _md

MESSAGE_LIMIT = 600  # a failed command's message, as one line of the body
# Each step's record and the type it is read through: its producer's own.
SCHEMAS: dict[str, type] = {"rebase": RebaseRecord, "retire": RetireRecord, "verify": MatrixRecord,
                            "kernels": CensusRecord, "upstream": UpstreamRecord, "tests": RunRecord,
                            "necessity": RunRecord}


@dataclass
class BumpRun:
    """One run's records, decoded. Any may be absent: not given (its section says it did not run), or given
    and not usable (missing, a failed command's error, not valid, of another release): then `problems`
    holds the line that says so, keyed by the step it belongs to."""

    release: str
    rebase: RebaseRecord | None = None
    tests: RunRecord | None = None
    necessity: dict[str, RunRecord] | None = None  # patch id -> its record without it
    retire: RetireRecord | None = None
    verify: MatrixRecord | None = None
    kernels: CensusRecord | None = None
    upstream: UpstreamRecord | None = None
    upstream_diff: str | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (step, the line), in the steps' order
    tests_path: Path | None = None  # where the test record was looked for (--results)

    def problem(self, step: str) -> str | None:
        """The first line said of a step's record, or None."""
        return next((line for s, line in self.problems if s == step), None)


def read(path: Path, schema: type, what: str):
    """A record decoded into its schema; a PatchkitError naming it otherwise (exit 2 where a caller wants one)."""
    return decode(read_file(path, "run-record"), schema, f"{what} {path}")


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Text from a record as one line of the body, cut at `limit`."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _record(run: BumpRun, step: str, path: Path, schema: type, what: str):
    """The record at `path` decoded into `schema`, or None with the line that says why in run.problems."""
    def said(line: str) -> None:
        run.problems.append((step, f"{what} {code(str(path))}: {line}"))

    try:
        present = path.exists()
    except OSError as e:  # a folder on the way that cannot be searched
        return said(f"not read: {_md(one_line(e.strerror or str(e)))}")
    if not present:
        return said("missing: its step wrote nothing")
    try:
        data = read_file(path, "run-record")
    except PatchkitError as e:  # too large, not a regular file, unreadable
        return said(f"not read: {_md(one_line(str(e)))}")
    try:
        return decode(data, schema, what)
    except MalformedJson as e:
        try:
            failed = decode(data, FailedCommand, what)
        except MalformedJson:
            return said(f"does not validate: {_md(one_line(e.problem))}" + ("" if e.at == "$" else f" at {code(e.at)}"))
        return said(f"the command failed (exit {failed.error.exit_code}, {_md(one_line(failed.error.kind, 40))}): "
                    + _md(one_line(failed.error.message)))


def load_run(release: str, rebase: Path | None, *, results: Path | None = None, retire: Path | None = None,
             verify: Path | None = None, kernels: Path | None = None, upstream: Path | None = None,
             upstream_diff: Path | None = None) -> BumpRun:
    """Every record of the run that can be used; each one that cannot is a line in `problems`, never an error."""
    run = BumpRun(release)
    if rebase is not None:
        run.rebase = _record(run, "rebase", rebase, SCHEMAS["rebase"], "the rebase record")
        if run.rebase is not None and run.rebase.versions.get("vllm") != release:
            run.problems.append(("rebase", f"the rebase record {code(str(rebase))}: a rebase onto vllm "
                                 f"{_md(str(run.rebase.versions.get('vllm')))}, not {release}: not used"))
            run.rebase = None
    if results is not None:
        path = run.tests_path = results / f"vllm-{release}.json"
        run.tests = _record(run, "tests", path, SCHEMAS["tests"], "the test record") if path.exists() else None
        if run.tests is not None and (run.tests.vllm != release or run.tests.excluded):
            run.problems.append(("tests", f"the test record {code(str(path))}: a run on vllm {_md(str(run.tests.vllm))}"
                                 f" without {_md(', '.join(run.tests.excluded) or 'nothing')}, filed as vllm {release}"
                                 " with the whole series: not used"))
            run.tests = None
        run.necessity = {}
        folder = results / "necessity"
        for p in sorted(folder.glob(f"vllm-{release}-*.json")) if folder.is_dir() else []:
            patch_id = p.name.removeprefix(f"vllm-{release}-").removesuffix(".json")
            record = _record(run, "necessity", p, SCHEMAS["necessity"], "the necessity record")
            if record is not None and (record.vllm != release or record.excluded != [patch_id]):
                run.problems.append(("necessity", f"the necessity record {code(str(p))}: a run on vllm "
                                     f"{_md(str(record.vllm))} without {_md(', '.join(record.excluded) or 'nothing')}, "
                                     f"filed as vllm {release} without {patch_id}: not used"))
            elif record is not None:
                run.necessity[patch_id] = record
    if retire is not None:
        run.retire = _record(run, "retire", retire, SCHEMAS["retire"], "the retire record")
        if run.retire is not None and run.retire.release != release:
            run.problems.append(("retire", f"the retire record {code(str(retire))}: retirement measured on vllm "
                                 f"{_md(run.retire.release)}, not {release}: not used"))
            run.retire = None
    if verify is not None:
        run.verify = _record(run, "verify", verify, SCHEMAS["verify"], "the verify record")
    if kernels is not None:
        run.kernels = _record(run, "kernels", kernels, SCHEMAS["kernels"], "the kernel census")
    if upstream is not None:
        run.upstream = _record(run, "upstream", upstream, SCHEMAS["upstream"], "the upstream state")
    if upstream_diff is not None:
        if not upstream_diff.exists():
            run.problems.append(("upstream-diff", f"the UPSTREAM.md diff {code(str(upstream_diff))}: missing: its "
                                 "step wrote nothing"))
        else:
            try:
                run.upstream_diff = read_file(upstream_diff, "run-record").decode("utf-8", "replace")
            except PatchkitError as e:
                run.problems.append(("upstream-diff", f"the UPSTREAM.md diff {code(str(upstream_diff))}: not read: "
                                     + _md(one_line(str(e)))))
    return run


def code(text: str) -> str:
    """Inline code that survives any backticks inside (CommonMark: a longer fence, spaces around)."""
    if "`" not in text:
        return f"`{_md(text)}`"
    fence = "`" * (_longest_run(text, "`") + 1)
    return f"{fence} {_md(text)} {fence}"
