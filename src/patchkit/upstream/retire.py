"""Retirement by measurement: which patches a release no longer needs, each proposal with its evidence.

A patch is proposed for dropping on a release when
- its `[upstreamed]` probe fires in that release's unpatched sources (the file and line named), or
- the release's `patch-necessity` record (`nox -s patch-necessity`: its behaviour tests run with the patch
  left out of the series, PATCHKIT_TEST_EXCLUDE) shows those tests passing without it.

An assert-only patch (every edit an `assert`) changes nothing, so "its tests pass without it" cannot tell
whether it is needed: its necessity record fails only through the series check that reads the very
variable the necessity run sets (tests/probes.py, guard_in_series). Its necessity is its drift test
instead (`test_an_upstream_*` in its test module, tests/probes.py plan_on_drifted_upstream): the patch,
planned on the release's own files with the guarded text changed as an upstream regression would change
it, must fail `patchkit check` loudly. While that test passes on the release the assert is the only thing
that would catch the drift, so it is kept; only its probe proposes it for dropping.

The records are the test runs' own (tests/release_record.py): `<results>/vllm-<release>.json` and
`<results>/necessity/vllm-<release>-<patch>.json`, read bounded and shape-checked (exit 2 otherwise).

A release outside a patch's `vllm` range (a new release the patch was not yet rebased onto) is measured
all the same, and the verdict is what retire would propose there (`Verdict.in_range` False): its probe
and its records first, as inside the range; where they say nothing, the patch is planned on the release
as if its range held it (the rest of the series with it, as an image applies it). Every anchor there as
written (every assert holding) is "keep": the code it changes is unchanged on that release and its
probe does not fire (whether its text still works there is for its behaviour tests); an anchor gone is
"check by hand" (`patchkit rebase` proposes its new place); its applied text already in the unpatched
release is "retire". With nothing to read, "no evidence".

A probe is evidence only when it finds the fix's own code. One that reads a version string (a release
stamp in `_version.py`, a `__version__` or `version_tuple` assignment) fires on every release sharing the
stamp's prefix, fix or no fix: its hit is shown, the rest of the evidence is read without it, and the
verdict is "check by hand", never "retire" (the patch's probe is then to be replaced).
"""

from __future__ import annotations

import re
from dataclasses import replace
from enum import StrEnum
from pathlib import Path, PurePosixPath

import msgspec
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.errors import PatchkitError
from patchkit.jsondata import decode
from patchkit.patching import planner, probes
from patchkit.patching.patchset import Patch
from patchkit.patching.test_files import behaviour_test_prefix
from patchkit.sources.base import Source
from patchkit.untrusted import read_file
from patchkit.upstream.run_record import RunRecord, TestOutcome

DRIFT_TEST = "test_an_upstream_"  # the drift tests' names in tests/patches/test_<id>.py
# A probe must find the fix's own code. One that reads a release stamp (vllm/_version.py, a `__version__` or
# `version_tuple` assignment) fires on every release that shares the stamp's prefix (0.3 is 0.30 and
# 0.34 alike), fix or no fix: its hit is reported, and decides nothing.
VERSION_FILES = ("_version.py", "version.py")
VERSION_TEXT = re.compile(r"(?:^|\W)(?:__version__|__version_tuple__|version_tuple|version)\s*[:=]")


class MisfiledRecord(PatchkitError):
    """The run record at `path` is of vllm `vllm` without `excluded`, but is filed as the record of vllm
    `release` without `expected_excluded`: it is refused, not read as that release's evidence."""

    def __init__(self, path: Path, vllm: str | None, excluded: list[str], release: str, expected_excluded: list[str]):
        self.path, self.vllm, self.excluded, self.release, self.expected_excluded = (
            path, vllm, excluded, release, expected_excluded)
        super().__init__(f"{path}: a record of vllm {vllm} without {excluded or 'nothing'}, "
                         f"filed as vllm {release} without {expected_excluded or 'nothing'}")


class Retirement(StrEnum):
    """What the evidence says of one patch on one release (the value is what --json says)."""

    RETIRE = "retire"                # its probe fires, or its tests pass without it: propose dropping it
    KEEP = "keep"                    # its tests fail without it, its drift test passes, or its code is unchanged
    UNMEASURED = "unmeasured"        # in range, and no record says either
    CHECK_BY_HAND = "check by hand"  # a record or a plan a person must read (a drift test failed, an anchor gone)
    NO_EVIDENCE = "no evidence"      # outside its range, and nothing read there says either


