"""The `[upstreamed]` probe: does this unpatched source carry the fix? One answer for check, rebase and retire.

A probe is one of two kinds, and neither matches a prefix of something longer:
- `contains`: text found in one of the probe's files as a whole: where it begins or ends with a letter,
  digit or underscore, the character beside the match must not be one (`version_tuple = (0, 3` is not
  found in `version_tuple = (0, 34, 0)`, nor `FOO` in `FOO_BAR`). A text probe on the release stamp
  file itself (`_version.py`) is refused when the patch loads (patchset.py): it reads a version, not
  the fix, and any text of it fires on every release that shares it.
- `release`: the source's own release (its stamp, `Source.versions()`, never the version a caller assumes
  for a dev build) inside a PEP 440 range: exact, for a fix that lives where no source patchkit reads can
  show it (compiled kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from patchkit.patching.patchset import Probe


@dataclass(frozen=True)
class ProbeHit:
    """Where a probe fired: `path` the file (None for a release probe), `line` its 1-based line (0: none)."""

    package: str
    path: str | None
    line: int
    what: str  # the text found, or the release and the range

    @property
    def where(self) -> str:
        """The file it fired in ("" for a release probe)."""
        return f"{self.package}/{self.path}" if self.path else ""

    @property
    def found(self) -> str:
        """What fired, and where in its file: "'text' at line N", or the release and the range."""
        return f"{self.what!r} at line {self.line}" if self.path else self.what

    def describe(self) -> str:
        where = f"{self.where}: " if self.path else ""
        return f"[upstreamed] probe fires: {where}{self.found}"


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def find_whole(text: str, needle: str) -> int:
    """The offset of the first occurrence of `needle` that cuts no word or number at either end, or -1."""
    start = 0
    while (pos := text.find(needle, start)) != -1:
        end = pos + len(needle)
        cut_before = _word(needle[0]) and pos > 0 and _word(text[pos - 1])
        cut_after = _word(needle[-1]) and end < len(text) and _word(text[end])
        if not (cut_before or cut_after):
            return pos
        start = pos + 1
    return -1


def probe_hit(probe: Probe, read: Callable[[str], str | None], version: str | None) -> ProbeHit | None:
    """The probe against one unpatched source: `read(path)` the text of the probe's package's file (None
    when absent; errors are the caller's), `version` the source's own release of that package (None:
    the package is not in the source)."""
    if probe.release is not None:
        if version is None:
            return None
        try:
            inside = probe.release.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return None
        if not inside:
            return None
        return ProbeHit(probe.package, None, 0, f"the release {probe.package} {version} is in {probe.release} "
                        "(the source's own version)")
    assert probe.contains is not None
    for candidate in probe.candidates:
        text = read(candidate)
        if text is None:
            continue
        pos = find_whole(text, probe.contains)
        if pos != -1:
            shown = probe.contains.strip().splitlines()[0] if probe.contains.strip() else probe.contains
            return ProbeHit(probe.package, candidate, text.count("\n", 0, pos) + 1, shown)
    return None
