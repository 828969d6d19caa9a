"""A release requirement the patched wheel states otherwise: an exact companion pin the index never published.

vLLM 0.34.0's wheels require `flashinfer-python==0.7.3`, a version never on the package index, so pip
cannot install them as published. The companion policy (sources.companion) picks what verify and check
read the series' FlashInfer edits against (0.7.2.post1); when it gives such a substitute, the patched
wheel requires that instead. Only the `Requires-Dist` headers of METADATA pinning exactly that version of
that project change, and only their version: the name as written, extras and markers stay, and each new
value must parse to the same requirement but for its one `==` specifier. The wheel's `patchkit.json`
records each (the value as the release states it, the one written, the reason). When the pin is
published, the index was not asked, or the policy has no substitute, nothing here runs: the wheel keeps
the release's requirement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchkitError
from patchkit.sources.companion import Companion, How
from patchkit.wheels.manifest import SubstitutedRequirement

_REQUIRES = re.compile(rb"^(Requires-Dist[ \t]*:[ \t]*)(.*?)([ \t]*)$", re.IGNORECASE)


class PinNotInMetadata(PatchkitError):
    """No `Requires-Dist` header of `where` (a wheel's METADATA) pins exactly `dist`==`pin`, the pin the
    release was read to require (exit 2): nothing is substituted."""

    def __init__(self, where: str, dist: str, pin: str):
        super().__init__(f"{where}: no Requires-Dist pins {dist}=={pin}, which the release was read to pin")
        self.where, self.dist, self.pin = where, dist, pin


@dataclass(frozen=True)
class Substitution:
    """The patched wheel requires `dist==substitute` where the release pins `dist==pin`, for `reason`."""

    dist: str
    pin: str
    substitute: str
    reason: str


def substitution_for(companion: Companion | None) -> Substitution | None:
    """The policy's substitute for an unpublished pin, or None (published, unavailable, not a version)."""
    if companion is None or companion.how != How.SUBSTITUTE or companion.checked is None or companion.pin is None:
        return None
    pin = Version(companion.pin)
    reason = (f"{companion.unpublished}; {companion.checked} is the newest final {pin.major}.{pin.minor} release "
              f"below the pin, the substitute patchkit's companion policy (patchkit.sources.companion) checks the "
              f"release's {companion.package} against")
    return Substitution(companion.dist, companion.pin, companion.checked, reason)


def substitute_requirement(metadata: bytes, substitution: Substitution,
                           where: str) -> tuple[bytes, list[SubstitutedRequirement]]:
    """`metadata` (core metadata: headers, a blank line, the description) with every `Requires-Dist` that pins
    exactly `dist==pin` requiring `dist==substitute` instead, and a record of each; PinNotInMetadata when no
    header pins it (the pin was read from these very bytes), PatchkitError when a rewritten one would mean
    anything else (the rewrite's own check: packaging's parser and this module's pattern disagreeing)."""
    head, sep, body = metadata.partition(b"\n\n")  # the description is never read as headers
    lines = head.split(b"\n")
    done: list[SubstitutedRequirement] = []
    for number, line in enumerate(lines):
        match = _REQUIRES.match(line)
        if match is None:
            continue
        value = match.group(2).decode("utf-8", "replace")
        new_value = _rewritten(value, substitution)
        if new_value is None:
            continue
        lines[number] = match.group(1) + new_value.encode() + match.group(3)
        done.append(SubstitutedRequirement(substitution.dist, substitution.pin, substitution.substitute, value,
                                           new_value, substitution.reason))
    if not done:
        raise PinNotInMetadata(where, substitution.dist, substitution.pin)
    return b"\n".join(lines) + sep + body, done


def _rewritten(value: str, substitution: Substitution) -> str | None:
    """The header value requiring the substitute, if `value` pins exactly the release's pin; else None."""
    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return None  # not a requirement pip reads (pins.pinned_in_metadata skips it alike)
    specifiers = list(requirement.specifier)
    if (canonicalize_name(requirement.name) != canonicalize_name(substitution.dist) or len(specifiers) != 1
            or specifiers[0].operator != "==" or not _same(specifiers[0].version, substitution.pin)):
        return None
    spec, semicolon, marker = value.partition(";")
    written = specifiers[0].version
    new_spec, count = re.subn(r"==(\s*)" + re.escape(written) + r"(?![\w.+!-])",
                              lambda m: "==" + m.group(1) + substitution.substitute, spec)
    new_value = new_spec + semicolon + marker
    try:
        new = Requirement(new_value)
    except InvalidRequirement:
        new = None
    if (count != 1 or new is None or new.name != requirement.name or new.extras != requirement.extras
            or str(new.marker) != str(requirement.marker) or new.url != requirement.url
            or new.specifier != SpecifierSet(f"=={substitution.substitute}")):
        raise PatchkitError(f"Requires-Dist {value!r:.200}: cannot state {substitution.dist}=="
                            f"{substitution.substitute} in it and keep the rest as it is (a patchkit bug: please "
                            "report it; packaging and the rewrite read the header differently)")
    return new_value


def _same(written: str, pin: str) -> bool:
    try:
        return Version(written) == Version(pin)
    except InvalidVersion:
        return written == pin