class Kind(StrEnum):
    """What one piece of evidence is."""

    PROBE = "probe"          # its [upstreamed] probe in the release's unpatched sources
    NECESSITY = "necessity"  # its behaviour tests with it left out of the series
    DRIFT = "drift"          # an assert-only patch's drift test
    RANGE = "range"          # the release is outside its range
    ANCHORS = "anchors"      # the patch planned on the release as if its range held it
    VERDICT = "verdict"      # what the rest says, where a version probe fired


# The records below are what `patchkit retire --json` writes and what upstream/bump.py reads back: one
# declaration for both, so a field renamed here is renamed for the reader too (and a record written
# before the rename stops validating, which the recorded runs' tests show).
class Evidence(msgspec.Struct, frozen=True):
    kind: Kind
    text: str
    where: str = ""  # the file the evidence is in


class Verdict(msgspec.Struct):
    patch_id: str = msgspec.field(name="patch")
    verdict: Retirement
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    in_range: bool = True  # False: the release is outside the patch's range, and this is what retire would propose

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


class RetireRecord(msgspec.Struct):
    """`patchkit retire --json`: the release measured, where its test records were looked for, the verdicts."""

    release: str
    results: str
    verdicts: list[Verdict]

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


def assert_only(patch: Patch) -> bool:
    return all(e.action == "assert" for e in patch.edits)


def load_record(path: Path) -> RunRecord | None:
    """A test run's record, or None when there is none."""
    if not path.exists():
        return None
    return decode(read_file(path, "run-record"), RunRecord, f"the test record {path}")


def reads_a_version(patch: Patch) -> bool:
    """Whether the patch's [upstreamed] text probe reads a version string rather than the fix's code (the
    patch loader refuses one on the release stamp file itself; this catches a version assignment elsewhere).
    A release probe (`release = RANGE`) is exact by PEP 440 and is not one."""
    probe = patch.upstreamed
    if probe is None or probe.contains is None:
        return False
    return (any(PurePosixPath(c).name in VERSION_FILES for c in probe.candidates)
            or VERSION_TEXT.search(probe.contains) is not None)


def _stamp(hit: Evidence, release: str) -> Evidence:
    return Evidence(Kind.PROBE, f"{hit.text}, but that is a version string, not the fix's own code: it says nothing of "
                    f"whether {release} carries the fix (the probe is to be replaced by one on the fix's code)",
                    hit.where)


def probe_hit(patch: Patch, source: Source) -> Evidence | None:
    """The patch's [upstreamed] probe in the release's unpatched sources (patching.probes, the one answer of
    check, rebase and retire): the file and line it matched, or the release range it holds."""
    probe = patch.upstreamed
    if probe is None:
        return None
    version = source.versions().get(probe.package)
    if version is None:
        return None

    def read(path: str) -> str | None:
        data = source.read(probe.package, path)
        return None if data is None else data.decode("utf-8", "replace")

    hit = probes.probe_hit(probe, read, version)
    return None if hit is None else Evidence(Kind.PROBE, f"[upstreamed] probe fires: {hit.found}", hit.where)


def _counts(record: RunRecord | None, prefix: str, name: str = "") -> tuple[int, int]:
    outcomes = [o for node, o in (record.tests if record else {}).items() if node.startswith(prefix + name)]
    return outcomes.count(TestOutcome.PASSED), outcomes.count(TestOutcome.FAILED)


