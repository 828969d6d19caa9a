"""The companion a vLLM release is checked with (FlashInfer today), when the release pins one the index
never published: one policy, here, for `verify` (the matrix and `census --compile`), `check`/`diff`
and `wheel build`. (`build` patches the FlashInfer its base image carries, so it asks no index and needs
no policy.)

The policy, in order:
- a source of the companion given by a person (`verify --with`, `check --source flashinfer-python==X`)
  is what is checked: the policy is not asked (EXPLICIT);
- the pinned version, when the index lists it (or the cache holds it, verified when it was fetched: no
  network) (PINNED);
- else the newest final release of the pin's own major.minor that is not newer than the pin, when the
  index has one (SUBSTITUTE: vLLM 0.34.0 pins flashinfer-python 0.7.3, never published; 0.7.2.post1);
- else nothing: the release's companion is a finding without a substitute and nothing of the companion's
  package is checked there (UNAVAILABLE); never an error, so the other releases' cells still show.

Why this one. A vLLM release is written against the companion's API as of its pin. A release of the same
minor at or below the pin is code the pinned one was built from, in the series vLLM pinned throughout
(0.33.0 pinned 0.7.2.post1, 0.34.0 moved to 0.7.3): what the pin added that it lacks shows as a broken
anchor on the patch that needs it, never as a check that passed on code vLLM was not written against. A
newer release (0.7.4) holds changes made after vLLM chose its pin, and another minor is another API. For
0.34.0 this is also the one whose API was read against the release (every FlashInfer name 0.34.0 newly
imports is in 0.7.2.post1; its sparse SM120 decode call matches 0.7.2.post1's signature; 0.7.4 was not
read: shared/reference/vllm-0.34.md). Pre-releases and dev releases never stand in (vLLM pins finals;
an rc is not what anyone installs for it), nor does a version only yanked files carry; the pin itself
counts as published even when yanked, as pip installs a yanked file for an exact pin (PEP 592).

The index's answer is untrusted: `index.project_files` reads the page within the `index-page` limit
and keeps only parseable versions of that very project; the version chosen is then opened like any
release (its archive checked against the index's sha256, its own metadata against the version asked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import msgspec
from packaging.version import InvalidVersion, Version

from patchkit.sources.base import DISTRIBUTIONS, Source
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.pins import pinned_flashinfer

PACKAGE = "flashinfer"  # the companion's import package (its edits' `package`)
DIST = DISTRIBUTIONS[PACKAGE]


class How(StrEnum):
    PINNED = "pinned"            # the pin itself is checked
    SUBSTITUTE = "substitute"    # the pin is unpublished: a release of its minor below it is checked instead
    UNAVAILABLE = "unavailable"  # nothing to check: see Companion.problem
    EXPLICIT = "explicit"        # a person gave the companion's source: the policy was not asked


@dataclass(frozen=True)
class Companion:
    """What a release's companion resolved to: `pin` as the release states it (None when it pins none, with
    an explicit source), `checked` the version checked beside the release (None: nothing of `package`),
    `neighbours` the index's nearest releases below and above an unpublished pin, and for UNAVAILABLE the
    `problem`: "no-release-of-its-minor", "not-on-index" (the index has no such project), "not-a-version"."""

    pin: str | None
    checked: str | None
    how: How
    neighbours: tuple[str, ...] = ()
    problem: str | None = None
    dist: str = DIST
    package: str = PACKAGE

    @property
    def unpublished(self) -> str:
        """"flashinfer-python 0.7.3 unpublished (index has 0.7.2.post1, 0.7.4)"."""
        return f"{self.dist} {self.pin} unpublished (index has {', '.join(self.neighbours) or 'no release'})"

    @property
    def finding(self) -> str | None:
        """The line a report shows for the release; None when the pin itself was checked."""
        if self.how == How.PINNED:
            return None
        if self.how == How.EXPLICIT:
            if self.pin is None or self.checked is None or _same(self.checked, self.pin):
                return None
            return f"{self.dist} {self.checked} checked as given, not the {self.pin} the release pins"
        if self.how == How.SUBSTITUTE:
            return f"{self.unpublished}: checked {self.checked} instead"
        nothing = f"nothing of {self.package} checked"
        if self.problem == "not-a-version":
            return f"{self.dist} pin {self.pin!r} is not one version: {nothing}"
        if self.problem == "not-on-index":
            return f"{self.dist} {self.pin} pinned, and the index lists no {self.dist} at all: {nothing}"
        minor = _version(self.pin)
        return (f"{self.unpublished}: no {minor.major}.{minor.minor} release at or below it to check instead, "
                f"{nothing}" if minor else f"{self.unpublished}: {nothing}")

    def record(self) -> CompanionRecord:
        return CompanionRecord(dist=self.dist, pin=self.pin, checked=self.checked, how=self.how,
                               neighbours=list(self.neighbours), problem=self.problem, finding=self.finding)

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self.record())


class CompanionRecord(msgspec.Struct, kw_only=True):
    """A companion in a JSON record (the matrix's columns, the JIT census), declared once for who writes and
    who reads it (upstream/bump_records.py)."""

    dist: str
    pin: str | None
    checked: str | None
    how: How
    neighbours: list[str]
    problem: str | None
    finding: str | None


def choose(pin: str, published: Iterable[Version]) -> Companion:
    """The policy on the index's answer: `published` are the versions it lists with a file patchkit reads
    (not yanked, but the pin's own yanked files count: pip installs those for an exact pin)."""
    wanted = _version(pin)
    shown = pin if len(pin) <= 40 else pin[:40] + "..."  # the release's text, untrusted: never whole
    if wanted is None:
        return Companion(shown, None, How.UNAVAILABLE, problem="not-a-version")
    listed = set(published)
    if wanted in listed:
        return Companion(pin, pin, How.PINNED)
    finals = sorted(v for v in listed if not v.is_prerelease and v.local is None)
    below = [v for v in finals if v < wanted]
    above = [v for v in finals if v > wanted]
    neighbours = tuple(str(v) for v in (below[-1:] + above[:1]))
    same_minor = [v for v in below if (v.epoch, v.major, v.minor) == (wanted.epoch, wanted.major, wanted.minor)]
    if same_minor:
        return Companion(pin, str(same_minor[-1]), How.SUBSTITUTE, neighbours)
    return Companion(pin, None, How.UNAVAILABLE, neighbours, problem="no-release-of-its-minor")


def resolve_pin(pin: str, *, cache: ArchiveCache | None = None) -> Companion:
    """The companion for a release pinning `DIST==pin`: the cache first (an archive verified before is
    published, no network), else the index's project page. Nothing is downloaded here (`open_companion`)."""
    wanted = _version(pin)
    if wanted is None:
        return choose(pin, ())
    if (cache or ArchiveCache()).lookup(DIST, pin) is not None:
        return Companion(pin, pin, How.PINNED)
    from patchkit.sources.index import NotOnIndex, project_files

    try:
        _, files = project_files(DIST)
    except NotOnIndex:  # the project page is a 404
        return Companion(pin, None, How.UNAVAILABLE, problem="not-on-index")
    return choose(pin, {f.version for f in files if not f.yanked or f.version == wanted})


def companion_of(release: Source, *, cache: ArchiveCache | None = None) -> Companion | None:
    """The companion of the vLLM release behind `release`; None when it pins none (or cannot tell)."""
    pin = pinned_flashinfer(release)
    return resolve_pin(pin, cache=cache) if pin else None


def explicit(release: Source, given: Iterable[Source]) -> Companion | None:
    """The companion a person gave among `given` (None when none of them holds `PACKAGE`), beside the pin."""
    version = next((v for s in given if (v := s.versions().get(PACKAGE)) is not None), None)
    if version is None:
        return None
    return Companion(pinned_flashinfer(release), version, How.EXPLICIT)


def open_companion(companion: Companion, *, cache: ArchiveCache | None = None, progress: bool = False) -> Source | None:
    """The source of the version `companion` checks (downloaded once, verified), or None when it checks none."""
    if companion.checked is None or companion.how == How.EXPLICIT:
        return None
    from patchkit.sources.spec import open_source

    return open_source(f"{companion.dist}=={companion.checked}", cache=cache, progress=progress)


def _same(a: str, b: str) -> bool:
    va, vb = _version(a), _version(b)
    return va == vb if va is not None and vb is not None else a == b


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def with_companion(sources: list[Source], *, cache: ArchiveCache | None = None,
                   progress: bool = True) -> tuple[list[Source], Companion | None]:
    """`sources` as a person gave them (`check --source ...`) and, when one is a vLLM release and none holds
    the companion's package, the companion the policy checks (opened and added). A companion among them
    is explicit: nothing is added."""
    release = next((s for s in sources if "vllm" in s.versions()), None)
    if release is None:
        return sources, None
    given = explicit(release, sources)
    if given is not None:
        return sources, given
    companion = companion_of(release, cache=cache)
    opened = open_companion(companion, cache=cache, progress=progress) if companion else None
    return ([*sources, opened] if opened is not None else sources), companion
