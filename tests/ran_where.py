"""What ran where: the committed record of every patch's behaviour tests on each vLLM release.

The records live in docs/ran-where/ (vllm-<release>.json: one cell per patch of patches/series.toml and
per variant-level check; necessity/vllm-<release>.json: one cell per patch, from its tests run with the
patch left out), each cell with its counts, its outcome, the commit it ran on and when. A test run's own
records (tests/release_record.py; noxfile.py points each release's run at <results>/vllm-<release>.json
and each `patch-necessity` run at <results>/necessity/...) are merged in cell by cell: the newer result
wins, a cell the run did not run keeps its recorded result, and a cell the run narrowed (-k/-m, a node
id, an early stop) replaces the recorded one only where it failed. README's table is rendered from the
committed records alone, so tests/test_ran_where.py fails CI when the two differ.

A release the run ran, inside a patch's range, without a passing behaviour test of that patch in this
run is a failure (exit 1), as is a failed test: "anchors only" is what the older suite gave those cells,
and it is not enough.

    python tests/ran_where.py --results RESULTS_DIR --releases 0.33.0 0.30.0 --readme README.md
    python tests/ran_where.py --readme README.md      # no run to merge: the table from the records
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec
from packaging.version import InvalidVersion, Version

from patchkit.upstream.run_record import RunRecord, TestOutcome  # what tests/release_record.py writes

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "ran-where"
START, END = "<!-- what-ran-where:start -->", "<!-- what-ran-where:end -->"
# Rows besides the patches: variant-level checks that run on every release (cell id -> test prefix, label).
CHECKS = {
    "cpu-load-smoke": ("tests/test_smoke_cpu.py::", "CPU load smoke, every variant (stock fails, patched passes)"),
    "serve-parser": ("tests/test_serve.py::test_vllm_parser_accepts_every_variant_command",
                     "vLLM serve parser, every variant's command"),
}
MAX_RECORD_BYTES = 16 * 1024 * 1024  # a run's record is ~100 KiB; anything far larger is not one
SHA = re.compile(r"[0-9a-f]{40}(\+dirty)?")


class RecordError(Exception):
    """A record that cannot be read or merged: named with its path, never half-merged."""


# A cell's outcome; a necessity cell's (the patch left out) is one of the last two or "anchors only".
Outcome = Literal["behaviour-tested", "FAILED", "anchors only", "fails without it", "passes without it"]


class CellRecord(msgspec.Struct, forbid_unknown_fields=True):
    """One committed cell: a patch's (or a check's) tests on one release in one run."""

    outcome: Outcome
    passed: int
    failed: int
    skipped: int
    commit: str  # 40 hex digits, "+dirty" when the run's tree differed from that commit
    finished: str  # UTC, 2026-12-04T14:50:00Z
    torch: str | None
    transformers: str | None


class ReleaseRecord(msgspec.Struct, forbid_unknown_fields=True):
    release: str
    cells: dict[str, CellRecord]


@dataclass(frozen=True)
class Records:
    """The committed records: release -> its cells, and release -> its necessity cells."""

    runs: dict[str, dict[str, CellRecord]]
    necessity: dict[str, dict[str, CellRecord]]


def patch_tests(patch_id: str) -> str:
    from patchkit.patching.test_files import behaviour_test_prefix

    return behaviour_test_prefix(patch_id)


def series():
    """The patches of patches/series.toml, in its order."""
    from patchkit.patching.patchset import load_patchset

    return load_patchset(REPO / "patches").series()


def _release_key(release: str) -> Version:
    try:
        return Version(release)
    except InvalidVersion as e:
        raise RecordError(f"{release!r} is not a vLLM release number") from e


def releases(records: Records) -> list[str]:
    """The table's columns: every supported release some patch's range covers, and every release recorded."""
    from patchkit import SUPPORTED_VLLM

    patches = series()
    claimed = {r for r in SUPPORTED_VLLM if any(Version(r) in p.ranges["vllm"] for p in patches)}
    return sorted(claimed | set(records.runs) | set(records.necessity), key=_release_key)


# -- reading -------------------------------------------------------------------------------------------------


def _decode(path: Path, kind):
    try:
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise RecordError(f"{path}: {size} bytes, more than a record's {MAX_RECORD_BYTES}")
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except OSError as e:
        raise RecordError(f"{path}: {e.strerror or e}") from e
    except msgspec.DecodeError as e:  # ValidationError is one: a wrong field names its path
        raise RecordError(f"{path}: not a {kind.__name__}: {e}") from e


def load_records(folder: Path = RECORDS) -> Records:
    def read(sub: Path) -> dict[str, dict[str, CellRecord]]:
        found = {}
        for path in sorted(sub.glob("vllm-*.json")):
            record = _decode(path, ReleaseRecord)
            if path.name != f"vllm-{record.release}.json":
                raise RecordError(f"{path}: holds release {record.release}, its name says another")
            _release_key(record.release)
            for cell_id, cell in record.cells.items():
                if not SHA.fullmatch(cell.commit):
                    raise RecordError(f"{path}: cell {cell_id}: commit {cell.commit!r} is not a full sha")
            found[record.release] = record.cells
        return found

    return Records(read(folder), read(folder / "necessity"))


def write_records(records: Records, folder: Path = RECORDS) -> None:
    for sub, by_release in ((folder, records.runs), (folder / "necessity", records.necessity)):
        for release, cells in by_release.items():
            sub.mkdir(parents=True, exist_ok=True)
            record = ReleaseRecord(release, dict(sorted(cells.items())))
            text = json.dumps(msgspec.to_builtins(record), indent=1) + "\n"
            (sub / f"vllm-{release}.json").write_text(text)


@dataclass(frozen=True)
class Fresh:
    """A run's records from its results folder: release -> run, (patch, release) -> run without that patch."""

    runs: dict[str, RunRecord]
    necessity: dict[tuple[str, str], RunRecord]


