"""`patchkit.json` in a patched wheel's dist-info: the release it came from and the patches it carries.

pip installs the dist-info as it is, so the record lands in site-packages beside vLLM and `patchkit
status` can name the patches of an installed wheel (the text of the files tells their state; this
file tells which series and which patch contents were built in, and from which release wheel). A
requirement of the release's METADATA the build replaced (an unpublished companion pin: requires.py) is
recorded here too, with the line as the release states it and why; a wheel without one has no such key,
so its bytes are what they were before substitution existed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from patchkit.jsondata import MalformedJson, decode
from patchkit.patching.patchset import Patch
from patchkit.untrusted import read_file

MANIFEST = "patchkit.json"
RELEASE_FIELDS = {"filename", "sha256", "version"}


@dataclass(frozen=True)
class CarriedPatch:
    id: str
    digest: str  # the patch's content hash (Patch.digest)
    state: str  # its state on the release: not-applied (applied by the build) or applied (assert-only)
    note: str = ""


@dataclass(frozen=True)
class SubstitutedRequirement:
    """One `Requires-Dist` of the release's METADATA that the patched wheel states otherwise."""

    dist: str  # "flashinfer-python"
    pin: str  # the version the release pins: "0.7.3"
    substitute: str  # the version the patched wheel requires instead: "0.7.2.post1"
    release_requirement: str  # the header's value as the release states it: "flashinfer-python==0.7.3"
    requirement: str  # the value written: "flashinfer-python==0.7.2.post1" (extras and markers kept)
    reason: str  # one line: why this substitute (the companion policy's)


@dataclass(frozen=True)
class WheelManifest:
    version: str  # the patched wheel's version
    series: str  # "full" or the image whose series it is
    series_hash: str
    release: dict[str, str]  # filename, sha256, version of the release wheel
    patches: list[CarriedPatch]
    skipped: list[CarriedPatch] = field(default_factory=list)  # upstreamed, or for a package not in the wheel
    files: list[dict[str, str]] = field(default_factory=list)  # path, release sha256, patched sha256
    substituted: list[SubstitutedRequirement] = field(default_factory=list)  # requirements stated otherwise

    def to_bytes(self) -> bytes:
        record = asdict(self)
        if not record["substituted"]:  # absent, not empty: the record of a wheel with none stays as it was
            del record["substituted"]
        return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, what: str = MANIFEST) -> WheelManifest:
        """The record in a wheel or a site-packages: outside input, its shape checked (msgspec) before
        `describe` or the index reads a field; MalformedJson (exit 2) with the JSON path otherwise."""
        manifest = decode(data, cls, what)
        absent = sorted(RELEASE_FIELDS - set(manifest.release))
        if absent:
            raise MalformedJson(what, f"release has no {', '.join(absent)}", "$.release")
        return manifest

    def describe(self, known: dict[str, Patch]) -> list[str]:
        """One line for the wheel, one per patch it carries, compared with the patch set at hand."""
        lines = [(f"installed from a patched wheel: vllm {self.version}, series {self.series} "
                  f"({self.series_hash}), built from {self.release['filename']}")]
        for patch in self.patches:
            current = known.get(patch.id)
            if current is None:
                against = "not in this patch set"
            elif current.digest == patch.digest:
                against = "same content as this patch set"
            else:
                against = f"this patch set's {patch.id} has changed since (now {_short(current.digest)})"
            lines.append(f"  carries {patch.id} {_short(patch.digest)}: {against}")
        lines += [f"  left out {p.id}: {p.note}" for p in self.skipped]
        lines += [f"  requires {s.requirement} where the release requires {s.release_requirement}: {s.reason}"
                  for s in self.substituted]
        return lines


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def installed_manifests(site: Path) -> list[tuple[Path, WheelManifest]]:
    """The patched-wheel records in a site-packages (its `*.dist-info/patchkit.json`)."""
    found = []
    for path in sorted(Path(site).glob(f"*.dist-info/{MANIFEST}")):
        found.append((path, WheelManifest.from_bytes(read_file(path, "definition"), f"patched-wheel record {path}")))
    return found


def installed_report(site: Path, known: dict[str, Patch]) -> tuple[list[dict], list[str]]:
    """For `patchkit status`: the records of the patched wheels installed in `site` (JSON), and lines for people."""
    found = installed_manifests(site)
    return ([{"record": str(path)} | asdict(m) for path, m in found],
            [line for _, m in found for line in m.describe(known)])