def verdict(patch: Patch, release: str, source: Source | None, results: Path | None,
            planned: planner.PatchResult | None = None) -> Verdict:
    """What the measurements say of one patch on one vLLM release. Outside its range, what they would
    propose there; `planned` is the patch's result in the series planned on the release as if its range
    held it (`widened_plan`), read when the probe and the records say nothing."""
    if Version(release) not in patch.ranges["vllm"]:
        return _outside(patch, release, source, results, planned)
    evidence: list[Evidence] = []
    hit = probe_hit(patch, source) if source is not None else None
    if hit and reads_a_version(patch):
        evidence.append(_stamp(hit, release))
        return _by_hand(verdict(replace(patch, upstreamed=None), release, None, results), evidence)
    if hit:
        evidence.append(hit)
    prefix = behaviour_test_prefix(patch.id)
    run_path = results / f"vllm-{release}.json" if results else None
    without_path = results / "necessity" / f"vllm-{release}-{patch.id}.json" if results else None
    run = _checked(load_record(run_path), run_path, release, []) if run_path else None
    without = _checked(load_record(without_path), without_path, release, [patch.id]) if without_path else None
    if assert_only(patch):
        passed, failed = _counts(run, prefix, DRIFT_TEST)
        if failed:
            return Verdict(patch.id, Retirement.CHECK_BY_HAND, evidence + [Evidence(
                Kind.DRIFT, f"its drift test failed on {release}: an upstream change of the guarded text may no "
                "longer fail `patchkit check`", str(run_path))])
        if passed:
            note = Evidence(Kind.DRIFT, f"assert-only: its drift test passes on {release} ({passed} passed): an upstream "
                            "change of the guarded text fails `patchkit check` loudly, which only this patch checks",
                            str(run_path))
            return Verdict(patch.id, Retirement.RETIRE if hit else Retirement.KEEP, evidence + [note])
        return Verdict(patch.id, Retirement.RETIRE if hit else Retirement.UNMEASURED, evidence + [Evidence(
            Kind.DRIFT, f"assert-only: no drift test ({DRIFT_TEST}*) recorded on {release}", str(run_path or ""))])
    passed, failed = _counts(without, prefix)
    if without is None:
        evidence.append(Evidence(Kind.NECESSITY, f"no necessity record for {release} (`nox -s patch-necessity -- "
                                 f"{release} {patch.id}`)", str(without_path or "")))
    elif failed:
        evidence.append(Evidence(Kind.NECESSITY, f"{failed} of its behaviour tests fail on {release} without it",
                                 str(without_path)))
    elif passed:
        evidence.append(Evidence(Kind.NECESSITY, f"its {passed} behaviour test(s) pass on {release} with the patch "
                                 "left out of the series", str(without_path)))
    else:
        evidence.append(Evidence(Kind.NECESSITY, f"the necessity record of {release} ran none of its behaviour tests",
                                 str(without_path)))
    if hit or (passed and not failed):
        return Verdict(patch.id, Retirement.RETIRE, evidence)
    return Verdict(patch.id, Retirement.KEEP if failed else Retirement.UNMEASURED, evidence)


def _checked(record: RunRecord | None, path: Path, release: str, excluded: list[str]) -> RunRecord | None:
    """A record must be of the release and the exclusion its name says: a misfiled one is refused."""
    if record is not None and (record.vllm != release or sorted(record.excluded) != excluded):
        raise MisfiledRecord(path, record.vllm, list(record.excluded), release, excluded)
    return record


def _outside(patch: Patch, release: str, source: Source | None, results: Path | None,
             planned: planner.PatchResult | None) -> Verdict:
    """A release outside the patch's range: the same evidence read, and the planner's answer where it says nothing."""
    def proposal(name: Retirement, found: list[Evidence]) -> Verdict:
        return Verdict(patch.id, name, found, in_range=False)

    evidence = [Evidence(Kind.RANGE, f"vllm {release} is outside its range {patch.ranges['vllm']}: the evidence read "
                         "there all the same, what retire would propose")]
    hit = probe_hit(patch, source) if source is not None else None
    run_path = results / f"vllm-{release}.json" if results else None
    without_path = results / "necessity" / f"vllm-{release}-{patch.id}.json" if results else None
    run = _checked(load_record(run_path), run_path, release, []) if run_path else None
    without = _checked(load_record(without_path), without_path, release, [patch.id]) if without_path else None
    if hit and reads_a_version(patch):
        return _by_hand(_outside(replace(patch, upstreamed=None), release, None, results, planned),
                        [evidence[0], _stamp(hit, release)])
    if hit:
        return proposal(Retirement.RETIRE, evidence + [hit])
    prefix = behaviour_test_prefix(patch.id)
    if assert_only(patch):
        passed, failed = _counts(run, prefix, DRIFT_TEST)
        if failed:
            return proposal(Retirement.CHECK_BY_HAND, evidence + [Evidence(
                Kind.DRIFT, f"its drift test failed on {release}: an upstream change of the guarded text may no "
                "longer fail `patchkit check`", str(run_path))])
        if passed:
            return proposal(Retirement.KEEP, evidence + [Evidence(
                Kind.DRIFT, f"assert-only: its drift test passes on {release} ({passed} passed)", str(run_path))])
    elif without is not None:
        passed, failed = _counts(without, prefix)
        if failed:
            return proposal(Retirement.KEEP, evidence + [Evidence(
                Kind.NECESSITY, f"{failed} of its behaviour tests fail on {release} without it", str(without_path))])
        if passed:
            return proposal(Retirement.RETIRE, evidence + [Evidence(
                Kind.NECESSITY, f"its {passed} behaviour test(s) pass on {release} with the patch left out of the "
                "series", str(without_path))])
    if planned is None:
        return proposal(Retirement.NO_EVIDENCE, evidence + [Evidence(
            Kind.ANCHORS, f"not planned on {release}: no source of it was read" if source is None else
            f"not planned on {release}")])
    name, found = _planned(planned, release)
    return proposal(name, evidence + [found])