def load_results(results: Path, *, legacy_commit: str | None = None) -> Fresh:
    """`legacy_commit`: the commit a run ran on whose record predates the field (the run's checkout's HEAD,
    as the person merging it read it); such a record's finish time is its file's."""
    runs, necessity = {}, {}

    def read(path: Path) -> RunRecord:
        record = _decode(path, RunRecord)
        if record.vllm is None:
            raise RecordError(f"{path}: the run had no vLLM installed")
        if record.commit is None or record.finished is None:
            if legacy_commit is None:
                raise RecordError(f"{path}: records no commit (written outside a git checkout, or before "
                                  "tests/release_record.py recorded it; --legacy-commit names it)")
            finished = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            record = msgspec.structs.replace(record, commit=record.commit or legacy_commit,
                                             finished=record.finished or finished)
        if not SHA.fullmatch(record.commit or ""):
            raise RecordError(f"{path}: commit {record.commit!r} is not a full sha")
        return record

    for path in sorted(results.glob("vllm-*.json")):
        record = read(path)
        if not record.excluded:
            runs[record.vllm] = record
    for path in sorted((results / "necessity").glob("vllm-*.json")):
        record = read(path)
        if len(record.excluded) == 1:
            necessity[(record.excluded[0], record.vllm)] = record
    return Fresh(runs, necessity)


# -- cells ---------------------------------------------------------------------------------------------------


def _count(run: RunRecord | None, prefix: str) -> tuple[int, int, int]:
    outcomes = [o for nodeid, o in (run.tests if run else {}).items() if nodeid.startswith(prefix)]
    return outcomes.count(TestOutcome.PASSED), outcomes.count(TestOutcome.FAILED), outcomes.count(TestOutcome.SKIPPED)


def _covers(arg: str, prefix: str) -> bool:
    """Whether a path or node id the run was given selects every test under `prefix`."""
    path, sep, _ = arg.partition("::")
    if sep:
        return prefix.startswith(arg)
    file = prefix.split("::", 1)[0]
    return path in ("", ".") or file == path or file.startswith(path.rstrip("/") + "/")


