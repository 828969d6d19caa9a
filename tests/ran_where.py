"""What ran where: every patch's `vllm` range against the behaviour tests that passed on each release.

Reads the records the test runs wrote (tests/release_record.py; noxfile.py points each release's run at
<results>/vllm-<release>.json and each `patch-necessity` run at <results>/necessity/...). A release
inside a patch's range without a passing behaviour test of that patch is a failure (exit 1), as is a
failed test: "anchors only" is what the older suite gave those cells, and it is not enough.

    python tests/ran_where.py RESULTS_DIR [--readme README.md]   # check, then write the table into README
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
START, END = "<!-- what-ran-where:start -->", "<!-- what-ran-where:end -->"
# Rows besides the patches: variant-level checks that run on every release (test file prefix -> label).
CHECKS = {
    "tests/test_smoke_cpu.py::": "CPU load smoke, every variant (stock fails, patched passes)",
    "tests/test_serve.py::test_vllm_parser": "vLLM serve parser, every variant's command",
}


@dataclass(frozen=True)
class Cell:
    state: str  # behaviour-tested | anchors only | out of range | FAILED | not in this run
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    necessity: bool = False  # the patch's tests failed with the patch left out, on this release

    def text(self) -> str:
        if self.state in ("out of range", "anchors only"):
            return self.state
        if self.state == "not in this run":
            return "not in this run (`nox -s tests-releases`)"
        counts = f"{self.passed} passed" + (f", {self.failed} failed" if self.failed else "")
        counts += f", {self.skipped} skipped" if self.skipped else ""
        return f"{self.state} ({counts}{'; fails without it' if self.necessity else ''})"


def patch_tests(patch_id: str) -> str:
    return f"tests/patches/test_{patch_id.replace('-', '_')}.py::"


def load_records(results: Path) -> tuple[dict[str, dict], dict[tuple[str, str], dict]]:
    """Release -> its run's record; (patch, release) -> the record of the run without that patch."""
    runs, necessity = {}, {}
    for path in sorted(results.glob("vllm-*.json")):
        record = json.loads(path.read_text())
        if not record["excluded"]:
            runs[record["vllm"]] = record
    for path in sorted((results / "necessity").glob("vllm-*.json")):
        record = json.loads(path.read_text())
        if len(record["excluded"]) == 1:
            necessity[(record["excluded"][0], record["vllm"])] = record
    return runs, necessity


def _count(record: dict | None, prefix: str) -> tuple[int, int, int]:
    outcomes = [o for nodeid, o in (record or {}).get("tests", {}).items() if nodeid.startswith(prefix)]
    return outcomes.count("passed"), outcomes.count("failed"), outcomes.count("skipped")


def cell(prefix: str, in_range: bool, record: dict | None, without: dict | None = None) -> Cell:
    if not in_range:
        return Cell("out of range")
    passed, failed, skipped = _count(record, prefix)
    if failed:
        return Cell("FAILED", passed, failed, skipped)
    if not passed:
        return Cell("anchors only", passed, failed, skipped)
    return Cell("behaviour-tested", passed, failed, skipped, necessity=_count(without, prefix)[1] > 0)


def matrix(results: Path, ran=RELEASES) -> tuple[dict[str, dict[str, Cell]], dict[str, dict], list[str]]:
    """Row label -> release -> Cell, the runs, and every problem (a cell in range not behaviour-tested).

    `ran`: the releases this run covered (`nox -s tests`: the pinned one and the default base's layout);
    the others' cells read "not in this run" and are not checked."""
    from patchkit.patching.patchset import load_patchset

    runs, necessity = load_records(results)
    rows: dict[str, dict[str, Cell]] = {}
    problems = []
    for patch in load_patchset(REPO / "patches").series():
        spec = patch.ranges["vllm"]
        row = rows[patch.id] = {}
        for release in RELEASES:
            if release not in ran:
                row[release] = Cell("not in this run")
                continue
            row[release] = cell(patch_tests(patch.id), Version(release) in spec, runs.get(release),
                                necessity.get((patch.id, release)))
            if row[release].state in ("FAILED", "anchors only"):
                why = "no test run recorded" if release not in runs else row[release].text()
                problems.append(f"{patch.id} claims vllm{spec} but has no passing behaviour test on {release}: {why}")
    for prefix, label in CHECKS.items():
        row = rows[label] = {}
        for release in RELEASES:
            if release not in ran:
                row[release] = Cell("not in this run")
                continue
            row[release] = cell(prefix, True, runs.get(release))
            if row[release].state != "behaviour-tested":
                problems.append(f"{label} on {release}: {row[release].text()}")
    return rows, runs, problems


def render(rows: dict[str, dict[str, Cell]], runs: dict[str, dict], releases=RELEASES) -> str:
    lines = [
        START,
        "<!-- generated by `nox -s what-ran-where` (tests/ran_where.py) from the last test run; do not edit -->",
        "",
        "| | " + " | ".join(f"vLLM {r}" for r in releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for label, row in rows.items():
        lines.append(f"| {label} | " + " | ".join(row[r].text() for r in releases) + " |")
    lines.append("")
    for release in releases:
        run = runs.get(release)
        if run:
            lines.append(f"- {release}: torch {run['torch']}, transformers {run['transformers']}, "
                         f"{list(run['tests'].values()).count('passed')} tests passed")
        else:
            lines.append(f"- {release}: no run recorded")
    lines.append(END)
    return "\n".join(lines)


def write_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    readme.write_text(head + table + rest.split(END, 1)[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--readme", type=Path, help="write the table between the README's markers")
    parser.add_argument("--releases", nargs="+", default=list(RELEASES), help="the releases this run covered")
    args = parser.parse_args(argv)
    rows, runs, problems = matrix(args.results, tuple(args.releases))
    table = render(rows, runs)
    print(table)
    if args.readme:
        write_readme(args.readme, table)
    if os.environ.get("GITHUB_STEP_SUMMARY"):  # the daily workflow shows the table as the job summary
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as summary:
            summary.write(table + "\n")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