def _by_hand(found: Verdict, first: list[Evidence]) -> Verdict:
    """A version probe fired: what the rest of the evidence says, for a person to decide (never a retirement)."""
    rest = [e for e in found.evidence if e not in first and e.kind != Kind.RANGE]
    said = Evidence(Kind.VERDICT, f"without the probe the evidence says: {found.verdict}")
    return Verdict(found.patch_id, Retirement.CHECK_BY_HAND, first + rest + [said], in_range=found.in_range)


def _planned(result: planner.PatchResult, release: str) -> tuple[Retirement, Evidence]:
    """The proposal a plan of the patch on the release (its range widened to it) supports, and its evidence."""
    State, EditState = planner.State, planner.EditState
    where = ", ".join(dict.fromkeys(f"{e.edit.package}/{e.path}" for e in result.edits if e.path))
    edits = ", ".join(f"{e.edit.index} {e.state}" for e in result.edits)
    if result.state == State.NOT_APPLIED or (
            result.state == State.APPLIED and all(e.state == EditState.HOLDS for e in result.edits)):
        return Retirement.KEEP, Evidence(Kind.ANCHORS, f"every anchor is on {release} as written, as many times as each edit "
                                f"expects (edits {edits}): the code it changes is unchanged there and its probe does "
                                "not fire; whether its text still works there is for its behaviour tests on "
                                f"{release} (`patchkit rebase --to {release}` widens its range)", where)
    if result.state == State.APPLIED:
        return Retirement.RETIRE, Evidence(Kind.ANCHORS, f"the unpatched {release} already has its applied text (edits {edits}): "
                                  "upstream carries it", where)
    if result.state == State.UPSTREAMED:
        return Retirement.RETIRE, Evidence(Kind.ANCHORS, f"planned on {release}: {result.detail}", where)
    if result.state in planner.ERROR_STATES:
        bad = [e for e in result.edits if e.state in (EditState.BROKEN, EditState.MODIFIED)]
        said = "; ".join(_cut(e.describe()) for e in bad) or _cut(result.detail)
        return Retirement.CHECK_BY_HAND, Evidence(Kind.ANCHORS, f"{result.state} on {release}: {said} (`patchkit rebase --to "
                                         f"{release}` proposes the new place of each edit, or names it for a person)",
                                         where)
    return Retirement.NO_EVIDENCE, Evidence(Kind.ANCHORS, f"planned on {release}: {result.state}"
                                   + (f" ({result.detail})" if result.detail else ""), where)


def _cut(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def widened_plan(patches: list[Patch], release: str, source: Source) -> dict[str, planner.PatchResult]:
    """The series planned on the release, each patch whose `vllm` range excludes it planned as if it held it
    (and without a probe that reads a version string: its edits are what is measured)."""
    wanted = Version(release)
    series = [p if wanted in p.ranges["vllm"] else replace(p, ranges={**p.ranges, "vllm": SpecifierSet(f"=={release}")})
              for p in patches]
    series = [replace(p, upstreamed=None) if reads_a_version(p) else p for p in series]
    return {r.patch.id: r for r in planner.plan(series, source).results}


def verdicts(patches: list[Patch], release: str, source: Source | None, results: Path | None) -> list[Verdict]:
    wanted = Version(release)
    outside = any(wanted not in p.ranges["vllm"] for p in patches)
    planned = widened_plan(patches, release, source) if outside and source is not None else {}
    return [verdict(p, release, source, results, planned.get(p.id)) for p in patches]