def complete(run: RunRecord, prefix: str) -> bool:
    """Whether the run ran every test under `prefix` it would have run unasked."""
    if run.stopped_early or any(nodeid.startswith(prefix) for nodeid in run.deselected):
        return False
    return not run.selection or any(_covers(arg, prefix) for arg in run.selection)


def outcome(passed: int, failed: int) -> str:
    return "FAILED" if failed else "behaviour-tested" if passed else "anchors only"


def fresh_cell(run: RunRecord, prefix: str, *, necessity: bool = False) -> tuple[CellRecord, bool] | None:
    """The run's cell for the tests under `prefix` and whether it may replace a recorded one; None: not run."""
    passed, failed, skipped = _count(run, prefix)
    if not passed + failed + skipped:
        return None
    state = outcome(passed, failed)
    if necessity:
        state = "fails without it" if failed else "passes without it" if passed else "anchors only"
    assert run.commit is not None and run.finished is not None  # load_results refuses records without them
    cell = CellRecord(state, passed, failed, skipped, run.commit, run.finished, run.torch, run.transformers)
    return cell, failed > 0 or complete(run, prefix)


def _merge_cell(cells: dict[str, CellRecord], cell_id: str, fresh: tuple[CellRecord, bool] | None) -> None:
    if fresh is None:
        return  # not run: the recorded result stands
    cell, replaces = fresh
    recorded = cells.get(cell_id)
    if recorded is not None and (not replaces or cell.finished < recorded.finished):
        return  # a narrowed run's pass, or an older run than the recorded one
    cells[cell_id] = cell


def merge(records: Records, fresh: Fresh) -> Records:
    """The committed records with the run's cells merged in (newest wins; partial runs only add failures)."""
    patches = [p.id for p in series()]
    runs = {r: dict(cells) for r, cells in records.runs.items()}
    necessity = {r: dict(cells) for r, cells in records.necessity.items()}
    for release, run in fresh.runs.items():
        cells = runs.setdefault(release, {})
        for patch_id in patches:
            _merge_cell(cells, patch_id, fresh_cell(run, patch_tests(patch_id)))
        for check_id, (prefix, _) in CHECKS.items():
            _merge_cell(cells, check_id, fresh_cell(run, prefix))
    for (patch_id, release), run in fresh.necessity.items():
        if patch_id in patches:
            _merge_cell(necessity.setdefault(release, {}), patch_id,
                        fresh_cell(run, patch_tests(patch_id), necessity=True))
    return Records({r: c for r, c in runs.items() if c}, {r: c for r, c in necessity.items() if c})


def problems(fresh: Fresh, ran: list[str]) -> list[str]:
    """Every release the run ran, inside a patch's range, without a passing behaviour test of it in this run."""
    found = []
    for release in ran:
        run = fresh.runs.get(release)
        for patch in series():
            spec = patch.ranges["vllm"]
            if Version(release) not in spec:
                continue
            if run is None:
                found.append(f"{patch.id} claims vllm{spec} but has no passing behaviour test on {release}: "
                             "no test run recorded")
                continue
            passed, failed, skipped = _count(run, patch_tests(patch.id))
            if failed or not passed:
                found.append(f"{patch.id} claims vllm{spec} but has no passing behaviour test on {release}: "
                             f"{_state_text(outcome(passed, failed), passed, failed, skipped)}")
        for _, (prefix, label) in CHECKS.items():
            passed, failed, skipped = _count(run, prefix)
            if run is None:
                found.append(f"{label} on {release}: no test run recorded")
            elif failed or not passed:
                found.append(f"{label} on {release}: {_state_text(outcome(passed, failed), passed, failed, skipped)}")
    return found


# -- the table -----------------------------------------------------------------------------------------------


def short(commit: str) -> str:
    sha, plus, rest = commit.partition("+")
    return sha[:7] + plus + rest


def _state_text(state: str, passed: int, failed: int, skipped: int, extra: str = "") -> str:
    counts = f"{passed} passed" + (f", {failed} failed" if failed else "") + (f", {skipped} skipped" if skipped else "")
    return f"{state} ({counts}{extra})"


