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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from packaging.version import Version

from patchkit.errors import PatchkitError
from patchkit.jsondata import decode
from patchkit.patching.patchset import Patch
from patchkit.sources.base import Source
from patchkit.untrusted import read_file

DRIFT_TEST = "test_an_upstream_"  # the drift tests' names in tests/patches/test_<id>.py


class RunRecord(msgspec.Struct):
    """The fields of a test run's record (tests/release_record.py) this reads."""

    vllm: str | None
    excluded: list[str]
    exitstatus: int
    tests: dict[str, str]  # node id -> passed | failed | skipped


@dataclass(frozen=True)
class Evidence:
    kind: str  # probe | necessity | drift | range
    text: str
    where: str = ""  # the file the evidence is in


@dataclass
class Verdict:
    patch_id: str
    verdict: str  # retire | keep | unmeasured | out of range | check by hand
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"patch": self.patch_id, "verdict": self.verdict,
                "evidence": [{"kind": e.kind, "text": e.text, "where": e.where} for e in self.evidence]}


def test_prefix(patch_id: str) -> str:
    return f"tests/patches/test_{patch_id.replace('-', '_')}.py::"


def assert_only(patch: Patch) -> bool:
    return all(e.action == "assert" for e in patch.edits)


def load_record(path: Path) -> RunRecord | None:
    """A test run's record, or None when there is none."""
    if not path.exists():
        return None
    return decode(read_file(path, "run-record"), RunRecord, f"the test record {path}")


def probe_hit(patch: Patch, source: Source) -> Evidence | None:
    """The patch's [upstreamed] probe in the release's unpatched sources: the file and line it matched."""
    probe = patch.upstreamed
    if probe is None or probe.package not in source.versions():
        return None
    for candidate in probe.candidates:
        data = source.read(probe.package, candidate)
        text = None if data is None else data.decode("utf-8", "replace")
        if text is not None and probe.contains in text:
            line = text[: text.index(probe.contains)].count("\n") + 1
            shown = probe.contains.strip().splitlines()[0]
            return Evidence("probe", f"[upstreamed] probe fires: {shown!r} at line {line}",
                            f"{probe.package}/{candidate}")
    return None


def _counts(record: RunRecord | None, prefix: str, name: str = "") -> tuple[int, int]:
    outcomes = [o for node, o in (record.tests if record else {}).items() if node.startswith(prefix + name)]
    return outcomes.count("passed"), outcomes.count("failed")


def verdict(patch: Patch, release: str, source: Source | None, results: Path | None) -> Verdict:
    """What the measurements say of one patch on one vLLM release."""
    if Version(release) not in patch.ranges["vllm"]:
        return Verdict(patch.id, "out of range", [Evidence("range", f"vllm {release} is outside {patch.ranges['vllm']}")])
    evidence: list[Evidence] = []
    hit = probe_hit(patch, source) if source is not None else None
    if hit:
        evidence.append(hit)
    prefix = test_prefix(patch.id)
    run_path = results / f"vllm-{release}.json" if results else None
    without_path = results / "necessity" / f"vllm-{release}-{patch.id}.json" if results else None
    run = _checked(load_record(run_path), run_path, release, []) if run_path else None
    without = _checked(load_record(without_path), without_path, release, [patch.id]) if without_path else None
    if assert_only(patch):
        passed, failed = _counts(run, prefix, DRIFT_TEST)
        if failed:
            return Verdict(patch.id, "check by hand", evidence + [Evidence(
                "drift", f"its drift test failed on {release}: an upstream change of the guarded text may no "
                "longer fail `patchkit check`", str(run_path))])
        if passed:
            note = Evidence("drift", f"assert-only: its drift test passes on {release} ({passed} passed): an upstream "
                            "change of the guarded text fails `patchkit check` loudly, which only this patch checks",
                            str(run_path))
            return Verdict(patch.id, "retire" if hit else "keep", evidence + [note])
        return Verdict(patch.id, "retire" if hit else "unmeasured", evidence + [Evidence(
            "drift", f"assert-only: no drift test ({DRIFT_TEST}*) recorded on {release}", str(run_path or ""))])
    passed, failed = _counts(without, prefix)
    if without is None:
        evidence.append(Evidence("necessity", f"no necessity record for {release} (`nox -s patch-necessity -- "
                                 f"{release} {patch.id}`)", str(without_path or "")))
    elif failed:
        evidence.append(Evidence("necessity", f"{failed} of its behaviour tests fail on {release} without it",
                                 str(without_path)))
    elif passed:
        evidence.append(Evidence("necessity", f"its {passed} behaviour test(s) pass on {release} with the patch "
                                 "left out of the series", str(without_path)))
    else:
        evidence.append(Evidence("necessity", f"the necessity record of {release} ran none of its behaviour tests",
                                 str(without_path)))
    if hit or (passed and not failed):
        return Verdict(patch.id, "retire", evidence)
    return Verdict(patch.id, "keep" if failed else "unmeasured", evidence)


def _checked(record: RunRecord | None, path: Path, release: str, excluded: list[str]) -> RunRecord | None:
    """A record must be of the release and the exclusion its name says: a misfiled one is refused."""
    if record is not None and (record.vllm != release or sorted(record.excluded) != excluded):
        raise PatchkitError(f"{path}: a record of vllm {record.vllm} without {record.excluded or 'nothing'}, "
                            f"filed as vllm {release} without {excluded or 'nothing'}")
    return record


def verdicts(patches: list[Patch], release: str, source: Source | None, results: Path | None) -> list[Verdict]:
    return [verdict(p, release, source, results) for p in patches]