def cell_text(cell: CellRecord | None, in_range: bool, without: CellRecord | None = None) -> str:
    if not in_range:
        return "out of range"
    if cell is None:
        return "no run recorded"
    extra = ""
    if without is not None and without.outcome in ("fails without it", "passes without it"):
        extra = f"; {without.outcome}" + (f" on {short(without.commit)}" if without.commit != cell.commit else "")
    return f"{_state_text(cell.outcome, cell.passed, cell.failed, cell.skipped, extra)} on {short(cell.commit)}"


def render(records: Records) -> str:
    from patchkit import PINNED_VLLM

    columns = releases(records)
    lines = [
        START,
        "<!-- generated by `nox -s what-ran-where` (tests/ran_where.py) from the records in docs/ran-where/; "
        "do not edit -->",
        "",
        "| | " + " | ".join(f"vLLM {r}" for r in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for patch in series():
        texts = [cell_text(records.runs.get(r, {}).get(patch.id), Version(r) in patch.ranges["vllm"],
                           records.necessity.get(r, {}).get(patch.id)) for r in columns]
        lines.append(f"| {patch.id} | " + " | ".join(texts) + " |")
    for check_id, (_, label) in CHECKS.items():
        lines.append(f"| {label} | " + " | ".join(cell_text(records.runs.get(r, {}).get(check_id), True)
                                                 for r in columns) + " |")
    lines.append("")
    for release in columns:
        runs: dict[tuple, list[str]] = {}
        for cell_id, cell in records.runs.get(release, {}).items():
            runs.setdefault((cell.finished, cell.commit, cell.torch, cell.transformers), []).append(cell_id)
        if not runs:
            lines.append(f"- {release}: no run recorded (`nox -s {'tests' if release == PINNED_VLLM else 'release-' + release}`)")
        for (finished, commit, torch, transformers), cells in sorted(runs.items(), key=lambda r: r[0][:2], reverse=True):
            lines.append(f"- {release}: {len(cells)} cells from the run on {short(commit)}, finished "
                         f"{finished.replace('T', ' ').removesuffix('Z')} UTC (torch {torch}, transformers {transformers})")
        without = records.necessity.get(release, {})
        if without:
            commits = ", ".join(sorted({short(c.commit) for c in without.values()}))
            lines.append(f"- {release}: necessity (each patch left out) recorded for {len(without)} patches, on {commits}")
    lines.append(END)
    return "\n".join(lines)


def readme_table(readme: Path) -> str:
    """The table between README's markers, markers included."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise RecordError(f"{readme}: no {START} ... {END} markers to write the table between")
    return START + text.split(START, 1)[1].split(END, 1)[0] + END


def write_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise RecordError(f"{readme}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    readme.write_text(head + table + rest.split(END, 1)[1])


def main(argv: list[str]) -> int:
    from patchkit import SUPPORTED_VLLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="a test run's records to merge into the committed ones")
    parser.add_argument("--records", type=Path, default=RECORDS, help="the committed records (docs/ran-where)")
    parser.add_argument("--readme", type=Path, help="write the table between the README's markers")
    parser.add_argument("--releases", nargs="+", default=list(SUPPORTED_VLLM),
                        help="the releases the run covered, each checked (with --results)")
    parser.add_argument("--legacy-commit", help="the commit of a run whose records predate the commit field")
    args = parser.parse_args(argv)
    if args.legacy_commit is not None and not SHA.fullmatch(args.legacy_commit):
        parser.error(f"--legacy-commit {args.legacy_commit!r}: give the full 40-digit sha (+dirty if it was)")
    try:
        records = load_records(args.records)
        found: list[str] = []
        if args.results is not None:
            fresh = load_results(args.results, legacy_commit=args.legacy_commit)
            records = merge(records, fresh)
            write_records(records, args.records)
            found = problems(fresh, args.releases)
        table = render(records)
        if args.readme:
            write_readme(args.readme, table)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    if os.environ.get("GITHUB_STEP_SUMMARY"):  # the daily workflow shows the table as the job summary
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as summary:
            summary.write(table + "\n")
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
